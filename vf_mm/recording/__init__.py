"""Recording: agent code written against the OpenAI SDK, its calls recorded as exact trajectories.

``Recorder(client)`` groups chat calls into sessions and runs each call as one model
turn through a ``RendererClient`` (bridged onto the session's previous turn), recording
it as a ``TrajectoryStep``. ``openai_client(recorder, session_id=...)`` gives Python code
an ``openai.AsyncOpenAI`` that reaches the recorder in process, with no network or
server; ``vf-mm serve --record DIR`` serves the same over HTTP, sessions named by the
``X-Session-ID`` header (else the request's ``user``), each ended session written to
DIR as a results row and a trainer group.
"""

from vf_mm.recording._openai import RECORDING_BASE_URL, openai_client
from vf_mm.recording._recorder import RecordedSession, Recorder

__all__ = ["RECORDING_BASE_URL", "RecordedSession", "Recorder", "openai_client"]
