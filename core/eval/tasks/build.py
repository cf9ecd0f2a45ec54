"""Regenerates the offline task items in ``data/`` from the bundled texts (``python -m core.eval.tasks.build``).

Deterministic: a fixed seed, the bundled KJV sample and the GSM8K test file give byte-identical
JSONL files. Every item is ``{"id", "context", "choices" (4 strings), "label"}``; the construction
rules and why they are fair are in README.md beside this file. The shared rules:

  * items are deduplicated on the normalised context and on the normalised correct answer;
  * the correct answer's position is exactly balanced: item ``i`` of a split has ``label = i % 4``;
  * the correct answer's length rank among the four choices is exactly balanced in the test split:
    for a drawn rank ``r`` the item takes ``r`` distractors strictly shorter than the answer and
    ``3 - r`` strictly longer, and each rank fills a quarter of the items, so neither "pick the
    longest" nor "pick the median" beats chance.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from core.data import gsm8k_path, kjv_sample_path

SEED = 1234
N_CHOICES = 4
N_TEST = 200
N_TRAIN = 8  # the few-shot pool, disjoint from the test items
DATA_DIR = Path(__file__).resolve().parent / "data"

SENTENCE_END = re.compile(r"(?<=[.?!])\s+(?=[A-Z])")
WORD = re.compile(r"[A-Za-z]+")
FUNCTION_WORDS = frozenset(
    "the and that this these those thee thou thy thine him his her hers them they their there then "
    "unto upon with from into which what when where whom whose shall will should would have hath had "
    "were was are not nor but for also all any even yet lest thus said saith".split()
)


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


def pick_by_length_rank(answer: str, candidates: Iterable[str], rank: int, length: Callable[[str], object],
                        rng: random.Random) -> list[str] | None:
    """``rank`` candidates strictly shorter than ``answer`` and ``N_CHOICES - 1 - rank`` strictly longer.

    ``candidates`` come in preference order (the first ones are the most plausible); within that
    order the first fitting ones are taken. None when there are too few on either side."""
    shorter, longer, seen = [], [], {normalise(answer)}
    for c in candidates:
        key = normalise(c)
        if key in seen:
            continue
        seen.add(key)
        if length(c) < length(answer) and len(shorter) < rank:
            shorter.append(c)
        elif length(c) > length(answer) and len(longer) < N_CHOICES - 1 - rank:
            longer.append(c)
    if len(shorter) < rank or len(longer) < N_CHOICES - 1 - rank:
        return None
    picked = shorter + longer
    rng.shuffle(picked)
    return picked


def preference_order(rng: random.Random, *groups: Sequence[str]) -> list[str]:
    """The groups in order, each shuffled: earlier groups are preferred as distractors."""
    out: list[str] = []
    for group in groups:
        group = list(group)
        rng.shuffle(group)
        out += group
    return out


def kjv_chapters() -> list[list[str]]:
    """The bundled KJV sample as chapters (paragraphs), each a list of sentences."""
    text = kjv_sample_path().read_text(encoding="utf-8")
    return [SENTENCE_END.split(p.strip()) for p in text.split("\n\n") if p.strip()]


def kjv_next_items(rng: random.Random) -> list[dict]:
    """Sentence continuation: the sentence that follows ``context`` in the same chapter.

    Distractors: sentences from other chapters that begin with the same word as the answer
    (most begin with "And"), within a factor 1.5 of its length in characters."""
    chapters = kjv_chapters()
    by_first: dict[str, list[tuple[int, str]]] = {}
    for ci, sentences in enumerate(chapters):
        for s in sentences:
            by_first.setdefault(s.split()[0], []).append((ci, s))
    items = []
    for ci, sentences in enumerate(chapters):
        for context, answer in zip(sentences, sentences[1:]):
            if not (6 <= len(context.split()) <= 40 and 6 <= len(answer.split()) <= 40):
                continue
            pool = [s for cj, s in by_first.get(answer.split()[0], []) if cj != ci
                    and len(answer) / 1.5 <= len(s) <= len(answer) * 1.5]
            rank = rng.randrange(N_CHOICES)
            distractors = pick_by_length_rank(answer, preference_order(rng, pool), rank, len, rng)
            if distractors is not None:
                items.append({"context": context, "answer": answer, "distractors": distractors, "rank": rank})
    return items


def content_words(text: str) -> list[str]:
    return [w for w in WORD.findall(text) if len(w) >= 3 and w.lower() not in FUNCTION_WORDS]


def kjv_lastword_items(rng: random.Random) -> list[dict]:
    """Last-word prediction: the previous sentence and the current one without its final word.

    The answer is a content word (3+ letters, not a function word). Distractors are content words
    with the same capitalisation, within 4 letters of its length; words that occur in the
    context come first, so copying a context word is no cue. Then sentence-final words elsewhere."""
    chapters = kjv_chapters()
    finals = sorted({w for ch in chapters for s in ch for w in content_words(s)[-1:] if s.split()[-1].startswith(w)})
    items = []
    for sentences in chapters:
        for previous, sentence in zip([""] + sentences, sentences):
            words = sentence.split()
            answer = WORD.findall(words[-1])
            if len(words) < 8 or len(answer) != 1 or not content_words(answer[0]):
                continue
            answer = answer[0]
            context = (previous + " " + " ".join(words[:-1])).strip()
            same_case = lambda w: w[0].isupper() == answer[0].isupper() and abs(len(w) - len(answer)) <= 4  # noqa: E731
            in_context = sorted({w for w in content_words(context) if same_case(w)})
            elsewhere = [w for w in finals if same_case(w) and w not in in_context and content_words(w)]
            rank = rng.randrange(N_CHOICES)
            distractors = pick_by_length_rank(answer, preference_order(rng, in_context, elsewhere), rank, len, rng)
            if distractors is not None:
                items.append({"context": context, "answer": answer, "distractors": distractors, "rank": rank})
    return items


GSM8K_CALC = re.compile(r"<<[^=<>]*=([^<>]*)>>")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def integer(text: str) -> str | None:
    """The canonical decimal string of a non-negative integer written in ``text``, else None."""
    text = text.replace(",", "").replace("$", "").strip()
    try:
        value = float(text)
    except ValueError:
        return None
    return str(int(value)) if value >= 0 and value == int(value) and value < 1e12 else None


def number_length(text: str) -> tuple[int, int]:
    """Orders numbers by their written length, then value (a longer number is more tokens)."""
    return len(text), int(text)


def gsm8k_answer_items(rng: random.Random) -> list[dict]:
    """GSM8K final answer among four integers.

    Distractors, most plausible first: the problem's own intermediate results (from the
    solution's ``<<expr=value>>`` annotations), then numbers in the question, then final answers of
    other problems; each set is shuffled and the length-rank rule picks from them."""
    rows = [json.loads(line) for line in gsm8k_path().read_text(encoding="utf-8").splitlines() if line.strip()]
    answers = [integer(r["answer"].rsplit("####", 1)[-1]) for r in rows]
    all_answers = sorted({a for a in answers if a is not None}, key=number_length)
    items = []
    for row, answer in zip(rows, answers):
        if answer is None:
            continue
        steps = [v for v in map(integer, GSM8K_CALC.findall(row["answer"])) if v is not None]
        given = [v for v in map(integer, NUMBER.findall(row["question"])) if v is not None]
        others = [a for a in all_answers if abs(len(a) - len(answer)) <= 1]
        pool = preference_order(rng, sorted(set(steps)), sorted(set(given) - set(steps)), others)
        rank = rng.randrange(N_CHOICES)
        distractors = pick_by_length_rank(answer, pool, rank, number_length, rng)
        if distractors is not None:
            items.append({"context": " ".join(row["question"].split()), "answer": answer, "distractors": distractors,
                          "rank": rank})
    return items


def deduplicate(items: list[dict], unique_answers: bool) -> list[dict]:
    """Drops items whose normalised context (or, with ``unique_answers``, correct answer) already occurred.

    Sentence answers are unique per task; a word or a number may rightly be the answer of several
    different contexts."""
    contexts: set[str] = set()
    answers: set[str] = set()
    out = []
    for item in items:
        context, answer = normalise(item["context"]), normalise(item["answer"])
        if context in contexts or (unique_answers and answer in answers):
            continue
        contexts.add(context)
        answers.add(answer)
        out.append(item)
    return out


def rank_balanced(items: list[dict], n: int) -> tuple[list[dict], list[dict]]:
    """``n`` items in which every length rank of the answer occurs ``n / 4`` times (order kept), and the rest.

    Short answers cannot have shorter distractors, so ranks are not equally feasible; this
    restores the exact balance that the draw alone only gives on average."""
    per_rank = n // N_CHOICES
    taken = {r: 0 for r in range(N_CHOICES)}
    chosen, rest = [], []
    for item in items:
        if taken[item["rank"]] < per_rank:
            taken[item["rank"]] += 1
            chosen.append(item)
        else:
            rest.append(item)
    if len(chosen) < n:
        raise RuntimeError(f"too few items per length rank: {taken} of {per_rank} each")
    return chosen, rest


def finalise(items: list[dict], name: str, split: str) -> list[dict]:
    """Places item ``i``'s answer at position ``i % 4`` (exact balance); the rest keep their shuffled order."""
    out = []
    for i, item in enumerate(items):
        label = i % N_CHOICES
        choices = list(item["distractors"])
        choices.insert(label, item["answer"])
        out.append({"id": f"{name}-{split}-{i:03d}", "context": item["context"], "choices": choices, "label": label})
    return out


# task name -> (item maker, whether correct answers must be unique)
TASKS: dict[str, tuple[Callable[[random.Random], list[dict]], bool]] = {
    "lolcats_kjv_next": (kjv_next_items, True),
    "lolcats_kjv_lastword": (kjv_lastword_items, False),
    "lolcats_gsm8k_answer": (gsm8k_answer_items, False),
}


def build(out_dir: Path = DATA_DIR) -> dict[str, dict[str, int]]:
    """Writes ``<task>.test.jsonl`` and ``<task>.train.jsonl`` for every task; returns the item counts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, (make, unique_answers) in TASKS.items():
        rng = random.Random(f"{SEED}-{name}")
        items = make(rng)
        rng.shuffle(items)
        items = deduplicate(items, unique_answers)
        test, rest = rank_balanced(items, N_TEST)
        if len(rest) < N_TRAIN:
            raise RuntimeError(f"{name}: only {len(items)} items, {N_TEST + N_TRAIN} needed")
        splits = {"test": test, "train": rest[:N_TRAIN]}
        for split, chosen in splits.items():
            rows = finalise(chosen, name, split)
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
            (out_dir / f"{name}.{split}.jsonl").write_text(text, encoding="utf-8")
        counts[name] = {"candidates": len(items), **{s: len(v) for s, v in splits.items()}}
    return counts


if __name__ == "__main__":
    for task, count in build().items():
        print(task, count)
