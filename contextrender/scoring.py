"""The usefulness score U_t(r) (docs/method.md §4, paper §3.3 and §A.3).

    U_t(r) = W_rec·exp(−λ·a_t(r)) + W_reuse·(1 − exp(−γ·c_t(r))) + W_rel·s_t(r)

with s_t(r) = max(cos(emb(r), q_t), 0) and
q_t = 0.4·unit(emb(x)) + 0.6·unit(emb(f_t)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Weights:
    """(W_rec, W_rel, W_reuse). Ablations zero a weight without renormalising (docs/method.md §4)."""

    recency: float = 1.0
    relevance: float = 1.0
    reuse: float = 1.0


@dataclass(frozen=True)
class ScoringParams:
    """Every constant of docs/method.md §4–§5, with the paper's defaults."""

    weights: Weights = Weights()
    lam: float = 0.3  # λ, recency decay per turn
    gamma: float = 0.2  # γ, reuse saturation
    diversity: float = 0.5  # the 0.5 in R_t(r|S) = U_t(r) − 0.5·D(r,S)  (docs/method.md §5)
    task_weight: float = 0.4  # weight of unit(emb(x)) in q_t  (docs/method.md §4)
    focus_weight: float = 0.6  # weight of unit(emb(f_t)) in q_t
    task_chars: int = 2000  # x = first user message clipped to 2,000 chars
    result_chars: int = 8000  # emb(r) embeds the first 8,000 chars

    def __post_init__(self) -> None:
        w = self.weights
        for label, v in (("weights.recency", w.recency), ("weights.relevance", w.relevance),
                         ("weights.reuse", w.reuse), ("lam", self.lam), ("gamma", self.gamma),
                         ("diversity", self.diversity), ("task_weight", self.task_weight),
                         ("focus_weight", self.focus_weight)):
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v >= 0):
                raise ValueError(f"{label} must be a finite number ≥ 0, got {v!r}")
        for label, n in (("task_chars", self.task_chars), ("result_chars", self.result_chars)):
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ValueError(f"{label} must be a positive integer, got {n!r}")


def matvec(m: np.ndarray, v: np.ndarray) -> np.ndarray:
    """m @ v in float32 without BLAS: einsum is much faster than gemv for one vector on some
    OpenBLAS builds (and gives the same result on every machine)."""
    return np.einsum("ij,j->i", m, np.asarray(v, dtype=np.float32))


def unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else np.zeros_like(v)


def query_vector(task_emb: np.ndarray, focus_emb: np.ndarray | None, p: ScoringParams) -> np.ndarray:
    """q_t (docs/method.md §4). Without an assistant message yet, f_t is the user message alone."""
    q = p.task_weight * unit(task_emb)
    if focus_emb is not None:
        q = q + p.focus_weight * unit(focus_emb)
    return q


def relevance(result_embs: np.ndarray, q: np.ndarray) -> np.ndarray:
    """s_t(r) = max(cos(emb(r), q_t), 0); rows of ``result_embs`` are unit vectors."""
    qu = unit(q)
    if result_embs.shape[0] == 0 or not qu.any():
        return np.zeros(result_embs.shape[0], dtype=np.float64)
    return np.maximum(matvec(result_embs, qu), 0.0).astype(np.float64)


def usefulness(ages: np.ndarray, reuse_counts: np.ndarray, rel: np.ndarray, p: ScoringParams) -> np.ndarray:
    """U_t(r) for arrays of a_t(r), c_t(r), s_t(r) (Eq. 2)."""
    w = p.weights
    return (w.recency * np.exp(-p.lam * ages)
            + w.reuse * (1.0 - np.exp(-p.gamma * reuse_counts))
            + w.relevance * rel)
