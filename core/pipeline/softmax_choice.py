"""``attention.softmax_layers: auto``: after attention transfer, keep the worst-to-linearize layers softmax.

Every layer is converted and trained in stage 1. Then each converted layer is scored on the
validation blocks (:mod:`core.eval.layer_scores`, ``attention.softmax_score``), the
``attention.softmax_budget`` highest-scoring ones get their softmax attention back
(:func:`core.attention.surgery.restore_softmax`) and stage 2 trains the hybrid that results. The
choice is kept in ``<run>/softmax_choice.json``::

    {"softmax_score": "kl", "budget": 2, "softmax_layers": [3, 27], "layer_scores": [s_0, ..., s_{N-1}]}

(``layer_scores`` has null for a layer that was never converted), so a resumed run and every
later load of the run (chat, eval, export) restore the same layers without scoring again. The
score method is named ``softmax_score`` as in the config (older choice files call it ``score``).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from core.attention.surgery import decoder_layers, lolcats_modules, restore_softmax
from core.config import AttentionSpec, ConfigError, ConvertConfig
from core.eval.layer_scores import layer_scores, worst_layers
from core.io import atomic_write_json
from core.load import saved_choice
from core.progress import NullProgress, ProgressCallback
from core.run_folder import CHOICE_FILE

def check_budget(model: nn.Module, spec: AttentionSpec) -> None:
    """Refuse (before any training) a ``softmax_budget`` that leaves no layer of ``model`` converted."""
    converted = len(lolcats_modules(model))
    if spec.softmax_layers == "auto" and spec.softmax_budget >= converted:
        raise ConfigError(f"attention.softmax_budget {spec.softmax_budget} would keep all {converted} converted "
                          f"layers softmax; use at most {converted - 1}")


def choose_softmax_layers(model: nn.Module, config: ConvertConfig, blocks, output: str | Path,
                          progress: ProgressCallback | None = None) -> dict | None:
    """Score, choose and restore (or restore the choice ``output`` already keeps); returns the
    choice, or None when ``config.attention.softmax_layers`` is an explicit list."""
    spec = config.attention
    if spec.softmax_layers != "auto":
        return None
    progress = progress or NullProgress()
    choice = saved_choice(output)
    if choice is None:
        progress.on_log(f"scoring every converted layer by {spec.softmax_score} on {config.eval.mse_blocks} "
                        f"validation block(s) to keep {spec.softmax_budget} softmax")
        scores = layer_scores(model, blocks, config.eval.mse_blocks, spec.softmax_score)
        chosen = worst_layers(scores, spec.softmax_budget)
        n_layers = len(decoder_layers(model))
        choice = {"softmax_score": spec.softmax_score, "budget": spec.softmax_budget, "softmax_layers": chosen,
                  "layer_scores": [scores.get(i) for i in range(n_layers)]}
        atomic_write_json(Path(output) / CHOICE_FILE, choice)
    restore_softmax(model, choice["softmax_layers"])
    progress.on_log(f"layers kept softmax (by {choice['softmax_score']}): {choice['softmax_layers'] or 'none'}")
    return choice


__all__ = ["check_budget", "choose_softmax_layers"]
