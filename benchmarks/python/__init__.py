"""Python models (plugin-python): speed against Triton, the process boundary, stubs that crash."""
