"""A trained drafter for the target: the EAGLE-1 head (``head``), its training prompts (``prompts``),
the target loaded from its GGUF file (``target``) and the training recipe (``train``).

Not part of the core: it imports torch; it imports the core, never the reverse.
"""
