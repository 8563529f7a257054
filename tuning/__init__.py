"""Autotuner and per-GPU lookup tables (``smalltc tune``)."""
