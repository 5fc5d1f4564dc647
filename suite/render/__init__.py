"""Renderers of a `suite.document.Document`: markdown (report.md) and HTML (report.html)."""
