"""vLLM integration: the tuner's engine adapter and the general plugin."""
