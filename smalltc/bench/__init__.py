"""Benchmarks: ``smalltc bench`` (suites, baselines, tables, JSON, plots)."""
