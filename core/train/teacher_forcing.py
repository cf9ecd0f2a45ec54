"""Stage-1 teacher forcing, recorded by the training code: the converted layers hold no training state.

Inside ``with teacher_forcing(modules, keep_qk) as record:`` each converted layer ``i`` of
``modules`` computes, from the same q, k, v, the teacher's (softmax) and the student's (LoLCATs)
head outputs, and passes the teacher's on (through ``o_proj``), so the next layer sees teacher
hidden states and no gradient crosses layers:

    record.pairs[i] = (y_student, y_teacher)    # [B, H, L, d] each, before o_proj; the teacher's without grad
    record.qk[i]    = (q, k, phi_q(q), phi_k(k))  # with keep_qk, for the attention-map cross-entropy

The recorder stands in for the layers' ``forward`` for the block, calling their pure methods
(:meth:`~core.attention.layer.LolcatsAttention.project`, ``teacher``, ``student``, ``features``);
on exit, an exception included, the layers' own forward is back and only ``record`` holds the
tensors of the batch.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class TeacherForcing:
    """What one teacher-forced forward recorded, by converted layer index (see the module docstring)."""

    keep_qk: bool = False  # also record q, k and their features (the cross-entropy needs them)
    pairs: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # (student, teacher)
    qk: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict)  # (q, k, phi_q(q), phi_k(k))

    def forward(self, i: int, module: nn.Module, hidden_states: torch.Tensor, position_embeddings,
                attention_mask: torch.Tensor | None = None, past_key_values=None,
                padding_mask: torch.Tensor | None = None, **kwargs):
        """Layer ``i``'s forward under teacher forcing: records its pair, returns the teacher's output [B, L, D]."""
        q, k, v, q_in, k_in = module.project(hidden_states, position_embeddings)
        mask = module.token_mask(padding_mask, hidden_states.shape[1])
        with torch.no_grad():
            y = module.teacher(q, k, v, attention_mask, **kwargs)  # [B, H, L, d]
        self.pairs[i] = (module.student(q, k, v, mask, None, q_in, k_in), y)
        if self.keep_qk:
            self.qk[i] = (q, k, *module.features(q_in, k_in, mask))
        return module.merge_heads(y), None


@contextlib.contextmanager
def teacher_forcing(modules: dict[int, nn.Module], keep_qk: bool = False) -> Iterator[TeacherForcing]:
    """Record the converted layers ``modules`` (index -> layer) under teacher forcing for the block
    (see the module docstring); their own forward is back on exit, also after an exception."""
    record = TeacherForcing(keep_qk=keep_qk)
    replaced = []
    try:
        for i, module in modules.items():
            replaced.append((module, vars(module).get("forward")))  # an instance-level forward set by others
            module.forward = functools.partial(record.forward, i, module)
        yield record
    finally:
        for module, previous in replaced:
            if previous is None:
                del module.forward
            else:
                module.forward = previous


__all__ = ["TeacherForcing", "teacher_forcing"]
