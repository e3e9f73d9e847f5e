"""``GET /metrics`` of ``vf-mm serve``: the backend's prefix-cache counters in Prometheus'
text format, byte for byte as vLLM 0.32 (through prometheus_client 0.26) writes them, then
the embedded engine's own counters under the ``vf_mm:`` prefix."""

from __future__ import annotations

import asyncio

import pytest
from starlette.testclient import TestClient

from vf_mm.inference import LocalBackend, create_app
from vf_mm.inference._server import _sample_value
from vf_mm.renderers import load_renderer


@pytest.fixture(scope="module")
def served(tiny_vlm_checkpoint):
    backend = LocalBackend(tiny_vlm_checkpoint, batch_window_ms=1)
    renderer = load_renderer(tiny_vlm_checkpoint)
    with TestClient(create_app(backend, renderer=renderer, model_name='my "tiny"')) as client:
        yield client, backend, renderer
    asyncio.run(backend.aclose())


def generate(client, token_ids: list[int]) -> None:
    body = {"model": 'my "tiny"', "token_ids": token_ids,
            "sampling_params": {"max_tokens": 3, "temperature": 0}}  # fmt: skip
    response = client.post("/inference/v1/generate", json=body)
    assert response.status_code == 200, response.text


def test_metrics_publish_the_prefix_cache_counters_as_vllm_does(served):
    client, backend, renderer = served
    prompt = list(renderer.render([{"role": "user", "content": "a question " * 20}]).token_ids)
    generate(client, prompt)
    generate(client, prompt)  # the same prompt again: all but its last token cached
    assert backend.prefix_cache_hits >= len(prompt) - 1

    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    labels = 'engine="0",model_name="my \\"tiny\\""'
    created = next(
        line.rsplit(" ", 1)[1]
        for line in response.text.splitlines()
        if line.startswith("vllm:prefix_cache_queries_created{")
    )
    queries = "Prefix cache queries, in terms of number of queried tokens."
    hits = "Prefix cache hits, in terms of number of cached tokens."
    vllm, _, ours = response.text.partition("# HELP vf_mm:")
    assert vllm == (
        f"# HELP vllm:prefix_cache_queries_total {queries}\n"
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        f"vllm:prefix_cache_queries_total{{{labels}}} {float(backend.prefix_cache_queries)}\n"
        f"# HELP vllm:prefix_cache_queries_created {queries}\n"
        "# TYPE vllm:prefix_cache_queries_created gauge\n"
        f"vllm:prefix_cache_queries_created{{{labels}}} {created}\n"
        f"# HELP vllm:prefix_cache_hits_total {hits}\n"
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        f"vllm:prefix_cache_hits_total{{{labels}}} {float(backend.prefix_cache_hits)}\n"
        f"# HELP vllm:prefix_cache_hits_created {hits}\n"
        "# TYPE vllm:prefix_cache_hits_created gauge\n"
        f"vllm:prefix_cache_hits_created{{{labels}}} {created}\n"
    )
    assert float(created) == pytest.approx(client.app.state.server.created_at)
    assert ours  # the engine's own counters follow, under their own prefix


def test_metrics_publish_the_engines_own_counters(served):
    client, backend, renderer = served
    prompt = list(renderer.render([{"role": "user", "content": "count me"}]).token_ids)
    generate(client, prompt)
    # the engine's thread adds a batch's busy time after answering it, so the scrape is
    # held to the backend's values read just before and just after it
    published = {
        "vf_mm:admissions_total": "batches_run",
        "vf_mm:prefills_total": "prefills_run",
        "vf_mm:decode_steps_total": "steps_run",
        "vf_mm:engine_busy_seconds_total": "busy_s",
        "vf_mm:requests_total": "requests_answered",
        "vf_mm:request_seconds_total": "request_s",
    }
    before = {name: getattr(backend, attr) for name, attr in published.items()}
    text = client.get("/metrics").text
    after = {name: getattr(backend, attr) for name, attr in published.items()}
    ours = text[text.index("# HELP vf_mm:") :].splitlines()
    assert all(line.startswith(("# HELP vf_mm:", "# TYPE vf_mm:", "vf_mm:")) for line in ours)
    values = {
        line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in ours
        if not line.startswith("#")
    }
    assert {name for name in values if name.endswith("_total")} == set(published)
    for name in published:
        assert before[name] <= values[name] <= after[name], name
    assert values["vf_mm:admissions_total"] >= 1 and values["vf_mm:prefills_total"] >= 1
    assert values["vf_mm:decode_steps_total"] >= 2  # 3 tokens each
    assert values["vf_mm:requests_total"] >= 1
    assert values["vf_mm:engine_busy_seconds_total"] > 0
    assert values["vf_mm:request_seconds_total"] > 0
    assert "# TYPE vf_mm:requests_total counter" in ours


def test_counters_only_grow(served):
    client, _backend, renderer = served

    def values() -> dict[str, float]:
        lines = client.get("/metrics").text.splitlines()
        return {
            line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in lines
            if line.startswith("vllm:") and "_total{" in line
        }

    before = values()
    generate(client, list(renderer.render([{"role": "user", "content": "other"}]).token_ids))
    after = values()
    assert after["vllm:prefix_cache_queries_total"] > before["vllm:prefix_cache_queries_total"]
    assert after["vllm:prefix_cache_hits_total"] >= before["vllm:prefix_cache_hits_total"]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0.0"),
        (12, "12.0"),
        (123456, "123456.0"),
        (1234567, "1.234567e+06"),
        (10_000_000, "1e+07"),
        (1795492836.0975246, "1.7954928360975246e+09"),
        (12345678901, "1.2345678901e+10"),
    ],
)
def test_sample_values_are_written_as_prometheus_client_writes_them(value, text):
    # expected strings: prometheus_client 0.26's floatToGoString on the same values
    assert _sample_value(value) == text
