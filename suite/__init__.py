"""Router-gate serving benchmark suite: baseline vs patched vLLM, end to end."""

from pathlib import Path

__version__ = "0.1.0"

# The checkout the suite runs from: patches/, docker/, matrices/, .cache/ live here.
REPO_ROOT = Path(__file__).resolve().parent.parent
