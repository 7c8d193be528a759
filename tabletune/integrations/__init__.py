"""Adapters to real engines. These may import torch and vllm; the core never imports them."""
