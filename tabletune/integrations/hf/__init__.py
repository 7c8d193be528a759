"""Acceptance measurement on a real Hugging Face model on the CPU (torch/transformers).

``ngram`` and ``replay`` are numpy-only; ``model`` imports torch and transformers; ``measure``
imports ``model`` only when it runs.
"""
