"""The public names DESIGN.md promises, checked the way a user reaches them."""

from __future__ import annotations

import vf_mm
import vf_mm.errors
import vf_mm.types
import vf_mm.wire


def test_wire_exports():
    assert set(vf_mm.wire.__all__) == {
        "DEFAULT_MAX_FRAME_BYTES",
        "FRAME_HEADER_SIZE",
        "STREAM_HEADER_SIZE",
        "Decoder",
        "Encoder",
        "Ext",
        "FrameHeader",
        "FrameKind",
        "StreamReader",
        "StreamWriter",
        "TensorFormat",
        "TensorType",
        "check_frame",
        "frame_header",
        "packb",
        "parse_frame_header",
        "parse_stream_header",
        "read_stream",
        "repair_stream",
        "stream_header",
        "unpackb",
        "write_stream",
    }
    for name in vf_mm.wire.__all__:
        assert hasattr(vf_mm.wire, name), name


def test_wire_dtypes_exports():
    import vf_mm.wire.dtypes

    assert set(vf_mm.wire.dtypes.__all__) == {
        "DTYPES",
        "WireDType",
        "by_code",
        "by_name",
        "from_numpy",
        "from_torch",
        "numpy_dtype",
        "torch_dtype",
        "torch_module",
    }
    for name in vf_mm.wire.dtypes.__all__:
        assert hasattr(vf_mm.wire.dtypes, name), name


def test_every_error_descends_from_vfmmerror():
    for name in vf_mm.errors.__all__:
        cls = getattr(vf_mm.errors, name)
        assert issubclass(cls, vf_mm.errors.VfMmError), name


def test_error_tree_in_docstring_names_every_error():
    doc = vf_mm.errors.__doc__ or ""
    for name in vf_mm.errors.__all__:
        assert name in doc, f"{name} missing from the tree drawn in vf_mm.errors"


def test_types_exports_exist():
    for name in vf_mm.types.__all__:
        assert hasattr(vf_mm.types, name), name
    for name in (
        "PlaceholderRange",
        "MultiModalData",
        "RenderedTokens",
        "ResponseTokens",
        "TrajectoryStep",
        "RolloutOutput",
    ):
        assert name in vf_mm.types.__all__
