"""Router-gate serving benchmark suite: baseline vs patched vLLM, end to end."""

__version__ = "0.1.0"
