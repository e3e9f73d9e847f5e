"""The verifiers plugin of vf-mm: verifiers 0.4 loads a taskset (and its harness) by the
name of an installed package exporting them through ``__all__``, so this package is what
the taskset id ``vf-mm-verifiers`` names. Everything lives in
``vf_mm.integrations.verifiers`` (see ``docs/trainers.md``)."""

from vf_mm.integrations.verifiers import VfMMHarness, VfMMTaskset

__all__ = ["VfMMHarness", "VfMMTaskset"]
