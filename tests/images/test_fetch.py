"""Fetching over http(s) through the guard, with ``httpx.MockTransport`` and a fake
resolver: refusals happen before any request, allowed fetches are pinned and capped."""

from __future__ import annotations

import contextlib
import gzip
import ipaddress
import itertools
import socket
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vf_mm.errors import (
    ImageDecodeError,
    ImageError,
    ImageFetchError,
    UnsafeImageSourceError,
)
from vf_mm.images import (
    Fetcher,
    ImagePolicy,
    load_image,
)
from vf_mm.images._internal import system_resolver

from ._make import PUBLIC_IP, FakeResolver, Recorder, fetcher, gradient, pixels, png_bytes, serving

NET = ImagePolicy(allow_network=True)
PNG = png_bytes()


def redirect(to: str, status: int = 302) -> httpx.Response:
    return httpx.Response(status, headers={"Location": to})


# -- allowed fetches ----------------------------------------------------------------


def test_a_public_url_loads_and_the_connection_is_pinned_to_the_checked_address():
    handler = serving(PNG, **{"Content-Type": "image/png"})
    resolver = FakeResolver({"example.com": [PUBLIC_IP]})
    image = load_image(
        "https://example.com/img/a.png?v=1", policy=NET, fetcher=fetcher(handler, resolver)
    )
    assert (pixels(image) == pixels(gradient())).all()
    assert resolver.calls == [("example.com", 443)]
    (request,) = handler.requests
    assert request.url.host == PUBLIC_IP  # the address we checked, not the name
    assert request.url.scheme == "https"
    assert request.url.raw_path == b"/img/a.png?v=1"
    assert request.headers["host"] == "example.com"
    assert request.extensions["sni_hostname"] == "example.com"  # TLS still checks the name
    assert request.headers["accept-encoding"] == "identity"


def test_a_non_default_port_goes_in_the_host_header():
    handler = serving(PNG)
    load_image("http://example.com:8080/a.png", policy=NET, fetcher=fetcher(handler))
    (request,) = handler.requests
    assert request.url.port == 8080
    assert request.headers["host"] == "example.com:8080"
    assert "sni_hostname" not in request.extensions  # plain http


def test_a_public_ipv6_literal_is_fetched():
    handler = serving(PNG)
    load_image("http://[2606:2800:220:1::1]/a.png", policy=NET, fetcher=fetcher(handler))
    assert handler.hosts == ["2606:2800:220:1::1"]


def test_dns_is_asked_once_per_hop_so_a_rebinding_answer_is_never_used():
    answers = iter([[PUBLIC_IP], ["127.0.0.1"], ["127.0.0.1"]])
    calls = []

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return next(answers)

    handler = serving(PNG)
    load_image(
        "http://example.com/a.png",
        policy=NET,
        fetcher=Fetcher(transport=httpx.MockTransport(handler), resolver=rebinding),
    )
    assert calls == ["example.com"]
    assert handler.hosts == [PUBLIC_IP]


def test_allowed_domains_let_subdomains_through():
    handler = serving(PNG)
    resolver = FakeResolver({"cdn.example.com": ["93.184.216.35"]})
    policy = ImagePolicy(allow_network=True, allowed_domains=("example.com",))
    load_image("https://cdn.example.com/a.png", policy=policy, fetcher=fetcher(handler, resolver))
    assert handler.hosts == ["93.184.216.35"]


# -- refusals before any request --------------------------------------------------


FIRST_HOP_REFUSALS = [
    "http://127.0.0.1/a.png",
    "http://localhost/a.png",
    "http://[::1]/a.png",
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://10.0.0.1/a.png",
    "http://172.16.0.1/a.png",
    "http://172.31.1.1/a.png",
    "http://192.168.1.10/a.png",
    "http://0.0.0.0/a.png",
    "http://[::ffff:127.0.0.1]/a.png",
    "http://[::ffff:169.254.169.254]/a.png",
    "http://2130706433/a.png",
    "http://0x7f.1/a.png",
    "http://0x7f000001/a.png",
    "http://127.1/a.png",
    "http://user:pass@example.com/a.png",
    "ftp://example.com/a.png",
]


@pytest.mark.parametrize("url", FIRST_HOP_REFUSALS)
def test_unsafe_urls_are_refused_with_no_request_and_no_dns(url):
    handler = serving(PNG)
    resolver = FakeResolver({"example.com": [PUBLIC_IP], "localhost": ["127.0.0.1"]})
    with pytest.raises(UnsafeImageSourceError):
        load_image(url, policy=NET, fetcher=fetcher(handler, resolver))
    assert handler.requests == []
    assert resolver.calls == []


@pytest.mark.parametrize(
    "answer",
    [
        ["10.0.0.7"],
        ["169.254.169.254"],
        ["127.0.0.1"],
        ["::1"],
        ["::ffff:192.168.0.1"],
        [PUBLIC_IP, "192.168.0.1"],  # one bad answer among good ones
    ],
)
def test_a_public_looking_name_that_resolves_privately_is_refused(answer):
    handler = serving(PNG)
    resolver = FakeResolver({"images.example.com": answer})
    with pytest.raises(UnsafeImageSourceError, match="resolves to"):
        load_image(
            "https://images.example.com/a.png", policy=NET, fetcher=fetcher(handler, resolver)
        )
    assert resolver.calls == [("images.example.com", 443)]
    assert handler.requests == []


def test_network_off_refuses_before_dns_or_connection():
    handler = serving(PNG)
    resolver = FakeResolver({"example.com": [PUBLIC_IP]})
    with pytest.raises(UnsafeImageSourceError, match="network access is off"):
        load_image("https://example.com/a.png", fetcher=fetcher(handler, resolver))
    assert handler.requests == [] and resolver.calls == []


def test_a_host_outside_allowed_domains_is_refused_before_dns():
    handler = serving(PNG)
    resolver = FakeResolver({"evil.com": [PUBLIC_IP]})
    policy = ImagePolicy(allow_network=True, allowed_domains=("example.com",))
    with pytest.raises(UnsafeImageSourceError, match="allowed_domains"):
        load_image("https://evil.com/a.png", policy=policy, fetcher=fetcher(handler, resolver))
    assert handler.requests == [] and resolver.calls == []


def test_the_default_fetcher_refuses_before_touching_the_network():
    # conftest makes DNS and connect raise AssertionError: a refusal must come first
    with pytest.raises(UnsafeImageSourceError):
        load_image("http://169.254.169.254/latest/meta-data/", policy=NET)
    with pytest.raises(UnsafeImageSourceError):
        load_image(
            "https://evil.com/a.png",
            policy=NET.replace(allowed_domains=("example.com",)),
        )


# -- redirects ----------------------------------------------------------------------


def _redirecting(first_to: str) -> Recorder:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.headers["host"] == "example.com" and request.url.path == "/a.png":
            return redirect(first_to)
        return httpx.Response(200, content=PNG)

    return Recorder(answer)


@pytest.mark.parametrize(
    "target",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/latest/meta-data/",
        "http://127.0.0.1:8080/admin",
        "http://2852039166/latest/meta-data/",  # 169.254.169.254 in decimal
        "http://localhost/",
        "file:///etc/passwd",
        "gopher://example.com/",
        "http://user:pw@example.com/b.png",
    ],
)
def test_a_redirect_into_a_refused_target_is_not_followed(target):
    handler = _redirecting(target)
    with pytest.raises(UnsafeImageSourceError, match="redirect 1 to"):
        load_image("http://example.com/a.png", policy=NET, fetcher=fetcher(handler))
    assert len(handler.requests) == 1  # only the allowed first hop
    assert handler.hosts == [PUBLIC_IP]


def test_a_redirect_to_a_name_resolving_privately_is_not_followed():
    handler = _redirecting("http://internal.example.com/x.png")
    resolver = FakeResolver({"example.com": [PUBLIC_IP], "internal.example.com": ["10.1.2.3"]})
    with pytest.raises(UnsafeImageSourceError, match=r"redirect 1 to .* resolves to 10\.1\.2\.3"):
        load_image("http://example.com/a.png", policy=NET, fetcher=fetcher(handler, resolver))
    assert handler.hosts == [PUBLIC_IP]
    assert resolver.calls[-1] == ("internal.example.com", 80)


def test_a_redirect_outside_allowed_domains_is_not_followed():
    handler = _redirecting("https://evil.com/a.png")
    resolver = FakeResolver({"example.com": [PUBLIC_IP], "evil.com": ["93.184.216.99"]})
    policy = ImagePolicy(allow_network=True, allowed_domains=("example.com",))
    with pytest.raises(UnsafeImageSourceError, match="allowed_domains"):
        load_image("http://example.com/a.png", policy=policy, fetcher=fetcher(handler, resolver))
    assert len(handler.requests) == 1
    assert ("evil.com", 443) not in resolver.calls


def test_allowed_redirects_are_followed_and_each_hop_is_resolved_and_pinned():
    handler = _redirecting("https://cdn.example.com/b.png")
    resolver = FakeResolver({"example.com": [PUBLIC_IP], "cdn.example.com": ["93.184.216.35"]})
    image = load_image("http://example.com/a.png", policy=NET, fetcher=fetcher(handler, resolver))
    assert image.size == gradient().size
    assert handler.hosts == [PUBLIC_IP, "93.184.216.35"]
    assert handler.requests[1].headers["host"] == "cdn.example.com"
    assert handler.requests[1].extensions["sni_hostname"] == "cdn.example.com"


def test_a_relative_redirect_resolves_against_the_host_name_not_the_address():
    handler = _redirecting("/b.png")
    load_image("http://example.com/a.png", policy=NET, fetcher=fetcher(handler))
    assert [r.url.path for r in handler.requests] == ["/a.png", "/b.png"]
    assert [r.headers["host"] for r in handler.requests] == ["example.com", "example.com"]


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_redirects_are_capped(limit):
    handler = Recorder(lambda request: redirect(f"/hop{len(handler.requests)}"))
    with pytest.raises(ImageFetchError, match="redirects"):
        load_image(
            "http://example.com/a.png",
            policy=NET.replace(max_redirects=limit),
            fetcher=fetcher(handler),
        )
    assert len(handler.requests) == limit + 1


def test_a_redirect_without_location_is_an_error():
    handler = Recorder(lambda request: httpx.Response(302))
    with pytest.raises(ImageFetchError, match="without a Location") as info:
        load_image("http://example.com/a.png", policy=NET, fetcher=fetcher(handler))
    assert info.value.status == 302


# -- responses that fail ----------------------------------------------------------


def test_http_404_is_a_fetch_error_naming_the_status_source_and_place():
    handler = Recorder(lambda request: httpx.Response(404, content=b"<html>nope</html>"))
    with pytest.raises(ImageFetchError) as info:
        load_image(
            "https://example.com/a.png?X-Amz-Signature=SECRET123",
            policy=NET,
            fetcher=fetcher(handler),
            where="message 2, part 1",
        )
    exc = info.value
    assert exc.status == 404
    text = str(exc)
    assert "404" in text
    assert "https://example.com/a.png" in text
    assert "message 2, part 1" in text
    assert "SECRET123" not in text  # query strings (signed URLs) are not repeated


@pytest.mark.parametrize("status", [500, 403, 204])
def test_other_statuses(status):
    handler = Recorder(lambda request: httpx.Response(status))
    with pytest.raises(ImageError):
        load_image("http://example.com/a.png", policy=NET, fetcher=fetcher(handler))


def test_content_length_over_max_bytes_is_refused_before_reading_the_body():
    pulled = []

    def body():
        for i in itertools.count():
            pulled.append(i)
            yield b"x" * 1024

    handler = Recorder(
        lambda request: httpx.Response(200, content=body(), headers={"Content-Length": "5000"})
    )
    with pytest.raises(ImageFetchError, match="Content-Length 5000 is over max_bytes=4096"):
        load_image(
            "http://example.com/a.png", policy=NET.replace(max_bytes=4096), fetcher=fetcher(handler)
        )
    assert pulled == []


def test_a_streamed_body_is_cut_off_at_max_bytes():
    pulled = []

    def endless():
        for i in itertools.count():
            pulled.append(i)
            yield b"x" * 1000

    handler = Recorder(lambda request: httpx.Response(200, content=endless()))
    with pytest.raises(ImageFetchError, match="over max_bytes=10000"):
        load_image(
            "http://example.com/a.png",
            policy=NET.replace(max_bytes=10_000),
            fetcher=fetcher(handler),
        )
    assert len(pulled) <= 80  # stopped soon after 10 kB, never read to the end


def test_a_body_exactly_at_max_bytes_is_accepted():
    handler = serving(PNG)
    image = load_image(
        "http://example.com/a.png", policy=NET.replace(max_bytes=len(PNG)), fetcher=fetcher(handler)
    )
    assert image.size == gradient().size


def test_a_timeout_is_a_fetch_error():
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(ImageFetchError, match="timed out"):
        load_image("http://example.com/a.png", policy=NET, fetcher=fetcher(Recorder(slow)))


def test_the_whole_fetch_has_one_deadline():
    def drip():
        for _ in range(1000):
            time.sleep(0.02)
            yield b"x"

    handler = Recorder(lambda request: httpx.Response(200, content=drip()))
    with pytest.raises(ImageFetchError, match="timed out"):
        load_image(
            "http://example.com/a.png", policy=NET.replace(timeout_s=0.15), fetcher=fetcher(handler)
        )


def test_the_request_carries_the_timeout():
    handler = serving(PNG)
    load_image(
        "http://example.com/a.png", policy=NET.replace(timeout_s=3), fetcher=fetcher(handler)
    )
    timeouts = handler.requests[0].extensions["timeout"]
    assert 0 < timeouts["connect"] <= 3 and 0 < timeouts["read"] <= 3


def test_connection_errors_are_fetch_errors():
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ImageFetchError, match="ConnectError"):
        load_image("http://example.com/a.png", policy=NET, fetcher=fetcher(Recorder(refused)))


def test_dns_failure_is_a_fetch_error():
    handler = serving(PNG)
    with pytest.raises(ImageFetchError, match="cannot resolve"):
        load_image("http://nowhere.example/a.png", policy=NET, fetcher=fetcher(handler))
    assert handler.requests == []


def test_an_encoded_body_is_refused():
    body = gzip.compress(PNG)
    handler = Recorder(
        lambda request: httpx.Response(
            200, content=iter([body]), headers={"Content-Encoding": "gzip"}
        )
    )
    with pytest.raises(ImageFetchError, match="Content-Encoding"):
        load_image("http://example.com/a.png", policy=NET, fetcher=fetcher(handler))


def test_an_html_page_served_as_the_image_is_a_decode_error():
    handler = serving(b"<!DOCTYPE html><html><body>login</body></html>")
    with pytest.raises(ImageDecodeError, match="HTML"):
        load_image("http://example.com/a.png", policy=NET, fetcher=fetcher(handler))


def test_system_resolver_uses_getaddrinfo(monkeypatch: pytest.MonkeyPatch):
    def fake(host, port, *args, **kwargs):
        assert (host, port) == ("example.com", 443)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC_IP, 443)),
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2606:2800:220:1::1", 443, 0, 0)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    assert system_resolver("example.com", 443) == [PUBLIC_IP, "2606:2800:220:1::1"]


# -- property: nothing reaches the transport unless the guard allowed it -----------


def _oracle_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Independent of the guard's code: a necessary condition for a public address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address in ipaddress.IPv6Network("64:ff9b::/96"):  # NAT64 (RFC 6052): the IPv4 inside
        address = ipaddress.IPv4Address(address.packed[-4:])
    return address.is_global and not (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )


def _ipv4_spellings(value: int) -> st.SearchStrategy[str]:
    a, b, c, d = value.to_bytes(4, "big")
    return st.sampled_from(
        [
            f"{a}.{b}.{c}.{d}",
            str(value),
            hex(value),
            f"0{a:o}.{b}.{c}.{d}",
            f"{a}.{(b << 16) | (c << 8) | d}",
            f"0x{a:02x}.0x{b:02x}.0x{c:02x}.0x{d:02x}",
        ]
    )


NAMES = [f"h{i}.test" for i in range(4)]
PUBLIC_V4 = [PUBLIC_IP, "8.8.8.8", "1.1.1.1"]
hosts = st.one_of(
    st.one_of(st.ip_addresses(v=4), st.sampled_from([ipaddress.IPv4Address(a) for a in PUBLIC_V4]))
    .map(int)
    .flatmap(_ipv4_spellings),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
    st.sampled_from([*NAMES, "localhost", "LocalHost.", "x.localhost", "evil.test"]),
    st.text("abcdefx0123456789.-:%@[]", min_size=1, max_size=20),
)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    scheme=st.sampled_from(["http"] * 3 + ["https"] * 3 + ["HTTP", "ftp", "file", "gopher"]),
    userinfo=st.sampled_from([""] * 6 + ["user:pw@", "@"]),
    host=hosts,
    port=st.sampled_from(["", "", "", ":80", ":8443", ":0"]),
    path=st.sampled_from(["/", "/a.png", "/a.png?x=1", ""]),
    answers=st.lists(
        st.lists(
            st.one_of(st.ip_addresses(), st.sampled_from(PUBLIC_V4).map(ipaddress.IPv4Address)),
            min_size=1,
            max_size=3,
        ),
        min_size=4,
        max_size=4,
    ),
)
def test_no_request_reaches_a_non_public_address(scheme, userinfo, host, port, path, answers):
    url = f"{scheme}://{userinfo}{host}{port}{path}"
    table = dict(zip(NAMES, [[str(a) for a in answer] for answer in answers], strict=True))
    resolver = FakeResolver(table)
    handler = serving(PNG)
    with contextlib.suppress(ImageError):  # anything else (a crash in the guard) fails
        load_image(url, policy=NET, fetcher=fetcher(handler, resolver))
    assert len(handler.requests) <= 1  # the handler never redirects
    for request in handler.requests:
        address = ipaddress.ip_address(request.url.host)
        assert _oracle_public(address), (url, address)
        name = request.headers["host"]
        name = name.rsplit(":", 1)[0] if not name.startswith("[") else name
        if name in table:  # pinned to an address the resolver gave for that name
            assert all(_oracle_public(ipaddress.ip_address(a)) for a in table[name]), url
            assert address in {ipaddress.ip_address(a) for a in table[name]}
    # and the guard is not refusing everything: a plain public dotted quad is fetched
    try:
        literal = ipaddress.IPv4Address(host)
    except ValueError:
        return
    if (
        scheme.lower() in ("http", "https")
        and not userinfo
        and port != ":0"
        and str(literal) == host
        and _oracle_public(literal)
    ):
        assert [r.url.host for r in handler.requests] == [host], url
