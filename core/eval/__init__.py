"""Evaluation of a converted model: perplexity, per-layer attention error, samples, and quality by
context length with its passkey grid."""
