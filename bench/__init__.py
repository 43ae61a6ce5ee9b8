"""Benchmarks; `make bench` (python -m bench.run) rewrites docs/performance.md."""
