"""ImagePolicy: defaults, validation, normalisation, constructors."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest
from PIL import Image

from vf_mm.images import ImagePolicy
from vf_mm.images._internal import DEFAULT_FORMATS


def test_defaults_are_the_documented_ones():
    policy = ImagePolicy()
    assert policy.allow_network is False
    assert policy.allowed_domains == ()
    assert policy.local_roots is None
    assert policy.max_bytes == 32 * 1024 * 1024
    assert policy.max_redirects >= 0
    assert policy.timeout_s > 0
    assert policy.formats == DEFAULT_FORMATS


def test_default_pixel_limit_is_at_least_as_strict_as_pillows_bomb_limit():
    assert Image.MAX_IMAGE_PIXELS is not None
    assert ImagePolicy().max_pixels <= Image.MAX_IMAGE_PIXELS
    assert ImagePolicy().max_pixels >= 8192 * 8192  # large enough for real photos


def test_frozen_hashable_and_picklable():
    policy = ImagePolicy(allow_network=True, allowed_domains=("example.com",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.allow_network = False  # type: ignore[misc]
    assert hash(policy) == hash(ImagePolicy(allow_network=True, allowed_domains=("example.com",)))
    assert pickle.loads(pickle.dumps(policy)) == policy


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        (".example.com", "example.com"),
        ("bücher.example", "xn--bcher-kva.example"),
    ],
)
def test_domains_are_normalised_like_url_hosts(given, expected):
    assert ImagePolicy(allowed_domains=(given,)).allowed_domains == (expected,)


def test_a_single_domain_string_is_one_domain_not_characters():
    assert ImagePolicy(allowed_domains="example.com").allowed_domains == ("example.com",)


@pytest.mark.parametrize(
    "bad", ["https://example.com", "example.com/path", "user@example.com", "example.com:443", ""]
)
def test_urls_are_not_domains(bad):
    with pytest.raises(ValueError):
        ImagePolicy(allowed_domains=(bad,))


def test_local_roots_are_resolved_and_a_bare_root_is_one_root(tmp_path: Path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert ImagePolicy(local_roots=str(link)).local_roots == (real.resolve(),)
    assert ImagePolicy(local_roots=[tmp_path / "real" / ".."]).local_roots == (tmp_path.resolve(),)
    assert ImagePolicy(local_roots=()).local_roots == ()


@pytest.mark.parametrize(
    "changes",
    [
        {"max_bytes": 0},
        {"max_bytes": -1},
        {"max_pixels": 0},
        {"timeout_s": 0},
        {"max_redirects": -1},
        {"max_bytes": True},
        {"formats": ()},
    ],
)
def test_invalid_limits_are_refused(changes):
    with pytest.raises(ValueError):
        ImagePolicy(**changes)


def test_allow_network_must_be_a_bool():
    with pytest.raises(TypeError):
        ImagePolicy(allow_network="yes")  # type: ignore[arg-type]


def test_trusted_and_dataset_constructors(tmp_path: Path):
    trusted = ImagePolicy.trusted()
    assert trusted.allow_network and trusted.local_roots is None
    assert ImagePolicy.trusted(max_bytes=10).max_bytes == 10

    data = ImagePolicy.dataset(tmp_path)
    assert data.local_roots == (tmp_path.resolve(),)
    assert not data.allow_network
    assert ImagePolicy.dataset().local_roots == ()  # no local files at all
    web = ImagePolicy.dataset(allow_network=True, allowed_domains=["Example.com"])
    assert web.allow_network and web.allowed_domains == ("example.com",)


def test_replace_validates():
    policy = ImagePolicy()
    assert policy.replace(max_pixels=100).max_pixels == 100
    with pytest.raises(ValueError):
        policy.replace(max_pixels=0)


def test_formats_are_upper_cased():
    assert ImagePolicy(formats=("png", "jpeg")).formats == ("PNG", "JPEG")


def test_a_root_given_as_its_file_url_is_that_directory(tmp_path: Path):
    """A ``file:`` URL taken as a relative path would confine reads to a folder named
    ``file:``: it is the directory it names, read by the guard's own rules."""
    assert ImagePolicy(local_roots=[tmp_path.as_uri()]).local_roots == (tmp_path.resolve(),)
    assert ImagePolicy.dataset(roots=tmp_path.as_uri()).local_roots == (tmp_path.resolve(),)
    with pytest.raises(ValueError, match="local_roots entry 'file://server/share'"):
        ImagePolicy(local_roots=["file://server/share"])
