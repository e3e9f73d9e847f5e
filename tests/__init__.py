"""vf_mm's test suite: a package, so its folders (tests/renderers, ...) never shadow an installed package of the same name (verifiers imports `renderers`)."""
