"""A trained drafter for the target: the training prompts (``prompts``), the target loaded from its GGUF file
(``target``), the training recipe (``train``), its held-out evaluation (``evaluate``) and the head learning while
the engine serves (``online``). The head itself is ``tabletune.integrations.hf.eagle_head``.

Not part of the core: it imports torch. It stands on the engine and the integrations, and neither imports it.
"""
