"""Serving a LoLCATs export through vLLM."""
