"""Acceptance measurement on a real Hugging Face model on the CPU (torch/transformers), and the EAGLE-1 head in
the layout vLLM and transformers load (``eagle_head``).

``ngram`` and ``replay`` are numpy-only; ``model`` and ``eagle_head`` import torch (and transformers);
``measure`` imports ``model`` only when it runs.
"""
