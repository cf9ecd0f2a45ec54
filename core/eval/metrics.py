"""Evaluation: held-out perplexity, per-layer attention MSE, generation samples.

Teacher numbers come from the same model object in teacher mode (converted layers compute the
original softmax attention, LoRA adapters disabled), so no second copy of the weights is needed;
an exported model swaps its base model's q/k/v/o weights in (:func:`teacher_context`).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from core.config import Stage1Spec
from core.attention.layer import teacher_attention
from core.attention.surgery import decoder_layers, lolcats_modules
from core.export.teacher import swap_in_teacher
from core.train.lora import adapters_off, base_model
from core.progress import NullProgress, ProgressCallback
from core.train.distill_attention import evaluate_layers

Batch = dict[str, torch.Tensor]


@contextlib.contextmanager
def teacher_context(model: nn.Module):
    """Inside the block the model computes the original softmax attention and no LoRA.

    The converted layers' choice is per thread (:func:`core.attention.layer.teacher_attention`: a
    context variable, nothing on the model changes). Two things still change the shared model for
    the block, so concurrent users of one loaded model need a lock around it: peft's
    ``disable_adapter`` (a LoRA-wrapped model) and, for an exported model (LoRA merged into its
    weights), its base model's weights swapped in place (:mod:`core.export.teacher`); when that
    base model cannot be loaded this raises :class:`core.export.teacher.TeacherUnavailableError`
    before anything changes."""
    inner = base_model(model)
    restore_weights = swap_in_teacher(inner)
    try:
        with teacher_attention(lolcats_modules(inner).values()), adapters_off(model):
            yield model
    finally:
        restore_weights()


@torch.no_grad()
def perplexity(model: nn.Module, blocks: Batch, n_blocks: int | None = None, progress: ProgressCallback | None = None,
               stage: str = "eval") -> float:
    """exp(mean next-token NLL) over the label tokens of the first ``n_blocks`` blocks."""
    progress = progress or NullProgress()
    device = next(model.parameters()).device
    n = blocks["input_ids"].shape[0] if n_blocks is None else min(n_blocks, blocks["input_ids"].shape[0])
    if n == 0:
        raise ValueError("no evaluation blocks: the held-out text is shorter than one seq_len block")
    total, count = 0.0, 0
    for i in range(n):
        ids = blocks["input_ids"][i : i + 1].to(device)
        labels = blocks.get("labels", blocks["input_ids"])[i : i + 1].to(device)
        mask = blocks.get("attention_mask")
        logits = model(input_ids=ids, attention_mask=None if mask is None else mask[i : i + 1].to(device),
                       use_cache=False).logits
        shift_logits, shift_labels = logits[:, :-1].float(), labels[:, 1:]
        nll = F.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
                              ignore_index=-100, reduction="sum")
        total += nll.item()
        count += int((shift_labels != -100).sum())
        progress.on_step(stage, i + 1, n, {"nll": total / max(count, 1)})
    return math.exp(total / max(count, 1))


@torch.no_grad()
def per_layer_mse(model: nn.Module, blocks: Batch, n_blocks: int) -> list[float | None]:
    """Attention-output MSE (student vs teacher, same layer input) for every layer; None for softmax layers."""
    inner = base_model(model)
    n_layers = len(decoder_layers(inner))
    if not lolcats_modules(inner):
        return [None] * n_layers
    _, per_layer = evaluate_layers(inner, blocks, n_blocks, Stage1Spec())
    return [float(per_layer[i]) if i in per_layer else None for i in range(n_layers)]


@torch.no_grad()
def generate_text(model: nn.Module, tokenizer, prompt: str, max_new_tokens: int) -> str:
    device = next(model.parameters()).device
    enc = tokenizer(prompt, return_tensors="pt").to(device)
    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    return tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def chat_prompt(tokenizer, message: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                             add_generation_prompt=True)
    return message


def samples(model: nn.Module, tokenizer, prompts: list[str], max_new_tokens: int) -> list[dict]:
    """Greedy answers of teacher and student to the same prompts."""
    out = []
    for prompt in prompts:
        text = chat_prompt(tokenizer, prompt)
        with teacher_context(model):
            teacher = generate_text(model, tokenizer, text, max_new_tokens)
        student = generate_text(model, tokenizer, text, max_new_tokens)
        out.append({"prompt": prompt, "teacher": teacher, "student": student})
    return out
