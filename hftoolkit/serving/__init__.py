"""`hftoolkit serve`: trained runs behind an OpenAI-compatible HTTP API (docs/serving.md)."""
