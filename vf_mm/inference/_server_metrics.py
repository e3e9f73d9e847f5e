"""``GET /metrics`` of ``vf-mm serve``: the backend's prefix-cache counters in Prometheus'
text format, as vLLM 0.32 publishes them.

``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (prompt tokens
looked up and found cached), each with its ``_created`` series (the server's start) and
the ``engine`` / ``model_name`` labels, written byte for byte as prometheus_client
writes them, so a dashboard or scraper made for vLLM reads them unchanged. A backend
without the counters reads 0.

The embedded engine's own counters follow under the ``vf_mm:`` prefix, in the same form:
``vf_mm:admissions_total`` (groups of requests started together),
``vf_mm:prefills_total`` (prefill forwards), ``vf_mm:decode_steps_total`` (decode
forwards, one token for every running request each) and
``vf_mm:engine_busy_seconds_total`` (time the engine spent generating),
``vf_mm:requests_total`` and ``vf_mm:request_seconds_total`` (requests answered, and
their time from the engine's queue to the answer, summed). Decode steps per
sampled token tell how well requests share batches: when clients' requests arrive out of
step, the same tokens take more steps. A backend without them (a scripted one) writes
none of these.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from vf_mm.inference._server_engine import ServerEngine

__all__ = ["MetricsRoute", "sample_value"]

# vLLM 0.32's counters (vllm/v1/metrics/loggers.py, PrometheusStatLogger): the name given
# to prometheus_client (which adds the _total and _created series), the help text, and
# the backend attribute that holds the count
_METRICS = (
    ("vllm:prefix_cache_queries",
     "Prefix cache queries, in terms of number of queried tokens.", "prefix_cache_queries"),
    ("vllm:prefix_cache_hits",
     "Prefix cache hits, in terms of number of cached tokens.", "prefix_cache_hits"),
)  # fmt: skip
# the embedded engine's counters (LocalBackend's properties), written only where the
# backend has them
_ENGINE_METRICS = (
    ("vf_mm:admissions", "Groups of requests started together.", "batches_run"),
    ("vf_mm:prefills", "Prefill forwards.", "prefills_run"),
    ("vf_mm:decode_steps",
     "Decode forwards (one token for every running request each).", "steps_run"),
    ("vf_mm:engine_busy_seconds", "Seconds the engine spent generating.", "busy_s"),
    ("vf_mm:requests", "Requests the engine answered or failed.", "requests_answered"),
    ("vf_mm:request_seconds",
     "Seconds from the engine's queue to the answer, summed over requests.", "request_s"),
)  # fmt: skip
# what prometheus_client answers a scrape that asks for no particular format
_PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class MetricsRoute:
    """The handler of ``GET /metrics`` (see the module docstring)."""

    def __init__(self, engine: ServerEngine) -> None:
        self.engine = engine

    async def __call__(self, request: Request) -> Response:
        engine = self.engine
        labels = f'engine="0",model_name="{_label_value(engine.model_name)}"'
        lines = []
        backend = engine.backend
        counters = [(name, text, getattr(backend, attr, 0)) for name, text, attr in _METRICS]
        counters += [
            (name, text, getattr(backend, attr))
            for name, text, attr in _ENGINE_METRICS
            if hasattr(backend, attr)
        ]
        for name, help_text, value in counters:
            lines += [
                f"# HELP {name}_total {help_text}",
                f"# TYPE {name}_total counter",
                f"{name}_total{{{labels}}} {sample_value(value)}",
                f"# HELP {name}_created {help_text}",
                f"# TYPE {name}_created gauge",
                f"{name}_created{{{labels}}} {sample_value(engine.created_at)}",
            ]
        return Response("\n".join(lines) + "\n", media_type=_PROMETHEUS_TEXT)


def _label_value(value: str) -> str:
    """A label value escaped as the text format wants (backslash, newline, quote)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def sample_value(value: float) -> str:
    """A sample as prometheus_client writes it: Python's shortest float, switched to an
    exponent (at least two digits) once the integer part has more than 6 digits, as Go
    does."""
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text
