"""twserve's benchmarks in the two tiers of docs/benchmarks.md, run from the repository root.

* `hot/`: micro-benchmarks of the pure hot-path functions (pytest-benchmark):
  ``python -m pytest benchmarks/hot --benchmark-enable``. The test run collects them with
  benchmarking off, so each also runs once as a test.
* `e2e/`: the gateway end to end on loopback, each target its own process, run as modules:
  ``python -m benchmarks.e2e.load --runs 3``. Its two ``test_*_smoke.py`` files run a handful of
  requests through the harnesses in the test run.
* `support/`: what the end-to-end runs share (`harness`) and the stand-alone processes they
  start by path (`fakeupstream.py`, `rawproxy.py`).
"""
