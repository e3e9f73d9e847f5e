"""``Retry``, ``Routing``, ``Auth``: VLLMBackend's settings objects refuse a bad value
where it is written, naming the field and the fix; the backend takes them, and its older
keywords build them."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest

from vf_mm.errors import BackendHTTPError
from vf_mm.inference import Auth, GenerateRequest, Retry, Routing, SamplingParams, VLLMBackend


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: Retry(max_retries=-1), ValueError, r"max_retries must be an int >= 0.*0 tries once"),
        (lambda: Retry(max_retries=2.5), TypeError, r"Retry\(max_retries=2.5\)"),
        (lambda: Retry(max_retries=True), TypeError, "max_retries must be an int"),
        (lambda: Retry(backoff_s=-1), ValueError, r"Retry\(backoff_s=-1.0\): backoff_s must be .* >= 0"),
        (lambda: Retry(max_backoff_s=math.nan), ValueError, "max_backoff_s must be a number of seconds"),
        (lambda: Retry(backoff_s="1"), TypeError, "backoff_s must be a number of seconds"),
        (lambda: Routing(policy="hash"), ValueError, "routing policy must be one of sticky, least_outstanding, round_robin"),
        (lambda: Routing(shed_margin=0), ValueError, r"shed_margin must be an int >= 1 .*or None"),
        (lambda: Routing(shed_margin=2.0), ValueError, r"Routing\(shed_margin=2.0\)"),
        (lambda: Routing(session_idle_s=0), ValueError, r"session_idle_s must be .* > 0 \(math.inf"),
        (lambda: Auth(api_key=5), TypeError, "api_key must be a str, a sequence"),
        (lambda: Auth(api_key=["a", 5]), TypeError, r"api_key\[1\] must be a str or None"),
        (lambda: Auth(api_key="sk-1\n"), ValueError, "newline kept from a key file.*stripped"),
        (lambda: Auth(api_key=[None, " sk-2"]), ValueError, r"api_key\[1\] starts or ends with whitespace"),
    ],
)  # fmt: skip
def test_a_bad_setting_names_its_field_and_the_fix(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_settings_are_frozen_values_and_a_key_never_shows():
    assert Retry(backoff_s=1) == Retry(backoff_s=1.0) and isinstance(
        Retry(backoff_s=1).backoff_s, float
    )
    assert Routing("round_robin", None, math.inf).session_idle_s == math.inf
    with pytest.raises(AttributeError):
        Retry().max_retries = 5  # type: ignore[misc]
    auth = Auth(api_key=["sk-secret", None])
    assert auth.api_key == ("sk-secret", None)  # a list becomes a tuple: hashable, frozen
    assert "sk-secret" not in repr(auth) and "sk-secret" not in repr(Auth(api_key="sk-secret"))
    with pytest.raises(ValueError, match="2 API keys for 3 base URLs") as caught:
        VLLMBackend(["http://a:1", "http://b:1", "http://c:1"], auth=auth)
    assert "sk-secret" not in str(caught.value)


def test_keywords_build_the_settings_objects():
    backend = VLLMBackend("http://h", max_retries=5, backoff_s=0, routing="round_robin",
                          shed_margin=None, api_key="k")  # fmt: skip
    assert backend.retry == Retry(max_retries=5, backoff_s=0)
    assert backend.routing == Routing(policy="round_robin", shed_margin=None)
    assert backend.auth == Auth(api_key="k")
    assert backend.routing_stats["routing"] == "round_robin"
    with pytest.raises(ValueError, match=r"Retry\(max_retries=-1\)"):
        VLLMBackend("http://h", max_retries=-1)  # the keyword path checks the same way


def test_an_object_given_with_its_own_keywords_is_refused():
    with pytest.raises(TypeError, match=r"max_retries given with retry=Retry\(...\)"):
        VLLMBackend("http://h", retry=Retry(), max_retries=1)
    with pytest.raises(TypeError, match=r"shed_margin given with routing=Routing"):
        VLLMBackend("http://h", routing=Routing(), shed_margin=None)
    with pytest.raises(TypeError, match=r"api_key given with auth=Auth"):
        VLLMBackend("http://h", auth=Auth(api_key="a"), api_key="b")
    with pytest.raises(TypeError, match=r"retry must be a Retry\(...\) or None, not dict"):
        VLLMBackend("http://h", retry={"max_retries": 1})  # type: ignore[arg-type]


def test_the_backend_retries_and_authenticates_as_its_objects_say():
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(503, json={"error": {"message": "busy"}})

    async def attempts(retry: Retry) -> int:
        seen.clear()
        backend = VLLMBackend("http://a:8000", max_model_len=64, retry=retry,
                              auth=Auth(api_key="sk-1"), transport=httpx.MockTransport(handler))  # fmt: skip
        try:
            with pytest.raises(BackendHTTPError, match="503"):
                await backend.generate(GenerateRequest([1, 2], SamplingParams(max_tokens=1)))
        finally:
            await backend.aclose()
        return len(seen)

    assert asyncio.run(attempts(Retry(max_retries=0))) == 1
    assert asyncio.run(attempts(Retry(max_retries=2, backoff_s=0))) == 3
    assert set(seen) == {"Bearer sk-1"}
