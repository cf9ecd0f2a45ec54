"""Offline lm-eval tasks built from the bundled data (YAML, JSONL and their builder); see README.md."""
