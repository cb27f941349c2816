"""Reproducible benchmarks of coreserve, run from the repository root (`python -m benchmarks.<folder>.<script>`); README.md indexes them."""
