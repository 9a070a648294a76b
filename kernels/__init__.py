"""Kernels for tieredkv (installed as tieredkv.kernels).

`reference` is the specification: pure torch, runs anywhere. The Triton versions are tested
against it. `select_backend` picks one set once at start-up.
"""
