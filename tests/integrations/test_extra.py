"""The integrations are optional extras: without their trainer installed, importing one
says what to install; importing ``vf_mm.integrations`` itself imports no trainer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vf_mm.errors import MissingDependencyError


def test_the_trl_integration_without_trl_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # as if TRL were not installed
    for name in [m for m in sys.modules if m.startswith("vf_mm.integrations.trl")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MissingDependencyError, match=r"pip install 'vf-mm\[trl\]'"):
        import vf_mm.integrations.trl  # noqa: F401


def test_the_verifiers_integration_without_verifiers_names_the_extra(monkeypatch):
    for name in ("verifiers", "verifiers.v1", "renderers"):
        monkeypatch.setitem(sys.modules, name, None)  # as if verifiers 0.4 were not installed
    for name in [m for m in sys.modules if m.startswith("vf_mm.integrations.verifiers")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MissingDependencyError, match=r"pip install 'vf-mm\[verifiers1\]'"):
        import vf_mm.integrations.verifiers  # noqa: F401


def test_the_integrations_package_imports_no_trainer():
    code = (
        "import sys, vf_mm.integrations; "
        "print(sorted({'trl', 'torch', 'verifiers', 'renderers'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
