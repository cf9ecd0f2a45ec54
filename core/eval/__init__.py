"""Evaluation of a converted model: perplexity, per-layer attention error, passkey retrieval, samples."""
