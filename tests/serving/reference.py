"""The workbench's own model on the same tokens as a vLLM run: what the serving tests compare with."""

from __future__ import annotations

import torch

from core.load import load_converted


def reference_logprobs(export_dir, dtype: str | None = None):
    """A function ``(prompt ids, generated ids) -> (argmax tokens, generated logprobs, prompt logprobs)``
    of the export loaded by :func:`core.load.load_converted` (one forward over the whole
    sequence, no cache: the parallel form): for every generated token the model's greedy choice at
    its position and that token's log-probability, and the log-probabilities of the prompt's
    tokens from the second."""
    model, _, _ = load_converted(export_dir, device="cpu", dtype=dtype)

    @torch.no_grad()
    def score(prompt: list[int], generated: list[int]):
        ids = torch.tensor([prompt + generated])
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)[:-1]  # predicts token t + 1
        chosen = logprobs.gather(1, ids[0, 1:, None])[:, 0]
        n = len(prompt) - 1
        return logprobs[n:].argmax(-1).tolist(), chosen[n:].tolist(), chosen[:n].tolist()

    return score
