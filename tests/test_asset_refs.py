"""A run directory's asset references: one format, the same for every reader."""

from __future__ import annotations

import pytest

from vf_mm._asset_refs import image_asset_hash, image_asset_ref, video_asset_hash, video_asset_ref

H = "0123456789abcdef0123456789abcdef"


def test_references_round_trip() -> None:
    assert image_asset_hash(image_asset_ref(H)) == H
    assert video_asset_hash(video_asset_ref(H, "mp4")) == (H, "mp4")


@pytest.mark.parametrize(
    "ref",
    [
        f"assets/{H}.png\n",  # re.match with '$' took this one
        f"./assets/{H}.png",
        f"assets/{H.upper()}.png",
        f"assets/{H[:-1]}.png",
        f"assets/{H}.jpg",
        f"assets/{H}.mp4",  # a video is not an image
        b"assets/" + H.encode() + b".png",
        None,
    ],
)
def test_what_only_looks_like_an_image_reference_is_none(ref: object) -> None:
    assert image_asset_hash(ref) is None


def test_an_image_is_not_a_video_reference() -> None:
    assert video_asset_hash(image_asset_ref(H)) is None
    assert video_asset_hash(f"assets/{H}.mp4\n") is None
