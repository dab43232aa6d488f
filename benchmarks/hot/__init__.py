"""Micro-benchmarks of the pure hot-path functions (pytest-benchmark, docs/benchmarks.md)."""
