"""ContextRender+ — beyond the paper (NOT the paper's method; docs/method.md §13; its switches: results/README.md).

Same graph, same ``render(session, budget) -> Rendered`` interface and the same
budget scope as :class:`~contextrender.selector.ContextRender`: the policy *is*
a ContextRender, configured through the selector's extension points (an extra
score term, a chooser, a body filler, a marker). Every change is a
constructor switch so it can be ablated; with every switch off the policy is
exactly ContextRender with the same λ, γ and weights (tests/plus checks this):

- ``packing``: budget-aware packing. Besides the paper's greedy on R_t(r|S),
  run the same greedy ordered by value per token (R / Δtokens); keep whichever
  selection has the larger total gain Σ R (the classic "density greedy or
  plain greedy" knapsack rule), so one large high-scoring result cannot crowd
  out several small useful ones unless it is worth more than all of them.
- ``stubs``: an omitted result leaves a compact stub — its marker plus its
  qualifying values (``session.result_values``, the TFA identifiers) — instead
  of the bare marker. Stubs are charged to B and are placed only in the budget
  left after full results are chosen (most useful first), so they never
  displace a full result. A stub is NOT a visible result (docs/method.md §7).
- ``tabular``: an omitted JSON result is shown in its tabular form
  (:mod:`contextrender.tabular`: every key and value, keys written once per table
  of same-shaped records — a product's variants in 0.44 of the tokens) when that fits
  the budget left after the full results; placed like stubs, before any lossy form
  (compacted, stub). Not the original text, so NOT a visible result (docs/method.md §7).
  ``tabular_cap``: a tabular form is a stand-in like a compacted one, offered only when its tool
  message is at most the same ``oversized_share``·B (without the cap, a large listing's tabular
  form fills whatever room is left at every later call: a third of the plus's rendered tokens on
  BFCL at B=4000, for no task passed).
- ``lexical`` (W_lex): a fourth usefulness term W_lex·(1 − exp(−k)), k = number
  of the result's qualifying values that occur as whole tokens (TFA matching)
  in the current user message or the latest rendered assistant message.
- ``compact_omitted`` (needs a compactor): an omitted result larger than the
  oversized cap (``oversized_share``·B) is shown in its compacted form when
  that fits in the budget left after the full results — the paper compacts
  only results larger than B (docs/method.md §5 step 5), so a result just under B is
  either shown whole or lost. Placed like stubs (most useful first, never
  displacing a full result), cached in the graph per (result, cap) like the
  fallback's; never visible (docs/method.md §7). Results not compacted keep their stub.
- ``tool_prior`` (W_prior): a fifth usefulness term W_prior·P(tool), P(tool) = how often a result of
  that tool was reused at a later turn in TRAINING episodes (a per-tool prior fitted by
  experiments/studies/plus.py on train traces only and stored in the method config; read from the
  constructor, never computed from the transcript being rendered). Tools absent from the prior get
  ``prior_default``. ``session_prior`` (W_sess, for tools absent from the prior): instead,
  W_sess·(k + 2·prior_default)/(n + 2), k of the tool's n results in THIS session already reused
  (c_t > 0; causal: the reuse graph up to now), so a domain the fit never saw still learns which of
  its tools are reused. ``prior_min_age``: the prior reorders only results at least that many
  invocations old (a_t(r) ≥ prior_min_age); each younger one gets the largest prior term of the
  render, so the prior never pushes the latest results below older ones — a task often needs the
  latest result's values at once even when its tool is rarely reused later (τ²'s product
  catalogue: its item ids are numbers, which the recall metric never counts).
  It predicts reuse before any is observed: results whose tool is rarely reused
  (on τ² a product catalogue) give way to those whose tool usually is (order details).
- ``call_prior``: the words of the call refine P(tool) — what was asked predicts whether the answer is
  reused (one tool, ``python_interpreter``, runs every search of a code agent; "height" and "founded by"
  are the same tool). ``call_prior[tool][w]`` = P(reuse | tool, word w in the call's arguments), fitted
  on TRAINING episodes like the per-tool prior (words of at least 3 letters, :func:`call_words`; only
  words seen in several train episodes). Naive Bayes on the log-odds:
  logit P = logit P(tool) + Σ_w [logit P(tool, w) − logit P(tool)] over the call's fitted words. For a
  tool in the per-tool prior only (the session prior has no words). ``use_call_prior``: the switch.
- ``trim_prose_first`` (a ContextRender parameter, off there): when the verbatim messages alone exceed B,
  drop old assistant prose (assistant messages without tool calls, never the newest one) before the
  oldest units (:func:`~contextrender.render.fit_verbatim`). The project rule drops the oldest units
  first, and with them the oldest tool calls, whose results then cannot be shown at all — on real
  multi-turn dialogues those are the user-details lookups every later step reuses. Same target share
  (50 % of B); the first user message is never dropped. Not fitted: the oracle traces never overflow
  B at 2000 and hold almost no prose.
- λ, γ and the weights are plain parameters; conf/method/contextrender_plus.yaml
  carries values fitted on a TRAINING split of traces (experiments/studies/plus.py).

Postcondition as in the paper: Tok(H_t) ≤ B, checked on what was assembled.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import astuple, dataclass
from typing import Any

import numpy as np

from contextrender.compaction import Compactor
from contextrender.events import Usage, decoded_arguments
from contextrender.expand import TOOL_NAME as EXPAND_TOOL
from contextrender.expand import handle as expand_handle
from contextrender.expand import marker as expand_marker
from contextrender.graph import Session, attempt_of
from contextrender.idform import HEADER as ID_HEADER
from contextrender.idform import id_form
from contextrender.render import focus_text, marker_text, text_message_tokens
from contextrender.scoring import matvec
from contextrender.selector import Choice, ContextRender, FillRoom, Stage, greedy
from contextrender.tabular import tabulate
from contextrender.tfa import match_tokens
from contextrender.tokens import MESSAGE_OVERHEAD

_MISSING = object()
#: Entries each per-result cache of a policy keeps (least recently added dropped first).
CACHE_SIZE = 4096


_WORD = re.compile(r"[a-z]{3,}")
#: P is clipped to [_EPS, 1 − _EPS] before taking log-odds.
_EPS = 1e-4


def call_words(arguments: str) -> frozenset[str]:
    """The words of a call's arguments the call prior is keyed by: lower-cased runs of ≥ 3 ASCII letters
    in its keys and scalar values (:func:`~contextrender.events.decoded_arguments`)."""
    return frozenset(_WORD.findall(decoded_arguments(arguments).lower()))


def log_odds(p: float) -> float:
    p = min(1.0 - _EPS, max(_EPS, p))
    return math.log(p / (1.0 - p))


#: δ of the learned id value: a tool never reused either way is worth half its full text as ids.
_DELTA = 0.05


@dataclass(frozen=True)
class Learned:
    """P̂ that a result of a tool is reused later: at all, by a later tool call, by a later assistant's text."""

    reuse: float
    call: float
    text: float


def _result_key(session: Session, seq: int) -> tuple[str, str, int, str]:
    """A result's key in the per-result caches: its graph object, session, position and content digest, so a cache
    shared across graphs (in-memory ones reuse session ids) never answers for another text."""
    return session.graph.uid, session.id, seq, session.digest(seq)


def _remember(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    if len(cache) > CACHE_SIZE:
        cache.popitem(last=False)


@dataclass
class _Step:
    """The upgrades open at one step of :meth:`ContextRenderPlus._upgrade`: their costs, values and feasibility."""

    to_full_dc: np.ndarray
    to_full_dv: np.ndarray
    to_ids_dc: np.ndarray
    to_ids_dv: np.ndarray
    f_ok: np.ndarray
    i_ok: np.ndarray


@dataclass
class _Plan:
    """The knapsack over (marker, id form, full) for each candidate, as :meth:`ContextRenderPlus._upgrade` builds it."""

    st: Stage
    ids: np.ndarray  # Tok of each result's id form (no more than its full text)
    beta: np.ndarray  # what an id form is worth as a share of U
    full_cost: np.ndarray  # Tok of the full (or, oversized, compacted) tool message
    has_ids: np.ndarray
    no_full: np.ndarray  # oversized results with an id form: their compacted form only if that does not fit
    form: np.ndarray  # 0 marker, 1 id form, 2 full
    dmax: np.ndarray  # D(r, S) over the results shown in full
    current: int
    picks: list[tuple[int, float]]
    total: float = 0.0
    lost_to: np.ndarray | None = None
    lost_sim: np.ndarray | None = None
    pick_sim: np.ndarray | None = None

    @staticmethod
    def start(st: Stage, ids: np.ndarray, beta: np.ndarray, trace: bool) -> _Plan:
        n = len(st.results)
        full_cost = st.marker_cost + st.delta
        # An oversized result's "full" option is its compacted form, which keeps fewer of the values calls need
        # than its id form: with an id form, that is its option.
        oversized = np.zeros(n, dtype=bool)
        oversized[list(st.compacted)] = True
        no_full = oversized & (ids < st.arrays.ntok)
        return _Plan(st, ids, beta, full_cost, (ids < full_cost) | no_full, no_full, np.zeros(n, dtype=np.int8),
                     np.zeros(n, dtype=np.float64), st.base_tokens, [],
                     lost_to=np.full(n, -1, dtype=np.int64) if trace else None,
                     lost_sim=np.zeros(n, dtype=np.float64) if trace else None,
                     pick_sim=np.zeros(n, dtype=np.float64) if trace else None)

    def candidates(self, budget: int, diversity: float) -> _Step | None:
        """The upgrades that fit now, or None when none does."""
        st, form, g = self.st, self.form, self.st.util
        now_cost = np.where(form == 1, self.ids, st.marker_cost)
        now_val = np.where(form == 1, self.beta * g, 0.0)
        step = _Step(self.full_cost - now_cost, g - diversity * self.dmax - now_val, self.ids - st.marker_cost,
                     self.beta * g, np.zeros(0, dtype=bool), np.zeros(0, dtype=bool))
        open_ = st.cand & (form < 2)
        step.i_ok = open_ & (form == 0) & self.has_ids & (self.current + step.to_ids_dc <= budget)
        step.f_ok = open_ & ~(self.no_full & (step.i_ok | (form == 1))) & (self.current + step.to_full_dc <= budget)
        return step if (step.f_ok.any() or step.i_ok.any()) else None

    def keys(self, step: _Step, mode: str) -> tuple[np.ndarray, np.ndarray]:
        """Each open upgrade's rank (−inf where closed) for the plan's mode."""
        g = self.st.util
        if mode == "floor":
            # The floor first: every result's values — its id form, or its full text when that is no longer
            # than its id form — most useful first; only then full texts on top of id forms.
            floor_full = step.f_ok & (self.form == 0) & ~self.has_ids
            if step.i_ok.any() or floor_full.any():
                step.f_ok = floor_full
                return np.where(step.f_ok, g, -np.inf), np.where(step.i_ok, g, -np.inf)
        if mode == "dense":
            kf, ki = _per_token(step.to_full_dv, step.to_full_dc), _per_token(step.to_ids_dv, step.to_ids_dc)
        else:
            kf, ki = step.to_full_dv.astype(np.float64), (step.to_ids_dv * np.ones(len(g))).astype(np.float64)
        return np.where(step.f_ok, kf, -np.inf), np.where(step.i_ok, ki, -np.inf)

    def to_full(self, i: int, step: _Step, diversity: float) -> None:
        if self.lost_to is not None and self.lost_sim is not None and self.pick_sim is not None:
            losers = step.f_ok.copy()
            losers[i] = False
            self.lost_to[losers] = i
            self.lost_sim[losers] = self.dmax[losers]
            self.pick_sim[i] = self.dmax[i]
        self.picks.append((i, float(self.st.util[i] - diversity * self.dmax[i])))
        self.total += float(step.to_full_dv[i])
        self.current += int(step.to_full_dc[i])
        self.form[i] = 2
        if diversity != 0.0:
            np.maximum(self.dmax, matvec(self.st.embs, self.st.embs[i]), out=self.dmax)

    def to_ids(self, i: int, step: _Step) -> None:
        self.total += float(step.to_ids_dv[i])
        self.current += int(step.to_ids_dc[i])
        self.form[i] = 1

    def choice(self) -> Choice:
        reserved = {int(i): "ids" for i in np.flatnonzero(self.form == 1).tolist()}
        return Choice(self.form == 2, self.picks, self.total, self.lost_to, self.lost_sim, self.pick_sim, reserved)


def _per_token(dv: np.ndarray, dc: np.ndarray) -> np.ndarray:
    """Value per token (the dense order); an upgrade that costs nothing comes first, a losing one by its loss."""
    cost = np.maximum(dc, 1).astype(np.float64)
    return np.where(dv > 0, np.where(dc <= 0, np.inf, dv / cost), dv * cost)


class ContextRenderPlus(ContextRender):
    """ContextRender with a per-tool reuse prior, lexical relevance, packing, and tabular forms, stubs and
    compacted forms for omitted results — each a switch (see the module docstring)."""

    def __init__(self, *, packing: bool = True, stubs: bool = True, tabular: bool = True, lexical: float = 1.0,
                 id_forms: bool = False, id_value: float = 0.8,
                 learned_prior: float = 0.0, learned_strength: float = 2.0, learned_id_value: bool = False,
                 compact_omitted: bool = True, tabular_cap: bool = False, stub_max_values: int = 12,
                 tool_prior: Mapping[str, float] | None = None, prior_weight: float = 0.0,
                 prior_default: float = 0.0, session_prior: float = 0.0,
                 prior_min_age: int = 0, use_call_prior: bool = True,
                 call_prior: Mapping[str, Mapping[str, float]] | None = None,
                 embedder: Any = None, compactor: Compactor | None = None,
                 name: str = "contextrender_plus", **kwargs: Any) -> None:
        if stub_max_values < 0:
            raise ValueError(f"stub_max_values must be ≥ 0, got {stub_max_values}")
        self.packing = bool(packing)
        self.id_forms = bool(id_forms)
        self.id_value = float(id_value)
        if not 0.0 <= self.id_value <= 1.0:
            raise ValueError(f"id_value must lie in [0, 1], got {id_value}")
        self.learned_prior = float(learned_prior)
        self.learned_strength = float(learned_strength)
        self.learned_id_value = bool(learned_id_value)
        if self.learned_strength <= 0:
            raise ValueError(f"learned_strength must be positive, got {learned_strength}")
        self._siblings: OrderedDict[tuple[str, str, int], tuple[str, ...]] = OrderedDict()
        self._learned: OrderedDict[tuple[str, str, int], dict[str, Learned]] = OrderedDict()
        self._ids: OrderedDict[tuple[str, str, int, str, str], tuple[str, int]] = OrderedDict()
        self.stubs = bool(stubs)
        self.tabular = bool(tabular)
        self.lexical = float(lexical)
        self.compact_omitted = bool(compact_omitted)
        self.tabular_cap = bool(tabular_cap)
        self.stub_max_values = int(stub_max_values)
        self.tool_prior = {str(k): float(v) for k, v in dict(tool_prior or {}).items()}
        self.prior_weight = float(prior_weight)
        self.prior_default = float(prior_default)
        self.session_prior = float(session_prior)
        self.prior_min_age = int(prior_min_age)
        self.use_call_prior = bool(use_call_prior)
        self.call_prior = {str(t): {str(w): float(p) for w, p in dict(ws).items()}
                           for t, ws in dict(call_prior or {}).items()}
        # Probabilities, checked once here: the attributes are fixed after construction (caches below).
        if not 0.0 <= self.prior_default <= 1.0:
            raise ValueError(f"prior_default: P must lie in [0, 1], got {self.prior_default}")
        tables = [("tool_prior", self.tool_prior)] + [(f"call_prior[{t!r}]", ws) for t, ws in self.call_prior.items()]
        for where, table in tables:
            bad = [k for k, p in table.items() if not 0.0 <= p <= 1.0]
            if bad:
                raise ValueError(f"{where}: P must lie in [0, 1] (keys {bad[:3]})")
        # Per-result caches (results never change); bounded, so a long-lived server does not grow them forever.
        self._values: OrderedDict[tuple[str, str, int, str], tuple[str, ...]] = OrderedDict()
        self._tables: OrderedDict[tuple[str, str, int, str], tuple[str, int] | None] = OrderedDict()
        self._call_p: OrderedDict[tuple[str, str, int, str], float] = OrderedDict()
        terms = []
        if self.lexical != 0.0:
            terms.append(self._lexical_term)
        if self.prior_weight != 0.0 or self.session_prior != 0.0:
            terms.append(self._prior_term)
        if self.learned_prior != 0.0:
            terms.append(self._learned_term)
        # embedder/compactor named explicitly: build_policy injects runtime objects by signature.
        super().__init__(name=name, embedder=embedder, compactor=compactor, terms=tuple(terms),
                         chooser=self._ids_chooser if self.id_forms else (self._packing_chooser if self.packing else None),
                         filler=self._fill_omitted if (self.stubs or self.tabular or self.compact_omitted or self.id_forms) else None,
                         compacts=self.compacts_oversized if self.id_forms else None, **kwargs)

    # -- helpers -----------------------------------------------------------------

    def values_of(self, session: Session, seq: int) -> tuple[str, ...]:
        """Qualifying values of a result, in order of first occurrence in its text (cached; results never change)."""
        key = _result_key(session, seq)
        vals = self._values.get(key)
        if vals is None:
            content = session.message(seq).content
            vals = tuple(sorted(session.result_values(seq), key=lambda v: (content.find(v), v)))
            _remember(self._values, key, vals)
        return vals

    def tabular_text(self, session: Session, seq: int) -> tuple[str, int] | None:
        """The result's tabular form and its tool message's tokens (cached), or None when it is not JSON or not
        shorter than the original."""
        key = _result_key(session, seq)
        cached = self._tables.get(key, _MISSING)  # one lookup: another thread may evict between two
        if cached is not _MISSING:
            return cached  # type: ignore[return-value]
        form = tabulate(session.message(seq).content)
        hit = None
        if form is not None and (n := text_message_tokens(session.counter, form)) < session.result(seq).ntok:
            hit = (form, n)
        _remember(self._tables, key, hit)
        return hit

    def stub_text(self, session: Session, seq: int) -> str:
        """The omission marker (with the result's handle where the expand tool is offered, docs/method.md §16) plus up
        to ``stub_max_values`` qualifying values."""
        marker = (expand_marker if self._marker(session) is expand_marker else marker_text)(session, seq)
        vals = self.values_of(session, seq)[: self.stub_max_values]
        if not vals:
            return marker
        return f"{marker[:-1]}; values: {', '.join(vals)}]"

    def _compaction_known(self, session: Session, seq: int, cap: int) -> bool:
        """Whether the graph holds this result's compaction at ``cap`` already (using it costs nothing)."""
        if self.compactor is None:
            return False
        return session.latest_artifact("compaction", f"{seq}:{cap}:{self.compactor.name}") is not None

    def id_text(self, session: Session, seq: int) -> tuple[str, int]:
        """The result's id form (:mod:`contextrender.idform`) and its tool message's tokens (cached)."""
        handle = self._marker(session) is expand_marker  # the tool is offered: the form says how to get the rest
        key = (*_result_key(session, seq), str(handle))
        hit = self._ids.get(key)
        if hit is None:
            text = id_form(session.message(seq).content)
            if handle and text != ID_HEADER:  # docs/method.md §16: a shortened result carries its handle too
                # (an id form holding no value is no form at all: the result is omitted, its marker naming the handle)
                text = text.replace(ID_HEADER, f'{ID_HEADER[:-1]}; {EXPAND_TOOL}("{expand_handle(session, seq)}")]', 1)
            hit = (text, text_message_tokens(session.counter, text))
            _remember(self._ids, key, hit)
        return hit

    def compacts_oversized(self, session: Session, seq: int, cap: int) -> bool:
        """The selector's ``compacts`` with id forms on: an oversized result whose id form holds a value is not
        compacted up front (only by :meth:`_fill_omitted`, when the knapsack gave it neither its text nor its id
        form and its compacted form could fit in the room left). That id form keeps every value a call could pass
        on, the compacted form fewer, and each compaction is a model call charged to the task; the paper's
        fallback compacts every result larger than B, and on BFCL those calls were a fifth of the plus's cost
        for no task passed (docs/method.md §13)."""
        text, n = self.id_text(session, seq)
        return text == ID_HEADER or n >= session.result(seq).ntok  # the stored Tok of the full tool message

    def _id_costs(self, session: Session, st: Stage) -> np.ndarray:
        """Per result: Tok of its tool message as its id form — the full message when that is not longer, or when the
        id form holds no value (its header alone is no option: it would be worth β·U and keep nothing)."""
        def cost(seq: int, full: int) -> int:
            text, n = self.id_text(session, seq)
            return full if text == ID_HEADER else min(n, full)
        return np.fromiter((cost(s, int(n)) for s, n in zip(st.results, st.arrays.ntok, strict=True)),
                           dtype=np.int64, count=len(st.results))

    def _ids_chooser(self, session: Session, st: Stage, budget: int, diversity: float, trace: bool) -> Choice:
        """Step 4 with the id form as a middle option: a multiple-choice knapsack over (marker, id form, full)."""
        ids = self._id_costs(session, st)
        best: Choice | None = None
        for mode in (("floor", "plain", "dense") if self.packing else ("floor", "plain")):
            c = self._upgrade(session, st, ids, budget, diversity, mode, trace)
            if best is None or c.total > best.total + 1e-12:
                best = c
        assert best is not None
        return best

    def _upgrade(self, session: Session, st: Stage, ids: np.ndarray, budget: int, diversity: float, mode: str,
                 trace: bool) -> Choice:
        """Greedy upgrades of each candidate: marker → id form (worth β·U) → full (worth U − 0.5·D, the paper's
        gain), the best upgrade that fits first — by value (``plain``), by value per token (``dense``), or every
        result's values first, most useful first (``floor``) — until none fits.

        An id form no shorter than the full text is never an option (the full text is). Ties → older result.
        """
        plan = _Plan.start(st, ids, self.id_values(session, st), trace)
        while True:
            step = plan.candidates(budget, diversity)
            if step is None:
                break
            kf, ki = plan.keys(step, mode)
            i_f, i_i = int(np.argmax(kf)), int(np.argmax(ki))
            # the better of the two upgrades; on a tie the older result, then the lighter form
            if kf[i_f] > ki[i_i] or (kf[i_f] == ki[i_i] and i_f < i_i):
                plan.to_full(i_f, step, diversity)
            else:
                plan.to_ids(i_i, step)
        return plan.choice()

    # -- the extension points ---------------------------------------------------------

    def _lexical_term(self, session: Session, st: Stage) -> np.ndarray:
        """W_lex·(1 − exp(−k)), k = the result's qualifying values found (whole tokens) in f_t."""
        out = np.zeros(len(st.results))
        text = focus_text(session, st.scope, st.trim.kept)
        focus = match_tokens(text) if text else set()
        if not focus:
            return out
        for i in np.flatnonzero(st.cand).tolist():
            k = sum(1 for v in self.values_of(session, st.results[i]) if v in focus)
            if k:
                out[i] = 1.0 - np.exp(-float(k))
        return self.lexical * out

    def prior_of(self, tool_name: str, words: frozenset[str] = frozenset()) -> float:
        """P(tool): the fitted per-tool reuse prior (``prior_default`` for a tool the prior never saw),
        refined by the call prior's words among ``words`` (the call's :func:`call_words`)."""
        p = self.tool_prior.get(tool_name, self.prior_default)
        fitted = self.call_prior.get(tool_name) if self.use_call_prior else None
        if not fitted or tool_name not in self.tool_prior:
            return p
        known = sorted(w for w in words if w in fitted)  # sorted: the same float sum under any hash seed
        if not known:
            return p
        base = log_odds(p)
        z = base + sum(log_odds(fitted[w]) - base for w in known)
        return 0.5 * (1.0 + math.tanh(0.5 * z))  # the logistic function, without overflow for any z

    def result_prior(self, session: Session, seq: int) -> float:
        """:meth:`prior_of` the result's tool and call words (cached; results never change)."""
        key = _result_key(session, seq)
        p = self._call_p.get(key)
        if p is None:
            r = session.result(seq)
            words: frozenset[str] = frozenset()
            if self.use_call_prior and r.tool_name in self.call_prior and r.call_seq is not None:
                call = next((tc for tc in session.message(r.call_seq).tool_calls if tc.id == r.call_id), None)
                if call is not None:
                    words = call_words(call.arguments)
            p = self.prior_of(r.tool_name, words)
            _remember(self._call_p, key, p)
        return p

    def _prior_term(self, session: Session, st: Stage) -> np.ndarray:
        """W_prior·P(tool of r), from the configured prior (nothing here reads other transcripts); for a tool
        the prior never saw, with W_sess > 0, W_sess times its smoothed reuse share in this session."""
        out = np.zeros(len(st.results))
        tools = [session.result(s).tool_name for s in st.results]
        seen: dict[str, list[int]] = {}
        if self.session_prior != 0.0:  # per tool unknown to the prior: [results so far, results already reused]
            for t, c in zip(tools, st.counts.tolist(), strict=True):
                if t not in self.tool_prior:
                    tally = seen.setdefault(t, [0, 0])
                    tally[0] += 1
                    tally[1] += int(c > 0)
        for i in np.flatnonzero(st.cand).tolist():
            t = tools[i]
            if t in seen:
                n_res, n_reused = seen[t]
                out[i] = self.session_prior * (n_reused + 2.0 * self.prior_default) / (n_res + 2.0)
            else:
                out[i] = self.prior_weight * self.result_prior(session, st.results[i])
        young = st.cand & (st.ages < self.prior_min_age)
        if young.any():
            out[young] = out[st.cand].max()
        return out

    def siblings(self, session: Session) -> tuple[str, ...]:
        """What learning from the session's graph file leaves out besides the session itself: the other
        attempts of its own harness episode (``<key>#<n>``), and every attempt of another episode that a
        later attempt superseded (a killed run's partial try), so a resumed job learns what an
        uninterrupted one would. Cached per session and number of sessions in the file."""
        ids = session.graph.session_ids()
        key = (session.graph.uid, session.id, len(ids))
        hit = self._siblings.get(key)
        if hit is None:
            latest: dict[str, int] = {}
            for s in ids:
                parsed = attempt_of(s)
                if parsed is not None:
                    latest[parsed[0]] = max(latest.get(parsed[0], parsed[1]), parsed[1])
            own = attempt_of(session.id)
            out = []
            for s in ids:
                parsed = attempt_of(s)
                if s == session.id or parsed is None:
                    continue
                if (own is not None and parsed[0] == own[0]) or parsed[1] < latest[parsed[0]]:
                    out.append(s)
            hit = tuple(out)
            _remember(self._siblings, key, hit)
        return hit

    def learned(self, session: Session, st: Stage) -> dict[str, Learned]:
        """Per tool, how often its results were reused later — in any way, by a later tool call, by the text of
        a later assistant message — over the other sessions of this graph file and this one so far (a
        result of this session counts once it is two invocations old, or reused already), each smoothed
        toward the file's pooled rate with ``learned_strength`` pseudo-results. Nothing here comes from
        outside the user's own file (:meth:`~contextrender.graph.ContextGraph.tool_reuse`)."""
        key = (session.graph.uid, session.id, len(session))
        hit = self._learned.get(key)  # one render asks twice (the prior term, the id values)
        if hit is not None:
            return hit
        counts = {t: list(astuple(c)) for t, c in session.graph.tool_reuse(exclude=self.siblings(session)).items()}
        reused = st.counts > 0
        for i, s in enumerate(st.results):  # the file counts this session's results already: drop unexposed ones
            if st.ages[i] < 2 and not reused[i]:
                c = counts.get(session.result(s).tool_name)
                if c is not None and c[0] > 0:
                    c[0] -= 1
        n_all = sum(c[0] for c in counts.values())
        a = self.learned_strength
        pooled = [(sum(c[k] for c in counts.values()) + 1.0) / (n_all + 2.0) for k in (1, 2, 3)]
        out = {t: Learned(*((c[k] + a * p0) / (c[0] + a) for k, p0 in zip((1, 2, 3), pooled, strict=True)))
               for t, c in counts.items()}
        _remember(self._learned, key, out)
        return out

    def _learned_term(self, session: Session, st: Stage) -> np.ndarray:
        """W_learn·P̂(reuse | tool of r) (:meth:`learned`): learned from the user's own sessions only."""
        out = np.zeros(len(st.results))
        if not len(st.results):
            return out
        rates = self.learned(session, st)
        for i in np.flatnonzero(st.cand).tolist():
            r = rates.get(session.result(st.results[i]).tool_name)
            out[i] = r.reuse if r is not None else 0.0
        return self.learned_prior * out

    def id_values(self, session: Session, st: Stage) -> np.ndarray:
        """Per result, what its id form is worth as a share of its full text: ``id_value``, or (learned) the
        share of its tool's later uses that were tool calls — which need its values — rather than
        assistant text, which talks about the result: (P_call + δ) / (P_call + P_text + 2δ), δ = 0.05."""
        if not self.learned_id_value:
            return np.full(len(st.results), self.id_value)
        rates = self.learned(session, st)
        out = np.full(len(st.results), 0.5)
        for i, s in enumerate(st.results):
            r = rates.get(session.result(s).tool_name)
            if r is not None:
                out[i] = (r.call + _DELTA) / (r.call + r.text + 2 * _DELTA)
        return out

    def _packing_chooser(self, session: Session, st: Stage, budget: int, diversity: float, trace: bool) -> Choice:
        """The paper's greedy, or its value-per-token variant when that one collects a higher total gain Σ R."""
        args = (st.util, st.delta, st.cand, st.embs, st.base_tokens, budget, diversity)
        plain = greedy(*args, trace=trace)
        dense = greedy(*args, density=True, trace=trace)
        return dense if dense.total > plain.total + 1e-12 else plain

    def _fill_omitted(self, room: FillRoom) -> tuple[dict[int, tuple[str, str]], Usage]:
        """Tabular forms, compacted forms and stubs in the budget left after the full results, most useful
        omitted first: each omitted result gets the first of these that fits — its tabular form (lossless),
        its compacted form (a result larger than the oversized cap), its stub."""
        st, session, budget = room.stage, room.session, room.budget
        compact = self.compact_omitted and self.compactor is not None
        out: dict[int, tuple[str, str]] = {}
        usage = Usage()
        if not (self.stubs or self.tabular or compact or self.id_forms):
            return out, usage
        current = room.current
        cap = max(1, int(self.oversized_share * budget))
        order = sorted(np.flatnonzero(st.cand & ~room.chosen).tolist(), key=lambda i: (-st.util[i], i))
        cost = {i: int(st.marker_cost[i]) for i in order}
        if room.reserved:  # first the id forms the chooser charged: they fit
            for i in order:
                if room.reserved.get(i) == "ids":
                    text, n = self.id_text(session, st.results[i])
                    if n < int(st.arrays.ntok[i]) and text != room.bodies[st.results[i]]:
                        out[st.results[i]] = (text, "ids")
                        current += n - cost[i]
                        cost[i] = n
        for i in order:
            if current >= budget:  # every option is longer than the marker it replaces: none can fit
                break
            seq = st.results[i]
            now = cost[i]
            options: list[tuple[str, str, int | None]] = []  # (text, form, its tool message's Tok if known)
            if self.tabular and (tab := self.tabular_text(session, seq)) is not None \
                    and not (self.tabular_cap and tab[1] > cap):
                options.append((tab[0], "tabular", tab[1]))
            has_ids = seq in out and out[seq][1] == "ids"
            if compact and not has_ids and int(st.arrays.ntok[i]) > cap:
                if i in st.compacted:  # oversized: already compacted by the fallback (docs/method.md §5 step 5)
                    options.append((st.compacted[i], "compacted", None))
                elif (not self.id_forms or self._compaction_known(session, seq, cap)
                      or current + MESSAGE_OVERHEAD + cap - now <= budget):
                    # A compaction is a model call: with id forms on, made only when its form (at most cap tokens)
                    # could fit (the earlier plus, the fitted profile, compacts every candidate it weighs).
                    text, u = room.compact(seq, cap)
                    usage += u
                    options.append((text, "compacted", None))
            if has_ids:
                options = options[:1] if options and options[0][1] == "tabular" else []  # only a lossless upgrade
            elif self.id_forms and (ids := self.id_text(session, seq))[0] != ID_HEADER:
                options.append((ids[0], "ids", ids[1]))
            if self.stubs and seq not in out:
                options.append((self.stub_text(session, seq), "stub", None))
            for text, form, known in options:
                if text == room.bodies[seq] or out.get(seq, (None,))[0] == text:
                    break  # no better form than the one it has
                extra = (text_message_tokens(session.counter, text) if known is None else known) - now
                if current + extra <= budget:
                    out[seq] = (text, form)
                    current += extra
                    break
        return out, usage
