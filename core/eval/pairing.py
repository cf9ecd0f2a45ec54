"""Paired comparison of two models scored on the same items: the mean difference and its 95% CI.

For per-item scores ``t_i`` (teacher) and ``s_i`` (student) on the same ``n`` items,
``diff = mean(s_i - t_i)``, which equals ``mean(s) - mean(t)``. The interval is the paired
bootstrap percentile interval: resample the ``n`` item indices with replacement ``iters`` times
(one fixed-seed generator), take ``mean(s_i - t_i)`` over each resample, and report the 2.5% and
97.5% quantiles. Pairing keeps the item difficulty that both models share out of the interval,
so it is much tighter than comparing two independent standard errors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BOOTSTRAP_ITERS = 10_000
BOOTSTRAP_SEED = 0
CI_METHOD = f"paired bootstrap percentile interval, {BOOTSTRAP_ITERS} resamples, seed {BOOTSTRAP_SEED}"


def paired_difference(teacher: Sequence[float], student: Sequence[float], iters: int = BOOTSTRAP_ITERS,
                      seed: int = BOOTSTRAP_SEED, level: float = 0.95) -> tuple[float, tuple[float, float]]:
    """``(mean(student - teacher), (lo, hi))``: the difference and its paired bootstrap ``level`` CI.

    ``teacher[i]`` and ``student[i]`` are the two models' scores on item ``i``. The interval is
    clipped to contain the point estimate (a percentile interval can miss it by rounding when
    almost every resample gives the same value)."""
    t = np.asarray(teacher, dtype=np.float64)
    s = np.asarray(student, dtype=np.float64)
    if t.shape != s.shape or t.ndim != 1 or t.size == 0:
        raise ValueError(f"paired scores need two equal, non-empty 1-D sequences; got {t.shape} and {s.shape}")
    d = s - t
    diff = float(d.mean())
    rng = np.random.default_rng(seed)
    means = np.empty(iters)
    chunk = max(1, 2_000_000 // d.size)  # bounds the index matrix to ~16 MB
    for start in range(0, iters, chunk):
        idx = rng.integers(0, d.size, size=(min(chunk, iters - start), d.size))
        means[start:start + idx.shape[0]] = d[idx].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return diff, (min(float(lo), diff), max(float(hi), diff))


def paired_items(teacher_samples: list[dict], student_samples: list[dict], metric: str, filter_name: str
                 ) -> tuple[list[float], list[float]]:
    """The two models' per-item ``metric`` values for the items both scored, ordered by doc_id.

    ``*_samples`` are lm-eval's logged samples of one task (``log_samples=True``): one dict per
    item and filter, with ``doc_id``, ``filter`` and the metric values as keys. Metrics whose
    per-item value is not a number (corpus-level ones such as BLEU log tuples) pair no items."""
    def by_doc(samples: list[dict]) -> dict[int, float]:
        return {s["doc_id"]: float(s[metric]) for s in samples
                if s.get("filter") == filter_name and isinstance(s.get(metric), (bool, int, float))}

    t, s = by_doc(teacher_samples), by_doc(student_samples)
    docs = sorted(t.keys() & s.keys())
    return [t[d] for d in docs], [s[d] for d in docs]
