"""Chat templates for the tiny checkpoints, written to render exactly what the real models'
templates render (vf_mm's own Jinja; the behaviour was read from the public templates).

Qwen2-VL and Qwen2.5-VL share one format:

- a default system turn (``You are a helpful assistant.``) when the first message is
  not a system message;
- every message, whatever its role (``tool`` included), as ``<|im_start|>{role}\\n``,
  its content, ``<|im_end|>\\n``; string content verbatim; list content part by part:
  images as ``<|vision_start|><|image_pad|><|vision_end|>`` (with ``Picture N: `` before
  it when ``add_vision_id`` is set), videos likewise, text verbatim; assistant
  ``tool_calls`` are not rendered (the model writes its calls into its content);
- ``<|im_start|>assistant\\n`` as the generation prompt.

Qwen3-VL (the default, ``"reasoning"``) follows Qwen3 (a rendition checked against no
published Qwen3-VL file; ``"instruct"`` is Qwen3-VL-*-Instruct's published template: the
system text and tools as below, every assistant content verbatim, no reasoning handling,
no system message but the first, no empty think block):

- no default system turn; with ``tools``, a system turn that lists them as JSON in
  ``<tools></tools>`` and explains the ``<tool_call>`` format;
- assistant messages: reasoning (``reasoning_content``, or what precedes ``</think>`` in
  the content) is kept only for turns after the last real user query, so earlier turns
  lose their ``<think>`` block when a new query arrives; ``tool_calls`` are rendered as
  ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``;
- ``tool`` messages become ``<tool_response>`` blocks inside one user turn per run of
  consecutive tool messages;
- ``<|im_start|>assistant\\n`` as the generation prompt (plus an empty think block when
  ``enable_thinking`` is false).

Gemma 3 (``google/gemma-3-*-it``):

- ``<bos>`` first; a system message is not a turn: its text (string content, or the
  first part's text) plus ``\\n\\n`` opens the first user turn (its images are dropped);
- roles must alternate user / assistant from there (the template raises otherwise, so
  a ``tool`` message after an assistant turn is an error: Gemma 3 has no tool role);
- each turn is ``<start_of_turn>{role}\\n`` (``model`` for the assistant), its content
  trimmed of surrounding whitespace (each text part trimmed), images as
  ``<start_of_image>``, then ``<end_of_turn>\\n``; ``tool_calls`` and
  ``reasoning_content`` are not rendered;
- ``<start_of_turn>model\\n`` as the generation prompt.

SmolVLM (``HuggingFaceTB/SmolVLM2-*-Instruct``):

- ``<|im_start|>`` once, at the very start;
- each message as its role capitalised (``User``, ``Assistant``, ``System``, ``Tool``),
  ``:`` (no space when the content starts with an image, else ``: ``), its parts (text
  verbatim, images as ``<image>``), then ``<end_of_utterance>\\n``;
- content must be a list of parts: a string's text is not rendered (vf_mm's renderer
  turns string content into one text part for this family); ``tool_calls`` and
  ``reasoning_content`` are not rendered;
- ``Assistant:`` as the generation prompt (the model writes the space).

Qwen3.5 (``Qwen/Qwen3.5-0.8B``; and as variants, the larger Qwen3.5 checkpoints',
Qwen3.6's and Qwen3.8's templates, which the same processor renders):

- with ``tools``, a system turn listing them as JSON in ``<tools></tools>`` and
  explaining the XML call format (``<tool_call>\\n<function=NAME>\\n<parameter=P>\\n
  VALUE\\n</parameter>\\n</function>\\n</tool_call>``), then the system message's
  text; without tools, the system message (trimmed) as its own turn;
- a system message must come first and hold no image or video; there must be a user
  query (a user message that is not only tool responses);
- every message's content is trimmed; user turns as ChatML; assistant turns: reasoning
  (``reasoning_content``, or what precedes ``</think>`` in the content) is written
  (``<think>\\n...\\n</think>\\n\\n``, empty when none) only for turns after the last
  user query; ``tool_calls`` as XML, their arguments a mapping (a JSON string is refused,
  as the real template's ``items`` refuses it; the renderer hands it mappings) (string
  values raw, others as JSON);
- runs of ``tool`` messages become ``<tool_response>`` blocks in one user turn;
- ``<|im_start|>assistant\\n`` then ``<think>\\n`` when ``enable_thinking`` is true,
  else an empty think block, as the generation prompt;
- variants: ``think`` (Qwen3.5-4B and larger): thinking unless ``enable_thinking`` is
  false; ``qwen3.6`` (Qwen3.6-27B, 35B-A3B): as ``think``, with ``preserve_thinking``
  (reasoning kept on every turn) and argument values other than strings as JSON
  (``true``, ``null``); ``qwen3.8`` (Qwen3.8-27B): as ``qwen3.6`` with reasoning kept on
  every turn unless ``preserve_thinking`` is false, no reasoning read out of the content,
  and a system line for ``reasoning_effort`` (``xhigh``, the default, or ``low``; none for
  ``medium``) whenever thinking is not switched off.

LLaVA-OneVision (``llava-hf/llava-onevision-qwen2-*-ov-hf``):

- each message as ``<|im_start|>{role} `` (a space, not a newline), then all its images
  as ``<image>`` (whatever their position among the parts), then each text part as
  ``\\n`` + text, then ``<|im_end|>`` (no newline after it);
- content must be a list of parts (a string's text is not rendered);
- ``<|im_start|>assistant\\n`` as the generation prompt, while an assistant turn in the
  history is ``<|im_start|>assistant \\n`` + text: the template is not prefix-stable, so
  every turn is rendered in full (the bridge says so and declines).

Gemma 4 (``google/gemma-4-E2B-it`` / ``E4B-it`` at five Hub revisions, and the 26B / 31B
checkpoints), one template text per variant (``TEMPLATE_VARIANTS``), differing by the
two settings at its top:

- ``<bos>``; a system turn ``<|turn>system\\n...<turn|>\\n`` when thinking is on (it
  opens with ``<|think|>``), tools are given, or the first message is a system or
  developer message (its text trimmed; a list of parts is read as each part's text
  plus a space from 6b7e72c on, and as Python text before it); each tool as
  ``<|tool>declaration:NAME{...}<tool|>`` in Gemma 4's schema dialect (strings between
  ``<|"|>`` quotes, keys sorted and unquoted, types upper-cased; the dialect's details
  changed at b446025 and 6b7e72c);
- each turn ``<|turn>{role}\\n`` ... ``<turn|>\\n`` (``model`` for the assistant), text
  trimmed, a model turn's ``<|channel>...<channel|>`` blocks removed from its content;
  images ``<|image|>`` (``\\n\\n<|image|>\\n\\n`` at the release revision), audio
  ``<|audio|>``, video ``<|video|>``;
- calls as ``<|tool_call>call:NAME{key:value,...}<tool_call|>`` (arguments sorted; from
  8995379 on a string of arguments is refused, before it it is written verbatim);
- release revision (4742fe8): a ``tool`` message is a turn of its own, images included;
  no reasoning is rendered; no generation prompt after Gemma-native ``tool_responses``;
- from b446025 on: ``tool`` messages are the results of the assistant turn before them,
  written into that model turn as ``<|tool_response>response:NAME{value:...}
  <tool_response|>`` (NAME from the matching call), text parts only (b446025, 6b7e72c:
  images, audio and video in a tool message are dropped; from 905e84b on they are
  written after the result); a ``tool`` message after anything else is dropped; the
  model turn stays open after its results (no generation prompt: the model goes on);
  reasoning is rendered as ``<|channel>thought\\n...\\n<channel|>`` only for turns after
  the last user message, and before 8995379 only on turns with tool calls;
- 8995379 (current): ``null`` for None (``None`` before), ``preserve_thinking``, a
  turn that continues into the next assistant message stays open, and after tool
  results with thinking on the generation prompt is ``<|channel>thought\\n``;
- 26B / 31B: as 8995379, with an empty thought block (``<|channel>thought\\n<channel|>``)
  after the generation prompt when thinking is off.
"""

from __future__ import annotations

QWEN2_VL_TEMPLATE = r"""
{%- set seen = namespace(images=0, videos=0) -%}
{%- for message in messages -%}
    {%- if loop.first and message['role'] != 'system' -%}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' -}}
    {%- endif -%}
    {{- '<|im_start|>' + message['role'] + '\n' -}}
    {%- if message['content'] is string -%}
        {{- message['content'] -}}
    {%- else -%}
        {%- for part in message['content'] -%}
            {%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}
                {%- set seen.images = seen.images + 1 -%}
                {%- if add_vision_id -%}{{- 'Picture ' ~ seen.images ~ ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif part['type'] == 'video' or 'video' in part -%}
                {%- set seen.videos = seen.videos + 1 -%}
                {%- if add_vision_id -%}{{- 'Video ' ~ seen.videos ~ ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- elif 'text' in part -%}
                {{- part['text'] -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

# Qwen3-VL-*-Thinking's template: reasoning split out of an assistant's content and
# written back only after the last user query, images wherever they sit (a system
# message's too), and a generation prompt that always opens a thought (no
# ``enable_thinking`` switch); golden-checked against the published text.
QWEN3_VL_TEMPLATE = r"""
{%- set seen = namespace(images=0, videos=0) -%}
{#- a message's parts as the model reads them; ``count`` numbers its images and videos
    (``add_vision_id``). The first system message is written before the others without
    counting and counted with them, and the scan for the last query counts nothing, as
    Qwen3-VL-*-Thinking's own template does. -#}
{%- macro show(content, count) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is not none -%}
        {%- for part in content -%}
            {%- if 'image' in part or 'image_url' in part or part['type'] == 'image' -%}
                {%- if count -%}{%- set seen.images = seen.images + 1 -%}{%- endif -%}
                {%- if add_vision_id -%}{{- 'Picture ' ~ seen.images ~ ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif 'video' in part or part['type'] == 'video' -%}
                {%- if count -%}{%- set seen.videos = seen.videos + 1 -%}{%- endif -%}
                {%- if add_vision_id -%}{{- 'Video ' ~ seen.videos ~ ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- elif 'text' in part -%}
                {{- part['text'] -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0]['role'] == 'system' -%}
        {{- show(messages[0]['content'], false) + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments '
        'within <tool_call></tool_call> XML tags:\n<tool_call>\n'
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0]['role'] == 'system' -%}
    {{- '<|im_start|>system\n' + show(messages[0]['content'], false) + '<|im_end|>\n' -}}
{%- endif -%}
{%- set state = namespace(searching=true, last_query=messages|length - 1) -%}
{%- for message in messages[::-1] -%}
    {%- set index = (messages|length - 1) - loop.index0 -%}
    {%- if state.searching and message['role'] == 'user' -%}
        {%- set shown = show(message['content'], false) -%}
        {%- if not (shown.startswith('<tool_response>') and shown.endswith('</tool_response>')) -%}
            {%- set state.searching = false -%}
            {%- set state.last_query = index -%}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
    {%- set body = show(message['content'], true) -%}
    {%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) -%}
        {{- '<|im_start|>' + message['role'] + '\n' + body + '<|im_end|>\n' -}}
    {%- elif message['role'] == 'assistant' -%}
        {%- set thought = '' -%}
        {%- if message.get('reasoning_content') is string -%}
            {%- set thought = message['reasoning_content'] -%}
        {%- elif '</think>' in body -%}
            {%- set thought = body.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set body = body.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {%- if loop.index0 > state.last_query and (loop.last or thought) -%}
            {{- '<|im_start|>assistant\n<think>\n' + thought.strip('\n') + '\n</think>\n\n' + body.lstrip('\n') -}}
        {%- else -%}
            {{- '<|im_start|>assistant\n' + body -}}
        {%- endif -%}
        {%- for call in message.get('tool_calls') or [] -%}
            {%- if (loop.first and body) or not loop.first -%}{{- '\n' -}}{%- endif -%}
            {%- set fn = call['function'] if call.get('function') else call -%}
            {{- '<tool_call>\n{"name": "' + fn['name'] + '", "arguments": ' -}}
            {%- if fn['arguments'] is string -%}{{- fn['arguments'] -}}{%- else -%}{{- fn['arguments'] | tojson -}}{%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message['role'] == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + body + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{#- the Thinking checkpoints always open a thought: there is no switch to turn it off -#}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n<think>\n' -}}
{%- endif -%}
"""

# Qwen3-VL-*-Instruct's template as published (no reasoning handling: an assistant's
# content, ``<think>`` and all, is written verbatim; prefix-preserving).
QWEN3_VL_INSTRUCT_TEMPLATE = r"""
{%- set seen = namespace(images=0, videos=0) -%}
{%- macro text_of(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for part in content if 'text' in part -%}{{- part.text -}}{%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- macro shown(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part.type == 'image' or 'image' in part or 'image_url' in part -%}
                {%- set seen.images = seen.images + 1 -%}
                {%- if add_vision_id -%}{{- 'Picture ' ~ seen.images ~ ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif part.type == 'video' or 'video' in part -%}
                {%- set seen.videos = seen.videos + 1 -%}
                {%- if add_vision_id -%}{{- 'Video ' ~ seen.videos ~ ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- elif 'text' in part -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0].role == 'system' -%}{{- text_of(messages[0].content) + '\n\n' -}}{%- endif -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n'
        'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments '
        'within <tool_call></tool_call> XML tags:\n<tool_call>\n'
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
    {{- '<|im_start|>system\n' + text_of(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'user' -%}
        {{- '<|im_start|>user\n' + shown(message.content) + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' + text_of(message.content) -}}
        {%- for call in message.tool_calls or [] -%}
            {%- if not loop.first or message.content -%}{{- '\n' -}}{%- endif -%}
            {%- set fn = call.function if call.function else call -%}
            {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' -}}
            {{- fn.arguments if fn.arguments is string else fn.arguments | tojson -}}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + shown(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

GEMMA3_TEMPLATE = r"""
{{- bos_token -}}
{%- set state = namespace(prefix='', first=0) -%}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set system = messages[0]['content'] -%}
    {%- set state.prefix = (system if system is string else system[0]['text']) + '\n\n' -%}
    {%- set state.first = 1 -%}
{%- endif -%}
{%- for message in messages[state.first:] -%}
    {%- if (message['role'] == 'user') != (loop.index0 is even) -%}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
    {%- endif -%}
    {{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' -}}
    {%- if loop.first -%}{{- state.prefix -}}{%- endif -%}
    {%- if message['content'] is string -%}
        {{- message['content'] | trim -}}
    {%- elif message['content'] is iterable -%}
        {%- for part in message['content'] -%}
            {%- if part['type'] == 'image' -%}
                {{- '<start_of_image>' -}}
            {%- elif part['type'] == 'text' -%}
                {{- part['text'] | trim -}}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- raise_exception('Invalid content type') -}}
    {%- endif -%}
    {{- '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<start_of_turn>model\n' -}}
{%- endif -%}
"""

SMOLVLM_TEMPLATE = r"""
{{- '<|im_start|>' -}}
{%- for message in messages -%}
    {{- message['role'] | capitalize -}}
    {{- ':' if message['content'][0]['type'] == 'image' else ': ' -}}
    {%- for part in message['content'] -%}
        {%- if part['type'] == 'text' -%}
            {{- part['text'] -}}
        {%- elif part['type'] == 'image' -%}
            {{- '<image>' -}}
        {%- elif part['type'] == 'video' -%}
            {{- '<video>' -}}
        {%- endif -%}
    {%- endfor -%}
    {{- '<end_of_utterance>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- 'Assistant:' -}}
{%- endif -%}
"""

_QWEN3_5_BODY = r"""
{%- set seen = namespace(images=0, videos=0) -%}
{%- macro show(content, counting, in_system=false) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if 'image' in part or 'image_url' in part or part.type == 'image' -%}
                {%- if in_system -%}{{- raise_exception('System message cannot contain images.') -}}{%- endif -%}
                {%- if counting -%}{%- set seen.images = seen.images + 1 -%}{%- endif -%}
                {%- if add_vision_id -%}{{- 'Picture ' ~ seen.images ~ ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif 'video' in part or part.type == 'video' -%}
                {%- if in_system -%}{{- raise_exception('System message cannot contain videos.') -}}{%- endif -%}
                {%- if counting -%}{%- set seen.videos = seen.videos + 1 -%}{%- endif -%}
                {%- if add_vision_id -%}{{- 'Video ' ~ seen.videos ~ ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- elif 'text' in part -%}
                {{- part.text -}}
            {%- else -%}
                {{- raise_exception('Unexpected item type in content.') -}}
            {%- endif -%}
        {%- endfor -%}
    {%- elif content is none or content is undefined -%}
    {%- else -%}
        {{- raise_exception('Unexpected content type.') -}}
    {%- endif -%}
{%- endmacro -%}
{%- if not messages -%}{{- raise_exception('No messages provided.') -}}{%- endif -%}
{%- set instructions = '' -%}
{%- if qwen_version >= 38 and (enable_thinking is undefined or enable_thinking is true) -%}
    {%- set effort = reasoning_effort | default('xhigh') -%}
    {%- if effort not in ('xhigh', 'medium', 'low') -%}
        {{- raise_exception('Unexpected reasoning effort ' ~ reasoning_effort ~ '. Supported types are xhigh (default), medium, and low.') -}}
    {%- elif effort == 'xhigh' -%}
        {%- set instructions = 'Reasoning effort is set to xhigh. Please think carefully through the task, validate key assumptions, consider plausible alternatives, and prioritize correctness, consistency, and clarity in the final answer.' -%}
    {%- elif effort == 'low' -%}
        {%- set instructions = 'Reasoning effort is set to low. Keep your thinking brief and focused, moving directly to the conclusion without unnecessary elaboration.' -%}
    {%- endif -%}
{%- endif -%}
{%- set lead = instructions + '\n\n' if instructions else '' -%}
{%- if tools and tools is iterable and tools is not mapping -%}
    {{- '<|im_start|>system\n' + lead + '# Tools\n\nYou have access to the following functions:\n\n<tools>' -}}
    {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n'
        '<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n'
        '</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n'
        'that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n'
        'Reminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> '
        'block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be '
        'specified\n- You may provide optional reasoning for your function call in natural language '
        'BEFORE the function call, but NOT after\n- If there is no function call available, answer the '
        'question like normal with your current knowledge and do not tell the user about function calls\n'
        '</IMPORTANT>' -}}
    {%- if messages[0].role == 'system' -%}
        {%- set system = show(messages[0].content, false, true) | trim -%}
        {%- if system -%}{{- '\n\n' + system -}}{%- endif -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
    {%- set system = show(messages[0].content, false, true) | trim -%}
    {%- if qwen_version < 38 or system -%}
        {{- '<|im_start|>system\n' + lead + system + '<|im_end|>\n' -}}
    {%- elif instructions -%}
        {{- '<|im_start|>system\n' + instructions + '<|im_end|>\n' -}}
    {%- endif -%}
{%- elif instructions -%}
    {{- '<|im_start|>system\n' + instructions + '<|im_end|>\n' -}}
{%- endif -%}
{%- set state = namespace(searching=true, last_query=messages|length - 1) -%}
{%- for message in messages[::-1] -%}
    {%- if state.searching and message.role == 'user' -%}
        {%- set text = show(message.content, false) | trim -%}
        {%- if not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) -%}
            {%- set state.searching = false -%}
            {%- set state.last_query = (messages|length - 1) - loop.index0 -%}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if state.searching -%}{{- raise_exception('No user query found in messages.') -}}{%- endif -%}
{%- for message in messages -%}
    {%- set body = show(message.content, true) | trim -%}
    {%- if message.role == 'system' -%}
        {%- if not loop.first -%}{{- raise_exception('System message must be at the beginning.') -}}{%- endif -%}
    {%- elif message.role == 'user' -%}
        {{- '<|im_start|>user\n' + body + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set thought = '' -%}
        {%- if message.reasoning_content is string -%}
            {%- set thought = message.reasoning_content -%}
        {%- elif qwen_version < 38 and '</think>' in body -%}
            {%- set thought = body.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set body = body.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {%- if qwen_version >= 38 -%}
            {%- set kept = preserve_thinking is undefined or preserve_thinking is true -%}
        {%- else -%}
            {%- set kept = qwen_version >= 36 and preserve_thinking is defined and preserve_thinking is true -%}
        {%- endif -%}
        {%- if kept or loop.index0 > state.last_query -%}
            {{- '<|im_start|>assistant\n<think>\n' + (thought | trim) + '\n</think>\n\n' + body -}}
        {%- else -%}
            {{- '<|im_start|>assistant\n' + body -}}
        {%- endif -%}
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping -%}
            {%- for call in message.tool_calls -%}
                {%- set fn = call.function if call.function is defined else call -%}
                {%- if not loop.first -%}
                    {{- '\n' -}}
                {%- elif body | trim -%}
                    {{- '\n\n' -}}
                {%- endif -%}
                {{- '<tool_call>\n<function=' + fn.name + '>\n' -}}
                {%- if fn.arguments is defined and (qwen_version < 38 or fn.arguments != '') -%}
                    {%- for name, value in fn.arguments | items -%}
                        {{- '<parameter=' + name + '>\n' -}}
                        {%- if qwen_version >= 36 and value is not string -%}
                            {{- value | tojson -}}
                        {%- elif value is mapping or (value is sequence and value is not string) -%}
                            {{- value | tojson -}}
                        {%- else -%}
                            {{- value | string -}}
                        {%- endif -%}
                        {{- '\n</parameter>\n' -}}
                    {%- endfor -%}
                {%- endif -%}
                {{- '</function>\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.previtem and loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + body + '\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- else -%}
        {{- raise_exception('Unexpected message role.') -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if thinks_by_default -%}
        {%- set open = not (enable_thinking is defined and enable_thinking is false) -%}
    {%- else -%}
        {%- set open = enable_thinking is defined and enable_thinking is true -%}
    {%- endif -%}
    {{- '<think>\n' if open else '<think>\n\n</think>\n\n' -}}
{%- endif -%}
"""

#: Qwen3.5's template variants: (version, thinking unless switched off): the 0.8B and 2B
#: checkpoints' (the default), the 4B and larger ones', Qwen3.6's and Qwen3.8's.
_QWEN3_5_VARIANTS = {"nothink": (35, False), "think": (35, True), "qwen3.6": (36, True),
                     "qwen3.8": (38, True)}  # fmt: skip


def _qwen3_5_template(variant: str) -> str:
    version, thinks = _QWEN3_5_VARIANTS[variant]
    settings = (
        f"{{%- set qwen_version = {version} -%}}"
        f"{{%- set thinks_by_default = {'true' if thinks else 'false'} -%}}"
    )
    return settings + _QWEN3_5_BODY


QWEN3_5_TEMPLATE = _qwen3_5_template("nothink")

LLAVA_ONEVISION_TEMPLATE = r"""
{%- for message in messages -%}
    {{- '<|im_start|>' + message['role'] + ' ' -}}
    {%- for part in message['content'] if part['type'] == 'image' -%}{{- '<image>' -}}{%- endfor -%}
    {%- for part in message['content'] if part['type'] == 'video' -%}{{- '<video>' -}}{%- endfor -%}
    {%- for part in message['content'] if part['type'] == 'text' -%}{{- '\n' + part['text'] -}}{%- endfor -%}
    {{- '<|im_end|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

# LLaVA-NeXT (llava-hf/llava-v1.6-mistral-7b-hf): Mistral's [INST] format; a message's
# images before its text; no generation prompt (the model writes " " and its answer after
# " [/INST]"); the system text and an assistant's text are their first part's.
LLAVA_NEXT_TEMPLATE = r"""
{%- for message in messages -%}
    {%- if message['role'] == 'system' -%}
        {{- '<<SYS>>\n' + message['content'][0]['text'] + '\n<</SYS>>\n\n' -}}
    {%- elif message['role'] == 'user' -%}
        {{- '[INST] ' -}}
        {%- for part in message['content'] if part['type'] == 'image' -%}{{- '<image>\n' -}}{%- endfor -%}
        {%- for part in message['content'] if part['type'] == 'text' -%}{{- part['text'] -}}{%- endfor -%}
        {{- ' [/INST]' -}}
    {%- elif message['role'] == 'assistant' -%}
        {{- ' ' + message['content'][0]['text'] + '</s> ' -}}
    {%- else -%}
        {{- raise_exception('Only user and assistant roles are supported!') -}}
    {%- endif -%}
{%- endfor -%}
"""


# InternVL3 (OpenGVLab/InternVL3-*-hf, converted by transformers' script): ChatML turns
# with no default system message; every role written as given (``tool`` included), string
# content verbatim, a list's parts in order: an image as <IMG_CONTEXT> and a newline (the
# processor expands it to <img>, the image's tokens, </img>), a video as <video> and a
# newline, text verbatim; tools, tool calls and reasoning are not written.
INTERNVL_TEMPLATE = r"""
{%- for message in messages -%}
    {{- '<|im_start|>' + message['role'] + '\n' -}}
    {%- if message['content'] is string -%}
        {{- message['content'] -}}
    {%- else -%}
        {%- for part in message['content'] -%}
            {%- if part['type'] == 'image' -%}
                {{- '<IMG_CONTEXT>\n' -}}
            {%- elif part['type'] == 'video' -%}
                {{- '<video>\n' -}}
            {%- elif part['type'] == 'text' -%}
                {{- part['text'] -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""


# LFM2.5-VL (LiquidAI/LFM2.5-VL-3B): <|startoftext|> first; the first system message's
# text and the tools (``List of tools: [...]``, each as JSON) in one system turn; then every
# message as a ChatML turn, its parts in order (an image as <image>, text verbatim, any
# other part as JSON); an assistant turn's reasoning in <think>...</think> (no newlines)
# only after the last user message unless ``preserve_thinking``, earlier ones also losing
# a </think> left in the content; calls as one Python list (``vf_mm.renderers._pythonic``);
# arguments given as a JSON string are refused. (transformers' continue_final_message
# marker, which the real template moves after the calls, is not handled: vf_mm never
# continues a final message.)
# Kimi-K2.5 (moonshotai/Kimi-K2.5): ``<|im_user|>`` / ``<|im_assistant|>`` / ``<|im_system|>``
# (every other role) + the message's ``name`` or role + ``<|im_middle|>`` + body +
# ``<|im_end|>``, with no newline between turns and no default system turn. Assistant turns
# up to the last one without tool calls are written ``<think></think>`` + content (their
# reasoning dropped); later ones ``<think>REASONING</think>`` + content (``<think></think>``
# with ``thinking=False``); calls follow in one ``<|tool_calls_section_begin|>`` section,
# each call written as its id (``functions.NAME:INDEX`` in Kimi's own format) and its
# arguments. A tool result is ``## Return of ID\n`` + content. Each image is
# ``<|media_begin|>image<|media_content|><|media_pad|><|media_end|>\n``. Tools are declared
# in a ``tool_declare`` system turn: the ``tools_ts_str`` a caller passes (Kimi's tokenizer
# writes the tools as TypeScript there), else the tools as compact JSON. The generation
# prompt opens a think block (``<think>``), or writes an empty one with ``thinking=False``.
KIMI_K25_TEMPLATE = r"""
{%- macro body(message) -%}
    {%- set content = message.get('content') -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is not none -%}
        {%- for part in content -%}
            {%- if part['type'] in ('image', 'image_url') -%}
                {{- '<|media_begin|>image<|media_content|><|media_pad|><|media_end|>\n' -}}
            {%- elif part['type'] in ('video', 'video_url') -%}
                {{- '<|kimi_k25_video_placeholder|>\n' -}}
            {%- else -%}
                {{- part['text'] -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- set state = namespace(history_end=-1) -%}
{%- for message in messages -%}
    {%- if message['role'] == 'assistant' and not message.get('tool_calls') -%}
        {%- set state.history_end = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- if tools -%}
    {{- '<|im_system|>tool_declare<|im_middle|>' -}}
    {%- if tools_ts_str -%}
        {{- tools_ts_str -}}
    {%- else -%}
        {{- tools | tojson(separators=(',', ':')) -}}
    {%- endif -%}
    {{- '<|im_end|>' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- set role = message['role'] -%}
    {%- if role == 'user' -%}
        {{- '<|im_user|>' -}}
    {%- elif role == 'assistant' -%}
        {{- '<|im_assistant|>' -}}
    {%- else -%}
        {{- '<|im_system|>' -}}
    {%- endif -%}
    {{- (message.get('name') or role) ~ '<|im_middle|>' -}}
    {%- if role == 'assistant' -%}
        {%- if loop.index0 <= state.history_end or thinking is false -%}
            {{- '<think></think>' -}}
        {%- else -%}
            {{- '<think>' ~ message.get('reasoning_content', '') ~ '</think>' -}}
        {%- endif -%}
        {{- body(message) -}}
        {%- if message.get('tool_calls') -%}
            {{- '<|tool_calls_section_begin|>' -}}
            {%- for call in message['tool_calls'] -%}
                {%- set arguments = call['function']['arguments'] -%}
                {{- '<|tool_call_begin|>' ~ call['id'] ~ '<|tool_call_argument_begin|>' -}}
                {{- arguments if arguments is string else arguments | tojson -}}
                {{- '<|tool_call_end|>' -}}
            {%- endfor -%}
            {{- '<|tool_calls_section_end|>' -}}
        {%- endif -%}
    {%- elif role == 'tool' -%}
        {{- '## Return of ' ~ message.tool_call_id ~ '\n' -}}
        {{- body(message) -}}
    {%- elif message['content'] is not none -%}
        {{- body(message) -}}
    {%- endif -%}
    {{- '<|im_end|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_assistant|>assistant<|im_middle|>' -}}
    {{- '<think></think>' if thinking is false else '<think>' -}}
{%- endif -%}
"""


LFM2_VL_TEMPLATE = r"""
{%- macro text_of(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is mapping -%}
        {{- content | tojson -}}
    {%- elif content is iterable -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part is mapping and part.get('type') == 'image' -%}
                {{- '<image>' -}}
            {%- elif part is mapping and part.get('type') == 'text' -%}
                {{- (part.get('text') or '') | string -}}
            {%- else -%}
                {{- part | tojson -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- macro value_of(value) -%}
    {%- if value is string -%}
        {{- "'" + (value | replace('\\', '\\\\') | replace("'", "\\'") | replace('\n', '\\n') | replace('\r', '\\r')) + "'" -}}
    {%- elif value is mapping or value is iterable -%}
        {{- value | tojson -}}
    {%- else -%}
        {{- value | string -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro calls_of(tool_calls) -%}
    {{- '<|tool_call_start|>[' -}}
    {%- for call in tool_calls -%}
        {%- set function = call['function'] if 'function' in call else call -%}
        {%- set arguments = function.get('arguments') -%}
        {%- if arguments is string and (arguments | trim) not in ['', '{}', 'null'] -%}
            {{- raise_exception('Tool call arguments must be a mapping, not a JSON string') -}}
        {%- endif -%}
        {{- (', ' if not loop.first else '') + function['name'] + '(' -}}
        {%- if arguments is mapping -%}
            {%- for key, value in arguments.items() -%}
                {{- (', ' if not loop.first else '') + key + '=' + value_of(value) -}}
            {%- endfor -%}
        {%- endif -%}
        {{- ')' -}}
    {%- endfor -%}
    {{- ']<|tool_call_end|>' -}}
{%- endmacro -%}
{{- bos_token -}}
{%- set keep_all = preserve_thinking | default(false) -%}
{%- set system = namespace(text='') -%}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- if messages[0].get('content') -%}
        {%- set system.text = text_of(messages[0]['content']) -%}
    {%- endif -%}
    {%- set messages = messages[1:] -%}
{%- endif -%}
{%- if tools -%}
    {%- set system.text = system.text + ('\n' if system.text else '') + 'List of tools: [' -%}
    {%- for tool in tools -%}
        {%- set system.text = system.text + (tool if tool is string else tool | tojson) + ('' if loop.last else ', ') -%}
    {%- endfor -%}
    {%- set system.text = system.text + ']' -%}
{%- endif -%}
{%- if system.text -%}
    {{- '<|im_start|>system\n' + system.text + '<|im_end|>\n' -}}
{%- endif -%}
{%- set last = namespace(user=-1) -%}
{%- for message in messages -%}
    {%- if message['role'] == 'user' -%}
        {%- set last.user = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
    {{- '<|im_start|>' + message['role'] + '\n' -}}
    {%- if message['role'] == 'assistant' -%}
        {%- set keep = keep_all or loop.index0 > last.user -%}
        {%- set thought = message.get('thinking') or message.get('reasoning') or message.get('reasoning_content') -%}
        {%- if thought is string and thought and keep -%}
            {{- '<think>' + thought + '</think>' -}}
        {%- endif -%}
        {%- set body = text_of(message['content']) if message.get('content') else '' -%}
        {%- if not keep and '</think>' in body -%}
            {%- set body = body.split('</think>')[-1] | trim -%}
        {%- endif -%}
        {{- body -}}
        {%- if message.get('tool_calls') -%}
            {{- calls_of(message['tool_calls']) -}}
        {%- endif -%}
    {%- elif message.get('content') -%}
        {{- text_of(message['content']) -}}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""


# Gemma 4: one Jinja body, two settings per variant (see the module docstring).
_GEMMA4_BODY = r"""
{#- vf_mm's Gemma 4 chat template: what google/gemma-4-*-it render at the revision set
    above (vf_mm/models/_templates.py says what each revision does). -#}
{%- set q = '<|"|>' -%}
{%- macro value_text(value, quote_keys=true) -%}
    {#- a value in Gemma 4's argument dialect: strings between <|"|> quotes, keys sorted,
        booleans as true/false, null only from the current revision on -#}
    {%- if value is none and revision >= 5 -%}
        {{- 'null' -}}
    {%- elif value is string -%}
        {{- q + value + q -}}
    {%- elif value is boolean -%}
        {{- 'true' if value else 'false' -}}
    {%- elif value is mapping -%}
        {{- '{' -}}
        {%- for key, item in value | dictsort -%}
            {{- (q + key + q if quote_keys else key) ~ ':' ~ value_text(item, quote_keys) -}}
            {{- ',' if not loop.last -}}
        {%- endfor -%}
        {{- '}' -}}
    {%- elif value is sequence -%}
        {{- '[' -}}
        {%- for item in value -%}
            {{- value_text(item, quote_keys) -}}{{- ',' if not loop.last -}}
        {%- endfor -%}
        {{- ']' -}}
    {%- else -%}
        {{- value -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro quoted_list(items) -%}
    {%- for item in items -%}{{- q ~ item ~ q -}}{{- ',' if not loop.last -}}{%- endfor -%}
{%- endmacro -%}
{%- macro schema_properties(properties, filtered=false) -%}
    {#- a JSON schema's properties: NAME:{description,enum / items / nullable / properties,
        required,type}; the schema's own keywords are skipped where `filtered` (always
        before revision 3) -#}
    {%- set skip = ['description', 'type', 'properties', 'required', 'nullable'] -%}
    {%- set seen = namespace(any=false) -%}
    {%- for key, value in properties | dictsort -%}
        {%- if not ((filtered or revision < 3) and key in skip) -%}
            {{- ',' if seen.any -}}
            {%- set seen.any = true -%}
            {%- set field = namespace(count=0) -%}
            {{- key ~ ':{' -}}
            {%- if value['description'] -%}
                {{- 'description:' ~ q ~ value['description'] ~ q -}}
                {%- set field.count = 1 -%}
            {%- endif -%}
            {%- set kind = value['type'] | upper -%}
            {%- if revision < 2 and value['nullable'] -%}
                {{- ',' if field.count -}}{%- set field.count = 1 -%}{{- 'nullable:true' -}}
            {%- endif -%}
            {%- if kind == 'STRING' -%}
                {%- if value['enum'] -%}
                    {{- ',' if field.count -}}{%- set field.count = 1 -%}
                    {{- 'enum:' ~ value_text(value['enum']) -}}
                {%- endif -%}
            {%- elif kind == 'OBJECT' and revision < 2 -%}
                {#- the release revision writes a comma here even as the first field -#}
                {{- ',properties:{' -}}
                {%- if value['properties'] is defined and value['properties'] is mapping -%}
                    {{- schema_properties(value['properties']) -}}
                {%- elif value is mapping -%}
                    {{- schema_properties(value) -}}
                {%- endif -%}
                {{- '}' -}}
                {%- if value['required'] -%}
                    {{- ',required:[' ~ quoted_list(value['required'] | default([])) ~ ']' -}}
                {%- endif -%}
            {%- elif kind == 'ARRAY' -%}
                {%- if value['items'] is mapping and value['items'] -%}
                    {%- if revision < 2 -%}
                        {{- ',items:{' -}}
                    {%- else -%}
                        {{- ',' if field.count -}}{%- set field.count = 1 -%}{{- 'items:{' -}}
                    {%- endif -%}
                    {%- set inner = namespace(any=false) -%}
                    {%- for item_key, item_value in value['items'] | dictsort -%}
                        {%- if item_value is not none -%}
                            {{- ',' if inner.any -}}
                            {%- set inner.any = true -%}
                            {%- if item_key == 'properties' -%}
                                {{- 'properties:{' -}}
                                {%- if item_value is mapping -%}
                                    {{- schema_properties(item_value) -}}
                                {%- endif -%}
                                {{- '}' -}}
                            {%- elif item_key == 'required' -%}
                                {{- 'required:[' ~ quoted_list(item_value) ~ ']' -}}
                            {%- elif item_key == 'type' and item_value is string -%}
                                {{- 'type:' ~ value_text(item_value | upper) -}}
                            {%- elif item_key == 'type' -%}
                                {{- 'type:' ~ value_text(item_value | map('upper') | list) -}}
                            {%- else -%}
                                {{- item_key ~ ':' ~ value_text(item_value) -}}
                            {%- endif -%}
                        {%- endif -%}
                    {%- endfor -%}
                    {{- '}' -}}
                {%- endif -%}
            {%- endif -%}
            {%- if revision >= 2 and value['nullable'] -%}
                {{- ',' if field.count -}}{%- set field.count = 1 -%}{{- 'nullable:true' -}}
            {%- endif -%}
            {%- if revision >= 2 and kind == 'OBJECT' -%}
                {%- if value['properties'] is defined and value['properties'] is mapping -%}
                    {{- ',' if field.count -}}{%- set field.count = 1 -%}
                    {{- 'properties:{' ~ schema_properties(value['properties']) ~ '}' -}}
                {%- elif value is mapping -%}
                    {{- ',' if field.count -}}{%- set field.count = 1 -%}
                    {{- 'properties:{' ~ schema_properties(value, true) ~ '}' -}}
                {%- endif -%}
                {%- if value['required'] -%}
                    {{- ',' if field.count -}}{%- set field.count = 1 -%}
                    {{- 'required:[' ~ quoted_list(value['required'] | default([])) ~ ']' -}}
                {%- endif -%}
            {%- endif -%}
            {{- ',' if field.count -}}
            {{- 'type:' ~ q ~ kind ~ q ~ '}' -}}
        {%- endif -%}
    {%- endfor -%}
{%- endmacro -%}
{%- macro declaration(tool) -%}
    {#- one tool: declaration:NAME{description,parameters:{properties,required,type},response} -#}
    {%- set function = tool['function'] -%}
    {{- 'declaration:' ~ function['name'] ~ '{description:' ~ q ~ function['description'] ~ q -}}
    {%- set params = function['parameters'] -%}
    {%- if params -%}
        {{- ',parameters:{' -}}
        {%- if params['properties'] -%}
            {{- 'properties:{' ~ schema_properties(params['properties']) ~ '},' -}}
        {%- endif -%}
        {%- if params['required'] -%}
            {{- 'required:[' ~ quoted_list(params['required']) ~ '],' -}}
        {%- endif -%}
        {%- if params['type'] -%}
            {{- 'type:' ~ q ~ params['type'] | upper ~ q ~ '}' -}}
        {%- endif -%}
    {%- endif -%}
    {%- if 'response' in function -%}
        {%- set response = function['response'] -%}
        {{- ',response:{' -}}
        {%- if response['description'] -%}
            {{- 'description:' ~ q ~ response['description'] ~ q ~ ',' -}}
        {%- endif -%}
        {%- if response['type'] | upper == 'OBJECT' -%}
            {{- 'type:' ~ q ~ response['type'] | upper ~ q ~ '}' -}}
        {%- endif -%}
    {%- endif -%}
    {{- '}' -}}
{%- endmacro -%}
{%- macro call_text(call) -%}
    {#- <|tool_call>call:NAME{key:value,...}<tool_call|>, arguments a mapping (a string is
        written verbatim before the current revision, refused from it on) -#}
    {%- set function = call['function'] -%}
    {{- '<|tool_call>call:' + function['name'] + '{' -}}
    {%- if function['arguments'] is mapping -%}
        {%- for key, value in function['arguments'] | dictsort -%}
            {{- key ~ ':' ~ value_text(value, false) -}}{{- ',' if not loop.last -}}
        {%- endfor -%}
    {%- elif revision < 5 and function['arguments'] is string -%}
        {{- function['arguments'] -}}
    {%- elif revision >= 5 and function['arguments'] is not none -%}
        {{- raise_exception('tool call arguments must be a mapping, not a string') -}}
    {%- endif -%}
    {{- '}<tool_call|>' -}}
{%- endmacro -%}
{%- macro response_text(name, response) -%}
    {#- <|tool_response>response:NAME{key:value,...}<tool_response|>; a value that is not
        a mapping is written as {value:...} -#}
    {{- '<|tool_response>' -}}
    {%- if response is mapping -%}
        {{- 'response:' + name + '{' -}}
        {%- for key, value in response | dictsort -%}
            {{- key ~ ':' ~ value_text(value, false) -}}{{- ',' if not loop.last -}}
        {%- endfor -%}
        {{- '}' -}}
    {%- else -%}
        {{- 'response:' + name + '{value:' + value_text(response, false) + '}' -}}
    {%- endif -%}
    {{- '<tool_response|>' -}}
{%- endmacro -%}
{%- macro without_thoughts(text) -%}
    {#- a model turn's text without its <|channel>...<channel|> blocks, trimmed -#}
    {%- set kept = namespace(text='') -%}
    {%- for piece in text.split('<channel|>') -%}
        {%- set kept.text = kept.text + piece.split('<|channel>')[0] -%}
    {%- endfor -%}
    {{- kept.text | trim -}}
{%- endmacro -%}
{%- macro is_image(part) -%}
    {{- 'y' if part.get('type') == 'image' or (revision >= 5 and part.get('type') == 'image_url') -}}
{%- endmacro -%}
{%- macro is_audio(part) -%}
    {{- 'y' if part.get('type') == 'audio' or (revision >= 5 and part.get('type') == 'input_audio') -}}
{%- endmacro -%}
{%- set thinking = enable_thinking is defined and enable_thinking -%}
{%- set keep_thinking = revision >= 5 and preserve_thinking is defined and preserve_thinking -%}
{%- set state = namespace(last=None, previous_role=None) -%}
{%- set turns = messages -%}
{{- bos_token -}}
{#- the system turn: thinking switch, system text, tool declarations -#}
{%- set system_first = (messages or revision < 5) and messages[0]['role'] in ['system', 'developer'] -%}
{%- if thinking or tools or system_first -%}
    {{- '<|turn>system\n' -}}
    {%- if thinking -%}
        {{- '<|think|>' if revision < 2 else '<|think|>\n' -}}
        {%- set state.last = 'think' -%}
    {%- endif -%}
    {%- if system_first -%}
        {%- set system = messages[0]['content'] -%}
        {%- if revision < 3 or system is string -%}
            {{- system | trim -}}
        {%- elif system is sequence -%}
            {%- for part in system -%}{{- (part['text'] | trim) + ' ' -}}{%- endfor -%}
        {%- endif -%}
        {%- set turns = messages[1:] -%}
    {%- endif -%}
    {%- for tool in tools or [] -%}
        {{- '<|tool>' + (declaration(tool) | trim) + '<tool|>' -}}
        {%- set state.last = 'tool' -%}
    {%- endfor -%}
    {{- '<turn|>\n' -}}
{%- endif -%}
{%- if revision < 2 -%}
    {#- the release revision: every message a turn of its own, tool results included;
        images between blank lines; no reasoning -#}
    {%- for message in turns -%}
        {%- set state.last = None -%}
        {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
        {{- '<|turn>' + role + '\n' -}}
        {%- for call in message['tool_calls'] or [] -%}
            {{- call_text(call) -}}{%- set state.last = 'tool_call' -%}
        {%- endfor -%}
        {%- for result in message['tool_responses'] or [] -%}
            {{- response_text(result['name'] | default('unknown'), result['response']) -}}
            {%- set state.last = 'tool_response' -%}
        {%- endfor -%}
        {%- set content = message['content'] -%}
        {%- if content is string -%}
            {{- without_thoughts(content) if role == 'model' else content | trim -}}
        {%- elif content is sequence -%}
            {%- for part in content -%}
                {%- if part['type'] == 'text' -%}
                    {{- without_thoughts(part['text']) if role == 'model' else part['text'] | trim -}}
                {%- elif part['type'] in ['image', 'audio', 'video'] -%}
                    {%- set token = '<|' + part['type'] + '|>' -%}
                    {{- token if part['type'] == 'audio' else '\n\n' + token + '\n\n' -}}
                    {%- set state.last = part['type'] -%}
                {%- endif -%}
            {%- endfor -%}
        {%- endif -%}
        {%- if not (message['tool_responses'] and not content) -%}
            {{- '<turn|>\n' -}}
        {%- endif -%}
    {%- endfor -%}
{%- else -%}
    {#- later revisions: tool messages are results merged into the model turn that called
        them; reasoning kept after the last user message -#}
    {%- set last_user = namespace(index=-1) -%}
    {%- for message in turns -%}
        {%- if message['role'] == 'user' -%}{%- set last_user.index = loop.index0 -%}{%- endif -%}
    {%- endfor -%}
    {%- for message in turns -%}
        {%- set index = loop.index0 -%}
        {%- if message['role'] != 'tool' -%}
            {%- set state.last = None -%}
            {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
            {%- set calls = message.get('tool_calls') -%}
            {%- if not (role == 'model' and state.previous_role == 'assistant') -%}
                {{- '<|turn>' + role + '\n' -}}
            {%- endif -%}
            {%- set thought = message.get('reasoning') or message.get('reasoning_content') -%}
            {%- if revision >= 5 -%}
                {%- set shown = index > last_user.index or (keep_thinking and calls) -%}
            {%- else -%}
                {%- set shown = index > last_user.index and calls -%}
            {%- endif -%}
            {%- if thought and shown -%}
                {{- '<|channel>thought\n' + thought + '\n<channel|>' -}}
            {%- endif -%}
            {%- for call in calls or [] -%}
                {{- call_text(call) -}}{%- set state.last = 'tool_call' -%}
            {%- endfor -%}
            {%- set answered = namespace(any=false, open=true) -%}
            {%- if message.get('tool_responses') -%}
                {%- for result in message.get('tool_responses') -%}
                    {%- if revision >= 5 -%}
                        {%- set name = result['name'] | default('unknown', true) -%}
                    {%- else -%}
                        {%- set name = result['name'] | default('unknown') -%}
                    {%- endif -%}
                    {{- response_text(name, result['response']) -}}
                    {%- set answered.any = true -%}{%- set state.last = 'tool_response' -%}
                {%- endfor -%}
            {%- elif calls -%}
                {%- for follow in turns[index + 1:] -%}
                    {%- if follow['role'] != 'tool' -%}{%- set answered.open = false -%}{%- endif -%}
                    {%- if answered.open -%}
                        {%- if revision >= 5 -%}
                            {%- set who = namespace(name=follow.get('name') or 'unknown') -%}
                        {%- else -%}
                            {%- set who = namespace(name=follow.get('name') | default('unknown')) -%}
                        {%- endif -%}
                        {%- for call in calls -%}
                            {%- if call.get('id') == follow.get('tool_call_id') -%}
                                {%- set who.name = call['function']['name'] -%}
                            {%- endif -%}
                        {%- endfor -%}
                        {%- set body = follow.get('content') -%}
                        {%- if body is string or body is not sequence -%}
                            {{- response_text(who.name, body) -}}
                        {%- else -%}
                            {%- set text = namespace(all='') -%}
                            {%- for part in body if part.get('type') == 'text' -%}
                                {%- set text.all = text.all + (part.get('text') | default('')) -%}
                            {%- endfor -%}
                            {{- response_text(who.name, text.all) -}}
                            {%- if revision >= 4 -%}
                                {%- for part in body -%}
                                    {%- if is_image(part) -%}{{- '<|image|>' -}}
                                    {%- elif is_audio(part) -%}{{- '<|audio|>' -}}
                                    {%- elif part.get('type') == 'video' -%}{{- '<|video|>' -}}
                                    {%- endif -%}
                                {%- endfor -%}
                            {%- endif -%}
                        {%- endif -%}
                        {%- set answered.any = true -%}{%- set state.last = 'tool_response' -%}
                    {%- endif -%}
                {%- endfor -%}
            {%- endif -%}
            {%- set content = message.get('content') -%}
            {%- set written -%}
                {%- if content is string -%}
                    {{- without_thoughts(content) if role == 'model' else content | trim -}}
                {%- elif content is sequence -%}
                    {%- for part in content -%}
                        {%- if part.get('type') == 'text' -%}
                            {{- without_thoughts(part['text']) if role == 'model' else part['text'] | trim -}}
                        {%- elif is_image(part) -%}
                            {{- '<|image|>' -}}
                        {%- elif is_audio(part) -%}
                            {{- '<|audio|>' -}}
                        {%- elif part.get('type') == 'video' -%}
                            {{- '<|video|>' -}}
                        {%- endif -%}
                    {%- endfor -%}
                {%- endif -%}
            {%- endset -%}
            {{- written -}}
            {%- if revision < 5 and content is sequence and content is not string -%}
                {#- before the current revision an image, audio or video part is the last
                    thing written, and closes the turn even after a call -#}
                {%- for part in content -%}
                    {%- if is_image(part) -%}{%- set state.last = 'image' -%}
                    {%- elif is_audio(part) -%}{%- set state.last = 'audio' -%}
                    {%- elif part.get('type') == 'video' -%}{%- set state.last = 'video' -%}
                    {%- endif -%}
                {%- endfor -%}
            {%- endif -%}
            {%- set next = namespace(role=None) -%}
            {%- for later in turns[index + 1:] if later['role'] != 'tool' -%}
                {%- if loop.first -%}{%- set next.role = later['role'] -%}{%- endif -%}
            {%- endfor -%}
            {%- if revision < 3 -%}
                {%- set empty = not message.get('content') -%}
            {%- else -%}
                {%- set empty = (written | trim | length) == 0 -%}
            {%- endif -%}
            {%- if state.last == 'tool_call' and not answered.any -%}
                {{- '<|tool_response>' -}}
            {%- elif revision >= 5 and role == 'model' and next.role == 'assistant'
                     and (not calls or answered.any) -%}
            {%- elif revision >= 5 and answered.any and empty and next.role is none -%}
            {%- elif revision < 5 and answered.any and empty -%}
            {%- else -%}
                {{- '<turn|>\n' -}}
            {%- endif -%}
            {%- set state.previous_role = message['role'] -%}
        {%- endif -%}
    {%- endfor -%}
{%- endif -%}
{%- if add_generation_prompt -%}
    {%- if state.last != 'tool_response' and (revision < 2 or state.last != 'tool_call') -%}
        {{- '<|turn>model\n' -}}
        {%- if empty_thought_prefill and not thinking -%}{{- '<|channel>thought\n<channel|>' -}}{%- endif -%}
    {%- elif revision >= 5 and state.last == 'tool_response' and thinking -%}
        {{- '<|channel>thought\n' -}}
    {%- endif -%}
{%- endif -%}
"""

#: Gemma 4's template variants: (revision number, empty thought block in the generation
#: prompt when thinking is off). Revisions of google/gemma-4-E2B-it (E4B-it ships the
#: same templates): 4742fe8 (release), b446025, 6b7e72c, 905e84b, 8995379 (current);
#: "31b" and "26b-a4b" are the 31B and 26B-A4B checkpoints' template (8995379's, with
#: the prefill): one text, two tiny architectures (dense; mixture of experts).
_GEMMA4_VARIANTS = {
    "8995379": (5, False),
    "905e84b": (4, False),
    "6b7e72c": (3, False),
    "b446025": (2, False),
    "4742fe8": (1, False),
    "31b": (5, True),
    "26b-a4b": (5, True),
}


def _gemma4_template(variant: str) -> str:
    revision, prefill = _GEMMA4_VARIANTS[variant]
    settings = (
        f"{{%- set revision = {revision} -%}}"
        f"{{%- set empty_thought_prefill = {'true' if prefill else 'false'} -%}}"
    )
    return settings + _GEMMA4_BODY


# GLM-4.6V (zai-org/GLM-4.6V, and GLM-4.6V-Flash, whose template differs by one Jinja
# comment and renders the same): the checkpoint's own template, byte for byte (the text
# pinned in tests/renderers/golden/glm46v.jinja, where a test holds the two equal), since
# the renderer must write what the real checkpoint writes. What it does: ``[gMASK]<sop>``
# first; tools in a ``<|system|>`` turn; ``<|user|>`` / ``<|assistant|>`` / ``<|system|>``
# turns with no end token; every image ``<|begin_of_image|><|image|><|end_of_image|>``
# where it stands (user, system and tool messages); an answer's reasoning written as
# ``<think>...</think>`` only after the last user message (earlier ones ``<think></think>``);
# calls as ``<tool_call>NAME`` and ``<arg_key>``/``<arg_value>`` pairs; tool results after
# one ``<|observation|>`` per run, each in ``<tool_response>``.
GLM46V_TEMPLATE = r"""[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
<arg_key>{arg-key-2}</arg_key>
<arg_value>{arg-value-2}</arg_value>
...
</tool_call>{%- endif -%}
{%- macro visible_text(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item is mapping and item.type == 'text' -%}
                {{- item.text }}
            {%- elif item is mapping and (item.type == 'image' or 'image' in item) -%}
                <|begin_of_image|><|image|><|end_of_image|>
            {%- elif item is mapping and (item.type == 'video' or 'video' in item) -%}
                <|begin_of_video|><|video|><|end_of_video|>
            {%- elif item is string -%}
                {{- item }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {% set ns.last_user_index = loop.index0 -%}
    {%- endif %}
{%- endfor %}
{% for m in messages %}
{%- if m.role == 'user' -%}<|user|>
{% if m.content is string %}
{{ m.content }}
{%- else %}
{%- for item in m.content %}
{% if item.type == 'video' or 'video' in item %}
<|begin_of_video|><|video|><|end_of_video|>{% elif item.type == 'image' or 'image' in item %}
<|begin_of_image|><|image|><|end_of_image|>{% elif item.type == 'text' %}
{{ item.text }}
{%- endif %}
{%- endfor %}
{%- endif %}
{{- '/nothink' if (enable_thinking is defined and not enable_thinking and not visible_text(m.content).endswith("/nothink")) else '' -}}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' %}
{%- set content = visible_text(m.content) %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- else %}
    {%- if '</think>' in content %}
        {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
{%- endif %}
{%- if loop.index0 > ns.last_user_index and reasoning_content -%}
{{ '\n<think>' + reasoning_content.strip() +  '</think>'}}
{%- else -%}
{{ '\n<think></think>' }}
{%- endif -%}
{%- if content.strip() -%}
{{ '\n' + content.strip() }}
{%- endif -%}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
{%- if tc.function %}
    {%- set tc = tc.function %}
{%- endif %}
{{ '\n<tool_call>' + tc.name }}
{% set _args = tc.arguments %}
{% for k, v in _args.items() %}
<arg_key>{{ k }}</arg_key>
<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{% endfor %}
</tool_call>{% endfor %}
{% endif %}
{%- elif m.role == 'tool' -%}
{%- if m.content is string -%}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
    {{- '<|observation|>' }}
{%- endif %}
{{- '\n<tool_response>\n' }}
{{- m.content }}
{{- '\n</tool_response>' }}
{% elif m.content is iterable and m.content is not mapping %}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
{{- '<|observation|>' }}
{%- endif %}
{{- '\n<tool_response>\n' }}
{%- for tr in m.content -%}
  {%- if tr is mapping and tr.type is defined -%}
    {%- set t = tr.type | lower -%}
    {%- if t == 'text' and tr.text is defined -%}
{{ tr.text }}
    {%- elif t in ['image', 'image_url'] -%}
<|begin_of_image|><|image|><|end_of_image|>
    {%- elif t in ['video', 'video_url'] -%}
<|begin_of_video|><|video|><|end_of_video|>
    {%- else -%}
{{ tr | tojson(ensure_ascii=False) }}
    {%- endif -%}
  {%- else -%}
{{ tr.output if tr.output is defined else tr }}
  {%- endif -%}
{%- endfor -%}
{{- '\n</tool_response>' }}
{%- else -%}
<|observation|>{% for tr in m.content %}

<tool_response>
{{ tr.output if tr.output is defined else tr }}
</tool_response>{% endfor -%}
{% endif -%}
{# ====== 逻辑结束 ====== #}
{%- elif m.role == 'system' -%}
<|system|>
{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|assistant|>
{{'<think></think>\n' if (enable_thinking is defined and not enable_thinking) else ''}}
{%- endif -%}"""


#: Each family's template variants, the default first (``build_tiny_vlm(..., variant=)``).
TEMPLATE_VARIANTS: dict[str, dict[str, str]] = {
    # Qwen3-VL: "reasoning" is Qwen3-VL-*-Thinking's template (a thought opened in the
    # generation prompt, earlier reasoning dropped on a new query), the default; "instruct"
    # Qwen3-VL-*-Instruct's (Qwen3-VL-MoE's default); both golden-checked
    "qwen3_vl": {"reasoning": QWEN3_VL_TEMPLATE, "instruct": QWEN3_VL_INSTRUCT_TEMPLATE},
    "qwen3_vl_moe": {"instruct": QWEN3_VL_INSTRUCT_TEMPLATE, "reasoning": QWEN3_VL_TEMPLATE},
    "qwen3_5": {name: _qwen3_5_template(name) for name in _QWEN3_5_VARIANTS},
    # the Qwen3.5 / 3.6 MoE checkpoints are the large ones: thinking by default
    "qwen3_5_moe": {
        name: _qwen3_5_template(name) for name in ("think", "nothink", "qwen3.6", "qwen3.8")
    },
    "gemma4": {name: _gemma4_template(name) for name in _GEMMA4_VARIANTS},
    # GLM-4.6V's two checkpoints render alike (Flash's template is GLM-4.6V's less one Jinja
    # comment): the variants differ by architecture, "flash" (GLM-4.6V-Flash's dense
    # ``glm4v``, the default) and "moe" (GLM-4.6V's ``glm4v_moe``, routed experts)
    "glm46v": {"flash": GLM46V_TEMPLATE, "moe": GLM46V_TEMPLATE},
}


def chat_template(family: str, variant: str | None = None) -> str:
    """The tiny checkpoints' chat template of ``family``.

    Args:
        family: A ``model_type``.
        variant: One of ``TEMPLATE_VARIANTS[family]`` where the family has several (None:
            its default, the first).
    """
    variants = TEMPLATE_VARIANTS.get(family)
    if variants is None:
        if variant is not None:
            raise ValueError(f"{family} has one chat template; variant={variant!r} is not one")
        return CHAT_TEMPLATES[family]
    if variant is None:
        return next(iter(variants.values()))
    if variant not in variants:
        raise ValueError(
            f"{family} has no template variant {variant!r}; choose one of {', '.join(variants)}"
        )
    return variants[variant]


CHAT_TEMPLATES = {
    "qwen2_vl": QWEN2_VL_TEMPLATE,
    "qwen2_5_vl": QWEN2_VL_TEMPLATE,
    "qwen3_vl": QWEN3_VL_TEMPLATE,
    "gemma3": GEMMA3_TEMPLATE,
    "smolvlm": SMOLVLM_TEMPLATE,
    "llava_onevision": LLAVA_ONEVISION_TEMPLATE,
    "qwen3_5": QWEN3_5_TEMPLATE,
    "gemma4": TEMPLATE_VARIANTS["gemma4"]["8995379"],
    "qwen3_vl_moe": QWEN3_VL_INSTRUCT_TEMPLATE,
    "qwen3_5_moe": TEMPLATE_VARIANTS["qwen3_5_moe"]["think"],
    "llava_next": LLAVA_NEXT_TEMPLATE,
    "internvl": INTERNVL_TEMPLATE,
    "lfm2_vl": LFM2_VL_TEMPLATE,
    "kimi_k25": KIMI_K25_TEMPLATE,
    "glm46v": GLM46V_TEMPLATE,
}
