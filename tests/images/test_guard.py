"""The SSRF guard's static checks: schemes, hosts, addresses, numeric spellings, paths."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from vf_mm.errors import ImageFetchError, UnsafeImageSourceError
from vf_mm.images import ImagePolicy
from vf_mm.images._guard import (
    check_addresses,
    check_http_url,
    check_local_path,
    file_url_to_path,
)
from vf_mm.images._internal import is_public_address

NET = ImagePolicy(allow_network=True)

NOT_PUBLIC = [
    "127.0.0.1",
    "127.255.255.254",
    "10.0.0.1",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "100.64.0.1",  # CGNAT
    "0.0.0.0",
    "0.1.2.3",
    "224.0.0.1",  # multicast
    "239.255.255.250",
    "240.0.0.1",  # reserved
    "255.255.255.255",
    "192.0.2.1",  # documentation
    "198.18.0.1",  # benchmarking
    "::1",
    "::",
    "fe80::1",
    "fc00::1",
    "fd00:ec2::254",  # AWS IPv6 metadata
    "ff02::1",
    "ff0e::1",  # global-scope multicast: still multicast
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "::127.0.0.1",  # IPv4-compatible
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "2001:db8::1",  # documentation
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    "64:ff9b:1::808:808",  # local-use NAT64
    "::8.8.8.8",  # IPv4-compatible, even of a public address
]
PUBLIC = ["93.184.216.34", "8.8.8.8", "1.1.1.1", "2606:2800:220:1:248:1893:25c8:1946"]


@pytest.mark.parametrize("text", NOT_PUBLIC)
def test_non_public_addresses(text):
    assert not is_public_address(ipaddress.ip_address(text))


@pytest.mark.parametrize("text", PUBLIC)
def test_public_addresses(text):
    assert is_public_address(ipaddress.ip_address(text))


def test_mapped_public_address_is_public():
    assert is_public_address(ipaddress.ip_address("::ffff:93.184.216.34"))
    assert is_public_address(ipaddress.ip_address("64:ff9b::5db8:d822"))  # NAT64 of 93.184.216.34


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/a.png",
        "http://localhost/a.png",
        "http://LOCALHOST./a.png",
        "http://foo.localhost/a.png",
        "http://[::1]/a.png",
        "http://[::ffff:127.0.0.1]/a.png",
        "http://[::ffff:7f00:1]/a.png",
        "http://[::ffff:a9fe:a9fe]/latest/meta-data/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.1.2.3/",
        "http://172.16.5.4/",
        "http://192.168.0.1/",
        "http://0.0.0.0/",
        "http://[fe80::1%25eth0]/",
        "http://[2606:2800:220:1::1%25eth0]/",  # zone index on a public address
        "http://2130706433/",  # decimal 127.0.0.1
        "http://0x7f000001/",  # hex
        "http://0x7f.1/",
        "http://0177.0.0.1/",  # octal
        "http://127.1/",  # short form
        "http://127.0.1/",
        "http://017700000001/",
        "http://1.2.3.4.5/",
        "http://93.184.216.034/",  # leading zero: octal to inet_aton, so not canonical
        "http://user:pw@example.com/a.png",
        "http://user@example.com/a.png",
        "http://example.com\\@evil.com/",
        "http://exa mple.com/",
        "http://ex%41mple.com/",
        "http:///a.png",
        "http://example.com:0/",
        "ftp://example.com/a.png",
        "file:///etc/passwd",
        "gopher://example.com/",
    ],
)
def test_refused_without_dns(url):
    with pytest.raises(UnsafeImageSourceError):
        check_http_url(url, NET)


def test_every_http_url_is_refused_when_network_is_off():
    with pytest.raises(UnsafeImageSourceError, match="network access is off"):
        check_http_url("https://example.com/a.png", ImagePolicy())


def test_allowed_public_urls():
    target = check_http_url("https://Example.COM./a.png?x=1", NET)
    assert (target.host, target.port, target.address) == ("example.com", 443, None)
    literal = check_http_url("http://93.184.216.34:8080/a.png", NET)
    assert literal.address == ipaddress.ip_address("93.184.216.34")
    assert literal.port == 8080
    v6 = check_http_url("http://[2606:2800:220:1::1]/", NET)
    assert v6.address == ipaddress.ip_address("2606:2800:220:1::1")
    idn = check_http_url("http://bücher.example/", NET)
    assert idn.host == "xn--bcher-kva.example"


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("example.com", True),
        ("cdn.example.com", True),
        ("a.b.example.com", True),
        ("evilexample.com", False),
        ("example.com.evil.net", False),
        ("example.org", False),
        ("com", False),
    ],
)
def test_allowed_domains_are_the_domain_and_its_subdomains(host, allowed):
    policy = ImagePolicy(allow_network=True, allowed_domains=("example.com",))
    if allowed:
        assert check_http_url(f"https://{host}/a.png", policy).host == host
    else:
        with pytest.raises(UnsafeImageSourceError, match="allowed_domains"):
            check_http_url(f"https://{host}/a.png", policy)


def test_allowed_domains_does_not_let_a_private_literal_through():
    policy = ImagePolicy(allow_network=True, allowed_domains=("127.0.0.1",))
    with pytest.raises(UnsafeImageSourceError, match="not a public address"):
        check_http_url("http://127.0.0.1/", policy)


def test_resolved_addresses_must_all_be_public():
    assert check_addresses("example.com", ["93.184.216.34", "93.184.216.34"]) == [
        ipaddress.ip_address("93.184.216.34")
    ]
    for bad in (["10.0.0.1"], ["93.184.216.34", "127.0.0.1"], ["::ffff:169.254.169.254"]):
        with pytest.raises(UnsafeImageSourceError, match="resolves to"):
            check_addresses("example.com", bad)
    with pytest.raises(ImageFetchError, match="no address"):
        check_addresses("example.com", [])
    with pytest.raises(ImageFetchError, match="not an IP address"):
        check_addresses("example.com", ["example.net"])


def test_file_urls():
    assert file_url_to_path("file:///tmp/a%20b.png") == Path("/tmp/a b.png")
    assert file_url_to_path("file://localhost/tmp/a.png") == Path("/tmp/a.png")
    with pytest.raises(UnsafeImageSourceError, match="host"):
        file_url_to_path("file://fileserver/share/a.png")
    with pytest.raises(UnsafeImageSourceError):
        file_url_to_path("file:///tmp/a.png?x=1")


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    inside = root / "sub" / "a.png"
    inside.write_bytes(b"x")
    outside = tmp_path / "secret.png"
    outside.write_bytes(b"x")
    (root / "escape.png").symlink_to(outside)
    (root / "escape_dir").symlink_to(tmp_path)
    (root / "inner_link.png").symlink_to(inside)
    return {"root": root, "inside": inside, "outside": outside}


def test_paths_inside_the_roots_are_allowed_and_resolved(tree):
    policy = ImagePolicy(local_roots=(tree["root"],))
    assert check_local_path(tree["inside"], policy) == tree["inside"].resolve()
    assert check_local_path(str(tree["root"] / "sub" / ".." / "sub" / "a.png"), policy) == (
        tree["inside"].resolve()
    )
    # a symlink that stays inside is fine, and the real file is what gets opened
    assert check_local_path(tree["root"] / "inner_link.png", policy) == tree["inside"].resolve()


@pytest.mark.parametrize(
    "relative",
    ["../secret.png", "sub/../../secret.png", "escape.png", "escape_dir/secret.png", "/etc/passwd"],
)
def test_paths_leaving_the_roots_are_refused(tree, relative):
    policy = ImagePolicy(local_roots=(tree["root"],))
    with pytest.raises(UnsafeImageSourceError, match="outside local_roots"):
        check_local_path(str(tree["root"] / relative), policy)


def test_a_missing_file_outside_the_roots_is_refused_not_reported_missing(tree):
    policy = ImagePolicy(local_roots=(tree["root"],))
    with pytest.raises(UnsafeImageSourceError):
        check_local_path(tree["root"] / ".." / "nope.png", policy)
    with pytest.raises(ImageFetchError, match="no such file"):
        check_local_path(tree["root"] / "nope.png", policy)


def test_empty_roots_allow_no_path_and_no_roots_allow_any(tree):
    with pytest.raises(UnsafeImageSourceError, match="not read"):
        check_local_path(tree["inside"], ImagePolicy(local_roots=()))
    assert check_local_path(tree["outside"], ImagePolicy()) == tree["outside"]


def test_a_root_that_is_a_prefix_string_is_not_a_parent(tmp_path: Path):
    (tmp_path / "data").mkdir()
    sibling = tmp_path / "data-private"
    sibling.mkdir()
    (sibling / "a.png").write_bytes(b"x")
    with pytest.raises(UnsafeImageSourceError):
        check_local_path(sibling / "a.png", ImagePolicy(local_roots=(tmp_path / "data",)))


def test_nul_in_path_is_refused():
    with pytest.raises(UnsafeImageSourceError):
        check_local_path("a\x00.png", ImagePolicy())
