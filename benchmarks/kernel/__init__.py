"""Scripts for the router-gate kernel benchmark on a GPU machine (see docs/kernel-h200.md)."""
