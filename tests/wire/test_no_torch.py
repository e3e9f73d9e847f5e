"""``vf_mm.wire`` without torch: importing it and handling numpy never imports torch, and a
message that needs torch says so with ``MissingDependencyError`` when torch is absent."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import msgpack
import numpy as np
import torch

from vf_mm.wire import packb

REPO = Path(__file__).resolve().parents[2]

BLOCK_TORCH = textwrap.dedent(
    """
    import sys

    class _BlockTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, _BlockTorch())
    """
)


def run_python(code: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        timeout=120,
    )


def test_numpy_only_use_never_imports_torch() -> None:
    code = textwrap.dedent(
        """
        import datetime, sys, uuid, io
        import numpy as np
        import ml_dtypes
        import vf_mm.wire as wire
        from vf_mm.wire import packb, unpackb, write_stream, read_stream
        assert "torch" not in sys.modules, "import vf_mm.wire imported torch"

        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        b = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
        obj = {"a": a, "nc": a.T, "b": b, "when": datetime.date(2024, 1, 1), "u": uuid.UUID(int=1)}
        for tensors in ("auto", "numpy"):
            out = unpackb(packb(obj), tensors=tensors)
            assert isinstance(out["a"], np.ndarray) and np.array_equal(out["a"], a)
            assert np.array_equal(out["nc"], a.T)
            assert out["b"].dtype == b.dtype and out["b"].tobytes() == b.tobytes()
            assert out["when"] == datetime.date(2024, 1, 1)
        out = unpackb(packb({"x": a}, tensor_format="foreign"), tensors="numpy")
        assert np.array_equal(out["x"], a)

        buf = io.BytesIO()
        write_stream(buf, [obj, obj])
        buf.seek(0)
        assert len(list(read_stream(buf))) == 2

        assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)
        print("ok")
        """
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().strip() == "ok"


def test_torch_message_without_torch() -> None:
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    bf = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    native = bytes(packb({"t": t, "bf": bf, "n": np.arange(3)}))
    foreign = msgpack.packb(
        {"__torch_tensor__": True, "dtype": "float32", "shape": [2, 3], "data": t.numpy().tobytes()}
    )
    stdin = msgpack.packb([native, foreign])
    code = BLOCK_TORCH + textwrap.dedent(
        """
        import msgpack
        import numpy as np
        from vf_mm.errors import MissingDependencyError
        from vf_mm.wire import unpackb

        try:
            import torch  # noqa: F401
        except ImportError:
            pass
        else:
            raise AssertionError("the blocker did not block torch")

        native, foreign = msgpack.unpackb(sys.stdin.buffer.read())
        for msg in (native, foreign):
            for tensors in ("auto", "torch"):
                try:
                    unpackb(msg, tensors=tensors)
                except MissingDependencyError as exc:
                    assert "torch" in str(exc), str(exc)
                    assert isinstance(exc, ImportError)
                else:
                    raise AssertionError(f"decoded a torch tensor without torch ({tensors})")

        out = unpackb(native, tensors="numpy")
        assert out["t"].dtype == np.float32 and out["t"].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert str(out["bf"].dtype) == "bfloat16" and out["bf"].astype(np.float32).tolist() == [1, 2]
        assert out["n"].tolist() == [0, 1, 2]
        out = unpackb(foreign, tensors="numpy")
        assert out.tolist() == [[0, 1, 2], [3, 4, 5]]
        assert "torch" not in sys.modules
        print("ok")
        """
    )
    proc = run_python(code, stdin)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().strip() == "ok"
