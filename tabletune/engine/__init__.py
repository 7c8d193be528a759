"""The built-in reference engine (PyTorch + Triton): see ``runner`` for the step and docs/engine.md.

Importing this package imports nothing heavy; ``tabletune.engine.runner`` and friends import torch.
"""
