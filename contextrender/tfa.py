"""Tool-Flow Analysis (docs/method.md §3, paper §3.2 and §A.2).

TFA finds which earlier tool results later steps reuse. Values are extracted
from every tool result; a later model output or tool call *uses* a value when
it contains it as an exact, case-sensitive whole token; the use is credited to
the first earlier tool result containing the value. The reuse score of a result
is Eq. 1, c_t(r) = Σ_{m∈M_t(r)} 1/n_t(m).

:class:`FlowIndex` is incremental: each new event is scanned once, and two
maps (value → first source, value → number of results containing it) make an
update cost proportional to the new text, never to the history.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

# docs/method.md §3 rule 2: candidates are maximal runs of this class. Every separator of
# rule 1 (quotes, brackets, commas, colons, slashes, whitespace) lies outside the
# class, as does any other character such as '@', so one regex does rules 1, 2, 5.
_CANDIDATE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{4,}")
_STRIP = "._-"  # docs/method.md §3 rule 3
MIN_VALUE_LEN = 6  # docs/method.md §3 rule 3


def _tokens(text: str) -> Iterable[str]:
    """Candidates after rules 1–3 (split, maximal runs, strip, length ≥ 6)."""
    for m in _CANDIDATE.finditer(text):
        tok = m.group().strip(_STRIP)
        if len(tok) >= MIN_VALUE_LEN:
            yield tok


def _is_titlecase_word(tok: str) -> bool:
    return tok.isalpha() and tok[0].isupper() and (len(tok) == 1 or tok[1:].islower())


def qualifies(tok: str) -> bool:
    """docs/method.md §3 rule 4: contains '_', an uppercase letter, a digit, '-' or '.',
    and is not a pure-alphabetic Titlecase word."""
    if _is_titlecase_word(tok):
        return False
    return any(c == "_" or c == "-" or c == "." or c.isdigit() or ("A" <= c <= "Z") for c in tok)


def extract_values(text: str) -> set[str]:
    """Qualifying values of a tool result (docs/method.md §3 rules 1–5)."""
    return {t for t in _tokens(text) if qualifies(t)}


def match_tokens(text: str) -> set[str]:
    """Whole tokens of a later operation (docs/method.md §3 matching: rules 1–3 only).

    A value is used when it is a member of this set: exact and case-sensitive,
    so ``roommate_1`` does not match inside ``roommate_12``.
    """
    return set(_tokens(text))


@dataclass(frozen=True)
class ReuseEdge:
    """One use: operation ``op`` (message seq, part) used ``value`` first seen in ``source``.

    ``part`` is -1 for an assistant message's text and i for its i-th tool call:
    each is one operation (docs/method.md §3 counting).
    """

    source: int
    op_seq: int
    part: int
    value: str


class FlowIndex:
    """Incremental TFA state for one session.

    Results and operations must be fed in transcript order. The index holds
    only integers and strings, so rebuilding it from persisted values and edges
    gives bit-identical scores.
    """

    def __init__(self) -> None:
        self.first_source: dict[str, int] = {}  # value -> seq of first tool result containing it
        self.n_results: dict[str, int] = {}  # value -> n_t(m): results containing it (once each)
        self.uses: dict[str, int] = {}  # value -> operations that used it
        self.used_by_source: dict[int, set[str]] = {}  # result seq -> its values that were used
        # c_t(r) cache: a source is recomputed only when one of its used values changed.
        self._scores: dict[int, float] = {}
        self._dirty: set[int] = set()

    # -- updates ---------------------------------------------------------------

    def add_result(self, seq: int, content: str) -> list[str]:
        """Index a new tool result; return its qualifying values (sorted)."""
        values = sorted(extract_values(content))
        self.add_result_values(seq, values)
        return values

    def add_result_values(self, seq: int, values: Iterable[str]) -> None:
        for v in values:
            # docs/method.md §3 attribution: the first tool result containing the value is its source.
            src = self.first_source.setdefault(v, seq)
            self.n_results[v] = self.n_results.get(v, 0) + 1
            if v in self.uses:  # n_t(m) grew: the source's c_t changes
                self._dirty.add(src)

    def add_operation(self, seq: int, part: int, text: str) -> list[ReuseEdge]:
        """Scan one later operation (model output or tool call); return its reuse edges.

        Each distinct value counts once per operation (docs/method.md §3 counting);
        different values in one operation count separately.
        """
        edges = []
        for v in sorted(match_tokens(text)):
            src = self.first_source.get(v)
            if src is not None:
                edges.append(ReuseEdge(src, seq, part, v))
        self.add_edges(edges)
        return edges

    def add_edges(self, edges: Iterable[ReuseEdge]) -> None:
        for e in edges:
            self.uses[e.value] = self.uses.get(e.value, 0) + 1
            self.used_by_source.setdefault(e.source, set()).add(e.value)
            self._dirty.add(e.source)

    # -- reads -------------------------------------------------------------------

    def reuse_score(self, seq: int) -> float:
        """c_t(r), Eq. 1: each use of value m credited to r adds 1/n_t(m)."""
        vals = self.used_by_source.get(seq)
        if not vals:
            return 0.0
        # Sorted summation: identical floats after a restart.
        return sum(self.uses[v] / self.n_results[v] for v in sorted(vals))

    def reuse_scores(self) -> Mapping[int, float]:
        """c_t(r) for every result that has been used at least once (a read-only view)."""
        for seq in self._dirty:
            self._scores[seq] = self.reuse_score(seq)
        self._dirty.clear()
        return MappingProxyType(self._scores)
