"""The EAGLE-1 head moved to ``tabletune.integrations.hf.eagle_head`` (the engine and the HF replay load it, so it
sits below both); this name stays for ``benchmarks/drafter_online.py``."""

from tabletune.integrations.hf.eagle_head import save_random_head  # noqa: F401
