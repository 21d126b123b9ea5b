"""8-objective QA scoring (docs/method.md §7).

The agent's answer is one string; it is split on ``;`` and position ``i`` is
scored against the aliases of question ``i``. Each position gets the best
exact match and the best token F1 over its aliases after SQuAD-style
normalisation (lowercase, drop punctuation, drop the articles a/an/the,
collapse whitespace). The task score is the sum over positions divided by the
number of questions, so a missing position scores 0 and positions beyond the
last question are ignored.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

SEPARATOR = ";"
_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, strip punctuation and articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    p = normalize_answer(prediction)
    return float(bool(p) and p == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def split_answers(answer: str | None) -> list[str]:
    """The answer string's positions, stripped (``None`` → no positions)."""
    if answer is None:
        return []
    return [part.strip() for part in str(answer).split(SEPARATOR)]


@dataclass(frozen=True)
class QAScore:
    f1: float
    em: float
    f1_per_question: tuple[float, ...]
    em_per_question: tuple[float, ...]
    predictions: tuple[str, ...]  # one per question; "" where the answer had no position

    def as_dict(self) -> dict[str, float]:
        return {"f1": self.f1, "em": self.em}


def score_answer(answer: str | None, aliases: Sequence[Sequence[str]]) -> QAScore:
    """Score one task's answer string against ``aliases[i]`` for question ``i`` (docs/method.md §7)."""
    if not aliases:
        raise ValueError("a task needs at least one question")
    parts = split_answers(answer)
    preds = [parts[i] if i < len(parts) else "" for i in range(len(aliases))]
    f1s, ems = [], []
    for pred, golds in zip(preds, aliases, strict=True):
        # An empty prediction is a missing answer: 0 whatever the aliases say.
        f1s.append(max((token_f1(pred, g) for g in golds), default=0.0) if pred else 0.0)
        ems.append(max((exact_match(pred, g) for g in golds), default=0.0) if pred else 0.0)
    n = len(aliases)
    return QAScore(sum(f1s) / n, sum(ems) / n, tuple(f1s), tuple(ems), tuple(preds))
