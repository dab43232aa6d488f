"""End-to-end benchmarks: the gateway and its peers as processes on loopback, run as
``python -m benchmarks.e2e.<name>`` from the repository root (docs/benchmarks.md)."""
