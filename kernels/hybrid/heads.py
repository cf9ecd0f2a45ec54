"""Key feature maps per query head or per key/value head, and the state read by query heads.

The history term of query head h reads the keys' features phi_k(k_j) of its own head. With
grouped-query attention (H = H_kv G query heads, G per key/value head) the key feature map may live
per query head (the paper's: ``k_feat [B, H, L, F]``, a state S, z per query head) or per key/value
head (``k_feat [B, H_kv, L, F]``, S, z per key/value head, G times fewer state bytes): the keys
of a group are one tensor, so one map per key/value head gives every query head of the group the
same features, and the G query heads share one state

    S_{h_kv} = sum_j phi_k(k_j) v_j^T,   z_{h_kv} = sum_j phi_k(k_j),   read by phi_q^h(q_n) for h // G = h_kv.

A decaying history decays a state, so its rates (log gamma) come per state head too. Every form of
the op accepts either layout: the parallel forms see the features and rates of each query head's
state head (:func:`query_heads`), the recurrent forms keep the state per state head and read it
with :func:`read_state`.
"""

from __future__ import annotations

import torch


def query_heads(x: torch.Tensor | None, H: int, dim: int = 1) -> torch.Tensor | None:
    """``x`` with H_x heads on ``dim`` (H_x dividing H) as H query heads: query head h reads head
    h // (H / H_x) (a copy for H_x < H; ``x`` itself, or None, when there is nothing to repeat)."""
    if x is None or x.shape[dim] == H:
        return x
    if H % x.shape[dim]:
        raise ValueError(f"{x.shape[dim]} state heads do not divide {H} query heads")
    return x.repeat_interleave(H // x.shape[dim], dim=dim)


def read_state(qf: torch.Tensor, S: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """phi_q(q)^T S and phi_q(q)^T z for query features ``qf [B, H, L, F]`` and a state per state
    head, ``S [B, H_s, F, d]``, ``z [B, H_s, F]`` (H_s = H or H_kv): ``([B, H, L, d], [B, H, L])``
    float32, each query head reading its group's state (the state is not repeated)."""
    B, H, L, Fd = qf.shape
    Hs = S.shape[1]
    qg = qf.float().reshape(B, Hs, (H // Hs) * L, Fd)  # [B, H_s, G L, F]: a group's queries, head-major
    num = torch.matmul(qg, S).view(B, H, L, -1)
    den = torch.matmul(qg, z[..., None]).view(B, H, L)
    return num, den


__all__ = ["query_heads", "read_state"]
