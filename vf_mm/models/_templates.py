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

Qwen3-VL follows Qwen3:

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

Qwen3.5 (``Qwen/Qwen3.5-0.8B``):

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
  else an empty think block, as the generation prompt.

LLaVA-OneVision (``llava-hf/llava-onevision-qwen2-*-ov-hf``):

- each message as ``<|im_start|>{role} `` (a space, not a newline), then all its images
  as ``<image>`` (whatever their position among the parts), then each text part as
  ``\\n`` + text, then ``<|im_end|>`` (no newline after it);
- content must be a list of parts (a string's text is not rendered);
- ``<|im_start|>assistant\\n`` as the generation prompt, while an assistant turn in the
  history is ``<|im_start|>assistant \\n`` + text: the template is not prefix-stable, so
  every turn is rendered in full (the bridge says so and declines).
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

QWEN3_VL_TEMPLATE = r"""
{%- set seen = namespace(images=0, videos=0) -%}
{%- macro show(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is none -%}
    {%- else -%}
        {%- for part in content -%}
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
{%- endmacro -%}
{%- macro text_only(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is not none -%}
        {%- for part in content -%}{%- if 'text' in part -%}{{- part['text'] -}}{%- endif -%}{%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0]['role'] == 'system' -%}
        {{- show(messages[0]['content']) + '\n\n' -}}
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
    {{- '<|im_start|>system\n' + show(messages[0]['content']) + '<|im_end|>\n' -}}
{%- endif -%}
{%- set state = namespace(searching=true, last_query=messages|length - 1) -%}
{%- for message in messages[::-1] -%}
    {%- set index = (messages|length - 1) - loop.index0 -%}
    {%- if state.searching and message['role'] == 'user' -%}
        {%- set plain = text_only(message['content']) -%}
        {%- if not (plain.startswith('<tool_response>') and plain.endswith('</tool_response>')) -%}
            {%- set state.searching = false -%}
            {%- set state.last_query = index -%}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
    {%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) -%}
        {{- '<|im_start|>' + message['role'] + '\n' + show(message['content']) + '<|im_end|>\n' -}}
    {%- elif message['role'] == 'assistant' -%}
        {%- set body = text_only(message['content']) -%}
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
        {{- '\n<tool_response>\n' + show(message['content']) + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}
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

QWEN3_5_TEMPLATE = r"""
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
{%- if tools and tools is iterable and tools is not mapping -%}
    {{- '<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>' -}}
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
    {{- '<|im_start|>system\n' + (show(messages[0].content, false, true) | trim) + '<|im_end|>\n' -}}
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
        {%- elif '</think>' in body -%}
            {%- set thought = body.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set body = body.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {%- if loop.index0 > state.last_query -%}
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
                {%- if fn.arguments is defined -%}
                    {%- for name, value in fn.arguments | items -%}
                        {{- '<parameter=' + name + '>\n' -}}
                        {%- if value is mapping or (value is sequence and value is not string) -%}
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
    {%- if enable_thinking is defined and enable_thinking is true -%}
        {{- '<think>\n' -}}
    {%- else -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}
"""

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

CHAT_TEMPLATES = {
    "qwen2_vl": QWEN2_VL_TEMPLATE,
    "qwen2_5_vl": QWEN2_VL_TEMPLATE,
    "qwen3_vl": QWEN3_VL_TEMPLATE,
    "gemma3": GEMMA3_TEMPLATE,
    "smolvlm": SMOLVLM_TEMPLATE,
    "llava_onevision": LLAVA_ONEVISION_TEMPLATE,
    "qwen3_5": QWEN3_5_TEMPLATE,
}
