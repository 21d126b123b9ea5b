"""The hindsight ceiling: the most reuse events any selector with the same budget scope could cover.

Not a policy. At each turn it knows which results the recorded transcript
reuses next (docs/method.md §7 events) and, with the same scope, verbatim trim and
markers as ContextRender, shows the smallest of those first while they fit —
which maximises the number of shown reused results, i.e. that turn's recall.
No policy that shares the scope and the verbatim trim can score higher, so
``ceiling − policy`` is what any such selector could still gain on a trace set.
A policy with another trim (contextrender_plus's prose-first trim) is bounded by
the ceiling built with that trim (``trim_prose_first=True``), not by this one:
against the selectors' ceiling its "gap covered" can exceed 100 % or read "no gap".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from contextrender.experiments.evaluation.recall import Event, reuse_events
from contextrender.experiments.evaluation.traces import Episode
from contextrender.graph import Session
from contextrender.scoring import Weights
from contextrender.selector import Choice, ContextRender, Stage


class HindsightChooser:
    """Step 4 with hindsight: among the candidates the next turn reuses, the smallest first while they fit.

    ``future``: transcript length (the session's size when the turn is rendered) → result seqs that
    turn reuses; set per episode (:func:`reuse_by_turn`).
    """

    def __init__(self) -> None:
        self.future: dict[int, set[int]] = {}

    def __call__(self, session: Session, st: Stage, budget: int, diversity: float, trace: bool) -> Choice:
        used = self.future.get(len(session), set())
        chosen = np.zeros(len(st.results), dtype=bool)
        current = st.base_tokens
        targets = [i for i in np.flatnonzero(st.cand).tolist() if st.results[i] in used and i not in st.compacted]
        for i in sorted(targets, key=lambda i: (int(st.delta[i]), i)):
            if current + int(st.delta[i]) <= budget:
                chosen[i] = True
                current += int(st.delta[i])
        return Choice(chosen, [(i, 0.0) for i in np.flatnonzero(chosen).tolist()])


class HindsightCeiling(ContextRender):
    """The ceiling as a selector with the hindsight chooser (the same markers and trim as every policy;
    ``trim_prose_first``: the trim order contextrender_plus may use instead, for its own bound)."""

    def __init__(self, *, embedder: Any, name: str = "ceiling", trim_prose_first: bool = False) -> None:
        self.hindsight = HindsightChooser()
        # Scores are never used by the chooser: relevance off spares the query embeddings.
        super().__init__(weights=Weights(recency=1.0, relevance=0.0, reuse=0.0), embedder=embedder,
                         chooser=self.hindsight, trim_prose_first=trim_prose_first,
                         name=name)

    def prepare_episode(self, episode: Episode, events: Sequence[Event] | None = None) -> None:
        """Learn the episode's reuse events (``events``: already computed) before it is replayed;
        replay calls this per episode."""
        self.future = reuse_by_turn(episode, events)

    @property
    def future(self) -> dict[int, set[int]]:
        return self.hindsight.future

    @future.setter
    def future(self, value: dict[int, set[int]]) -> None:
        self.hindsight.future = value


def reuse_by_turn(episode: Episode, events: Sequence[Event] | None = None) -> dict[int, set[int]]:
    """Transcript index of each assistant turn -> the result seqs it reuses (docs/method.md §7 events;
    ``events``: the episode's, when the caller has them)."""
    future: dict[int, set[int]] = {}
    for e in reuse_events(list(episode.messages)) if events is None else events:
        future.setdefault(episode.assistant_indices[e.j], set()).add(e.result_seq)
    return future


__all__ = ["HindsightCeiling", "HindsightChooser", "gap_covered", "gap_interval", "gap_traces", "reuse_by_turn"]


def gap_covered(recall: float | None, reference: float | None, ceiling: float | None) -> float | None:
    """How much of the gap between a reference selector and the ceiling a method covers, in %:
    (recall − reference) / (ceiling − reference); None when the reference already is at the ceiling
    (or a value is missing). Below 0: the method covers fewer events than the reference."""
    if recall is None or reference is None or ceiling is None or ceiling - reference < 1e-9:
        return None
    return 100.0 * (recall - reference) / (ceiling - reference)


#: The gap share's interval: a paired bootstrap over traces (events within a trace are not independent).
GAP_CI_LEVEL = 0.95
GAP_CI_DRAWS = 2000
GAP_CI_SEED = 0
#: Fewest traces that must hold some of the gap (ceiling ≠ reference there) for an interval: a percentile
#: bootstrap over a handful of such traces covers well under its nominal level (scripts/
#: gap_interval_coverage.py: 58–77 % with 3 of 50 traces, 91–93 % with 6–10, 93–95 % with 20–40).
GAP_CI_MIN_TRACES = 10


def gap_traces(reference: Sequence[int] | np.ndarray, ceiling: Sequence[int] | np.ndarray) -> int:
    """How many traces hold some of the gap: the ceiling covers another number of events than the
    reference there (one count per trace each, in the same order)."""
    if len(reference) != len(ceiling):
        raise ValueError(f"one count per trace for each, got lengths {len(reference)} and {len(ceiling)}")
    return int(np.count_nonzero(np.asarray(ceiling, dtype=np.int64) != np.asarray(reference, dtype=np.int64)))


def gap_interval(hits: Sequence[int], reference: Sequence[int], ceiling: Sequence[int], *,
                 level: float = GAP_CI_LEVEL, draws: int = GAP_CI_DRAWS, seed: int = GAP_CI_SEED,
                 min_traces: int = GAP_CI_MIN_TRACES) -> tuple[float, float] | None:
    """A percentile interval (%) of :func:`gap_covered` from a paired bootstrap over traces.

    Each argument holds one number per trace, in the same trace order: the reuse events the method, the
    reference selector and the ceiling cover there. All three are replayed on the same traces, so each
    trace has the same events for all three and the gap share of pooled recall is the share of pooled
    hits. A draw resamples the traces with replacement (the same traces for all three: the pairing is
    kept) and pools them, as the point estimate does. Draws without a gap (the ceiling covers no more
    than the reference) are left out.

    None when fewer than ``min_traces`` traces hold some of the gap (:func:`gap_traces`: too few
    clusters for the interval to mean its level), or when under ``level`` of the draws have a gap (an
    interval would then describe another question). The point estimate keeps its own rule.
    """
    arrays = [np.asarray(a, dtype=np.int64) for a in (hits, reference, ceiling)]
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise ValueError(f"one count per trace for each of the three, got lengths {[len(a) for a in arrays]}")
    if not 0.0 < level < 1.0 or draws < 1:
        raise ValueError(f"level must lie in (0, 1) and draws be ≥ 1, got {level}, {draws}")
    m, r, c = arrays
    if gap_traces(r, c) < max(1, min_traces):
        return None
    rng = np.random.default_rng(seed)
    gains, rooms = [], []
    step = max(1, 1_000_000 // n)  # draws per block: memory stays bounded for large trace sets
    for start in range(0, draws, step):
        idx = rng.integers(0, n, size=(min(step, draws - start), n))
        gains.append((m - r)[idx].sum(axis=1))
        rooms.append((c - r)[idx].sum(axis=1))
    gain, room = np.concatenate(gains), np.concatenate(rooms)
    ok = room > 0
    if ok.sum() < level * draws:
        return None
    shares = 100.0 * gain[ok] / room[ok]
    tail = 50.0 * (1.0 - level)
    lo, hi = np.percentile(shares, [tail, 100.0 - tail])
    return float(lo), float(hi)
