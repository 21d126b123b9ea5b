"""Replay recorded traces through context policies and measure Later-Used Result Recall (docs/method.md §7).

    python -m contextrender.experiments.evaluation.replay traces=PATH budget=6000 methods=[contextrender,cr_recency] output=PATH
    contextrender replay PATH --budget 6000 --methods contextrender,cr_recency --output PATH

Both call :func:`replay_traces` (plain arguments, no Hydra app). ``PATH`` is a
file, a directory or a glob of trace files in any format of
:mod:`~contextrender.experiments.evaluation.traces` — our JSONL, τ² Results,
τ-bench (v1) results, BFCL multi-turn result files — recognised by content or
forced with ``trace_format=`` / ``--trace-format``; ``benchmark_name=`` /
``--benchmark`` names the benchmark they come from. The output records which
files were read, their formats and episodes (``sources``), the benchmark the
policies were configured for and the settings that depend on it
(``benchmark``, ``method_settings``: ACON's thresholds, docs/method.md §6).

For every episode and every assistant turn j, each policy sees exactly the
messages before assistant message j (docs/method.md §7: selectors see only turns before
j) and renders a history at budget B; the results it shows with their complete
original text form V_j. Events come from the recorded transcript
(:func:`contextrender.recall.reuse_events`), recall pools events over all traces.

Each method gets its own fresh graph session per episode (policies may store
artifacts, and none may see another's), grown incrementally turn by turn as a
live agent would grow it, and renders before every turn (stateful policies such
as summarisers evolve as they would live). Policies are built once per method.

Speed without changing a number: all policies share one embedding layer over
the on-disk cache, one compaction memo, and a memoising token counter, so the
per-method cost is the policy's own work plus its session. Before replaying,
:func:`replay_traces` reads ahead up to ``prefetch`` traces (default
:data:`PREFETCH_TRACES`: every trace of a usual run), collects every text a
policy will embed — each tool result, the task text and each turn's focus
text (:func:`likely_embedded_texts`) — and embeds the distinct ones in large
model batches once (:func:`contextrender.embed.embed_many`, a progress bar),
then serves every method from that memo. Each prefetched row and usage is
exactly what embedding the text alone gives, so the prefetch changes no
number (``tests/experiments/test_replay_prefetch.py``); a text it did not
guess is embedded when a policy asks, as without it.
Two audits guard the metric: a result claimed visible must appear with its
complete original text (else :class:`ReplayError`), and each render's history
tokens are recounted from its messages for the over-budget count.

Every render is also checked and measured for the failure modes users report
(:mod:`~contextrender.experiments.evaluation.measures`): pairing
validity is asserted (a render that splits a tool call from its result raises
:class:`~contextrender.experiments.evaluation.measures.PairingError`), and each
method's summary carries ``measures`` — identifier survival overall and by age,
the recorded re-reads its renders would have left without their earlier result
(per episode and per 100 calls), and prompt-cache prefix retention.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from contextrender import expand as expand_tool
from contextrender.billing import PROFILE_MODELS, PricesUnavailable, PromptUsage, SessionBilling, prices, total
from contextrender.embed import embed_many
from contextrender.events import SYSTEM_ROLES, Message, Usage
from contextrender.experiments.evaluation.measures import MeasureStats, MeasureTracker
from contextrender.experiments.evaluation.recall import AGE_BINS, RecallStats, count_events, recall, reuse_events
from contextrender.experiments.evaluation.traces import Episode, TraceSet, format_title, open_traces
from contextrender.graph import ContextGraph, Session
from contextrender.render import Rendered, Scope, task_index, task_text
from contextrender.tokens import DEFAULT_ENCODING, TokenCounter

log = logging.getLogger(__name__)

#: Traces :func:`replay_traces` reads ahead and embeds in one go (every trace of a usual run; the
#: memo of one window's vectors, ~1.5 kB per distinct text with MiniLM, is the memory it costs).
PREFETCH_TRACES = 2000

#: The name the hindsight ceiling is replayed under (reported apart from the methods, never a policy).
CEILING_NAME = "hindsight ceiling"
#: The same bound under the prose-first verbatim trim (render.fit_verbatim), replayed beside the ceiling
#: when a method trims that way (contextrender_plus): what any selector with THAT trim could cover.
TRIM_CEILING_NAME = "hindsight ceiling, prose-first trim"
#: The method a replay with the ceiling measures "gap covered" from (when it is among the methods).
GAP_REFERENCE = "contextrender"
#: The profiles each method's renders are billed under (docs/method.md §14; ``none`` is the prompt tokens alone).
BILLED_PROFILES = ("anthropic", "openai", "none")


class ReplayError(RuntimeError):
    """A policy's render contradicts itself (claims a result visible that it did not show in full)."""


@dataclass
class MethodTally:
    """What one method did over all replayed episodes."""

    name: str
    budgeted: bool
    stats: RecallStats = field(default_factory=RecallStats)
    measures: MeasureStats = field(default_factory=MeasureStats)  # the failure-mode measures
    renders: int = 0
    tokens_sum: int = 0
    tokens_max: int = 0
    over_budget: int = 0
    seconds: float = 0.0
    warned: bool = False  # logged a token-count disagreement already
    #: events covered per replayed trace, in replay order (the gap share's bootstrap resamples traces)
    hits_per_trace: list[int] = field(default_factory=list)
    #: per billing profile, each replayed trace's requests as billed (docs/method.md §14), in replay order
    billed_per_trace: dict[str, list[PromptUsage]] = field(default_factory=dict)
    #: expand calls billed (a replay with the tool offered: one per result a turn's hidden values wait on)
    expansions: int = 0

    def add_render(self, tokens: int, audited: int, budget: int) -> None:
        self.renders += 1
        self.tokens_sum += tokens
        self.tokens_max = max(self.tokens_max, tokens)
        if max(tokens, audited) > budget:
            self.over_budget += 1

    def summary(self) -> dict[str, Any]:
        readiness = self.measures.readiness.summary()
        return {
            "call_readiness": readiness["call_readiness"],
            "trace_readiness": readiness["trace_readiness"],
            "readiness": readiness,
            "recall": self.stats.pct,
            "recall_by_age": self.stats.pct_by_age,
            "mean_rendered_tokens": self.tokens_sum / self.renders if self.renders else None,
            "max_rendered_tokens": self.tokens_max if self.renders else None,
            "over_budget_renders": self.over_budget,
            "renders": self.renders,
            "measures": self.measures.summary(),
            "hits_per_trace": list(self.hits_per_trace),
            "expansions_billed": self.expansions,
        }


@dataclass
class ReplayResult:
    budget: int
    traces: int
    events: RecallStats  # pooled event counts over all episodes (see count_events)
    skipped_lines: int  # malformed records skipped (lines, or records of a JSON document)
    methods: dict[str, MethodTally]
    #: set by :func:`replay_traces`: files read (path, format, episodes, skipped, excluded) and ignored
    sources: dict[str, Any] | None = None
    benchmark: dict[str, Any] | None = None  # {"name", "from"}: what benchmark-dependent settings used
    method_settings: dict[str, dict[str, Any]] | None = None  # per method, settings chosen for the benchmark
    #: the hindsight ceiling's tally (not a policy: experiments/evaluation/ceiling.py), when replayed with one
    ceiling: MethodTally | None = None
    #: the ceiling under the prose-first trim, when a replayed method uses that trim (see TRIM_CEILING_NAME)
    trim_ceiling: MethodTally | None = None
    #: the methods that trim prose-first (their own-trim gap is measured against trim_ceiling)
    prose_first: tuple[str, ...] = ()
    #: each replayed trace's task id and place ("file:line"), in replay order: hits_per_trace's order
    trace_ids: list[str] = field(default_factory=list)
    trace_where: list[str] = field(default_factory=list)
    #: per replayed trace, whether its history exceeded B before some turn (the cost set T, docs/method.md §7)
    exceeded_per_trace: list[bool] = field(default_factory=list)
    #: per replayed trace, whether its line carries the agent's tool definitions (each request is billed with them)
    tools_per_trace: list[bool] = field(default_factory=list)
    #: the model whose prices bill each profile (docs/method.md §14)
    billing_models: Mapping[str, str] = field(default_factory=lambda: dict(PROFILE_MODELS))
    #: the methods replayed with the expand tool offered (their markers carry handles; docs/method.md §16)
    expand: tuple[str, ...] = ()

    def billing(self) -> dict[str, Any]:
        """Per method and billing profile, over T (the traces whose history exceeded B): the requests as billed,
        their cache-hit share (read / prompt tokens), US$ at the profile model's prices, and that cost as a ratio
        of Full's (a ratio of sums over the same traces) when Full was replayed. Output tokens are the recorded
        assistant turns'. Prices need litellm's cost map; without it the US$ figures are None."""
        chosen = [i for i, x in enumerate(self.exceeded_per_trace) if x]
        out: dict[str, Any] = {"traces_T": len(chosen), "models": dict(self.billing_models), "methods": {},
                               "traces_T_with_tools": sum(1 for i in chosen if i < len(self.tools_per_trace)
                                                          and self.tools_per_trace[i])}
        price = {}
        for profile, model in self.billing_models.items():
            try:
                price[profile] = prices(model)
            except PricesUnavailable as e:
                out.setdefault("note", str(e))
        usd: dict[str, dict[str, float | None]] = {}
        for name, tally in self.methods.items():
            per: dict[str, Any] = {}
            for profile, rows in tally.billed_per_trace.items():
                u = total(rows[i] for i in chosen if i < len(rows))
                cost = price[profile].cost(u) if profile in price else None
                usd.setdefault(name, {})[profile] = cost
                per[profile] = {"usage": u.to_dict(), "cache_hit_share": u.cache_read / u.prompt if u.prompt else None,
                                "usd": cost}
            out["methods"][name] = per
        full = usd.get("full", {})
        for per in out["methods"].values():
            for profile, row in per.items():
                ref = full.get(profile)
                row["vs_full"] = row["usd"] / ref if row["usd"] is not None and ref else None
        return out

    def _shares(self, bound: MethodTally | None, names: Iterable[str],
                reference: str | None) -> dict[str, float | None] | None:
        """Each of ``names``' share (%) of the gap between ``reference`` and ``bound`` (None: no gap); None
        without the bound, without the reference among the methods, or with recall undefined."""
        ref = reference or GAP_REFERENCE
        if bound is None or ref not in self.methods:
            return None
        from contextrender.experiments.evaluation.ceiling import gap_covered

        base, top = self.methods[ref].stats.pct, bound.stats.pct
        if base is None or top is None:  # no reuse event at all: nothing to cover, nothing to say
            return None
        # A method that ignores B (Full) is not bounded by a ceiling under B: no share for it.
        return {name: gap_covered(self.methods[name].stats.pct, base, top)
                for name in names if name in self.methods and name != ref and self.methods[name].budgeted}

    def _intervals(self, bound: MethodTally | None, names: Iterable[str],
                   reference: str | None) -> dict[str, tuple[float, float] | None] | None:
        """As :meth:`_shares`, each share's 95 % interval (a paired bootstrap over traces,
        :func:`~contextrender.experiments.evaluation.ceiling.gap_interval`; None: no gap, too few traces
        holding the gap, or too few draws with one)."""
        shares = self._shares(bound, names, reference)
        if shares is None or bound is None:
            return None
        from contextrender.experiments.evaluation.ceiling import gap_interval

        ref = self.methods[reference or GAP_REFERENCE].hits_per_trace
        return {name: gap_interval(self.methods[name].hits_per_trace, ref, bound.hits_per_trace)
                if g is not None else None for name, g in shares.items()}

    def gap_trace_count(self, own_trim: bool = False, reference: str | None = None) -> int | None:
        """How many traces hold some of the gap between ``reference`` and the ceiling (``own_trim``: the
        prose-first one); None without that ceiling or the reference."""
        bound = self.trim_ceiling if own_trim else self.ceiling
        ref = self.methods.get(reference or GAP_REFERENCE)
        if bound is None or ref is None:
            return None
        from contextrender.experiments.evaluation.ceiling import gap_traces

        return gap_traces(ref.hits_per_trace, bound.hits_per_trace)

    def gap_intervals(self, reference: str | None = None) -> dict[str, tuple[float, float] | None] | None:
        """:meth:`gap_covered`'s 95 % intervals (paired bootstrap over traces)."""
        return self._intervals(self.ceiling, self.methods, reference)

    def own_trim_gap_intervals(self, reference: str | None = None) -> dict[str, tuple[float, float] | None] | None:
        """:meth:`own_trim_gap_covered`'s 95 % intervals (paired bootstrap over traces)."""
        return self._intervals(self.trim_ceiling, self.prose_first, reference)

    def own_trim_gap_covered(self, reference: str | None = None) -> dict[str, float | None] | None:
        """As :meth:`gap_covered`, for each prose-first method, against the ceiling under its own trim."""
        return self._shares(self.trim_ceiling, self.prose_first, reference)

    def gap_covered(self, reference: str | None = None) -> dict[str, float | None] | None:
        """Per method other than ``reference`` (default :data:`GAP_REFERENCE`), the share of the gap
        between it and the hindsight ceiling the method covers, in % (None: no gap); None without a
        ceiling or without the reference among the methods."""
        return self._shares(self.ceiling, self.methods, reference)

    def to_json(self) -> dict[str, Any]:
        out = {
            "budget": self.budget,
            "traces": self.traces,
            "events": self.events.events,
            "events_by_age": dict(self.events.events_by_age),
            "skipped_lines": self.skipped_lines,
            "methods": {name: t.summary() for name, t in self.methods.items()},
            "trace_ids": list(self.trace_ids),
            "trace_where": list(self.trace_where),
            "billing": self.billing(),
            "expand": list(self.expand),
        }
        if self.ceiling is not None:
            out["ceiling"] = self.ceiling.summary()
            gaps = self.gap_covered()
            if gaps is not None:
                out["gap_covered"] = {"reference": GAP_REFERENCE, "methods": gaps,
                                      "interval": _interval_json(self.gap_intervals(), self.gap_trace_count())}
        if self.trim_ceiling is not None:
            out["ceiling_prose_first_trim"] = self.trim_ceiling.summary()
            own = self.own_trim_gap_covered()
            if own is not None:
                out["gap_covered_own_trim"] = {"reference": GAP_REFERENCE, "methods": own,
                                               "interval": _interval_json(self.own_trim_gap_intervals(),
                                                                          self.gap_trace_count(own_trim=True))}
        # Only a replay of files has these; a replay of in-memory episodes (make plus) keeps its old keys.
        if self.sources is not None:
            out["sources"] = self.sources
            out["benchmark"] = self.benchmark
            out["method_settings"] = self.method_settings or {}
        return out


class _MemoCounter(TokenCounter):
    """The project's token counter, memoised; counts are identical to :class:`TokenCounter`'s.

    Every method's session of an episode stores the same messages, and every
    render re-counts what it assembles; memoising texts (and plain-string
    messages, keyed on what their count depends on) makes each cost one
    tokenisation per episode instead of one per method and render.
    """

    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        super().__init__(encoding)
        self._texts: dict[str, int] = {}
        self._messages: dict[tuple[Any, ...], int] = {}

    def clear(self) -> None:
        self._texts.clear()
        self._messages.clear()

    def text(self, text: str) -> int:
        n = self._texts.get(text)
        if n is None:
            n = self._texts[text] = super().text(text)
        return n

    def message(self, msg: Message | dict[str, Any]) -> int:
        key = self._message_key(msg) if isinstance(msg, dict) else None
        if key is None:
            return super().message(msg)
        n = self._messages.get(key)
        if n is None:
            n = self._messages[key] = super().message(msg)  # validates the first occurrence
        return n

    @staticmethod
    def _message_key(msg: dict[str, Any]) -> tuple[Any, ...] | None:
        content = msg.get("content")
        if content is not None and not isinstance(content, str):
            return None  # content parts: let the counter normalise them
        calls = []
        for c in msg.get("tool_calls") or ():
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
                return None
            calls.append((fn["name"], fn["arguments"]))
        return (msg.get("role"), msg.get("tool_call_id"), content, tuple(calls))


class MemoCompactor:
    """Shares compactions across the methods' sessions of a run (same text, same cap → same output).

    The context graph keeps compactions per session; without this every method
    would recompute (or, with an LLM compactor, re-buy) the same summary.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self._memo: dict[tuple[str, int, str | None], tuple[str, Usage]] = {}
        # The extractive stand-in tokenises every line it weighs, and successive summaries of an
        # episode weigh the same lines again: give it the memoising counter (same counts).
        counter = getattr(inner, "counter", None)
        if type(counter) is TokenCounter:
            inner.counter = _MemoCounter(counter.encoding_name)

    def clear(self) -> None:
        self._memo.clear()
        if isinstance(getattr(self.inner, "counter", None), _MemoCounter):
            self.inner.counter.clear()

    def compact(self, text: str, max_tokens: int, *, instructions: str | None = None) -> tuple[str, Usage]:
        key = (text, max_tokens, instructions)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self.inner.compact(text, max_tokens, instructions=instructions)
        return hit


class SharedEmbeddings:
    """An in-memory layer over the run's cached embedder, shared by every policy.

    Each text's vector and (logical) usage are kept until :meth:`clear`, so N
    policies cost one embedding per text. :meth:`prefetch` fills the memo ahead
    of the renders in large batches; texts it did not get are embedded when a
    policy asks (several at once in one batch). Either way a text's row and
    usage are those of ``inner.embed_documents([text])`` (see
    :func:`contextrender.embed.embed_many`). ``counts``: texts prefetched,
    texts embedded on demand, and lookups served from the memo.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        # The built-in backends clip to max_chars themselves (memo keys must clip alike); an embedder
        # written to the Embedder protocol alone has no max_chars and gets the texts as they are.
        self.max_chars: int | None = getattr(inner, "max_chars", None)
        self._memo: dict[str, tuple[np.ndarray, Usage]] = {}
        self.counts = {"prefetched": 0, "on_demand": 0, "served": 0}

    def clear(self) -> None:
        self._memo.clear()

    def _clip(self, texts: Iterable[str]) -> list[str]:
        return list(texts) if self.max_chars is None else [t[: self.max_chars] for t in texts]

    def _fill(self, texts: list[str], progress: Callable[[int, int], None] | None = None) -> None:
        if len(texts) == 1:
            vecs, usage = self.inner.embed_documents(texts)
            self._memo[texts[0]] = (vecs[0], usage)
            return
        vecs, usages = embed_many(self.inner, texts, progress=progress)
        for t, v, u in zip(texts, vecs, usages, strict=True):
            self._memo[t] = (v, u)

    def prefetch(self, texts: Iterable[str], progress: Callable[[int, int], None] | None = None) -> int:
        """Embed the distinct ``texts`` not yet in the memo in large batches; returns how many.

        ``progress(done, total)``: texts the model embedded so far (an on-disk cache's hits excluded).
        """
        missing = list(dict.fromkeys(t for t in self._clip(texts) if t not in self._memo))
        if missing:
            self._fill(missing, progress)
        self.counts["prefetched"] += len(missing)
        return len(missing)

    def embed_documents(self, texts: list[str]) -> tuple[np.ndarray, Usage]:
        clipped = self._clip(texts)
        missing = list(dict.fromkeys(t for t in clipped if t not in self._memo))
        if missing:
            self._fill(missing)
        self.counts["on_demand"] += len(missing)
        self.counts["served"] += len(clipped) - len(missing)
        if not clipped:
            return np.zeros((0, self.dim), dtype=np.float32), Usage()
        usage = Usage()
        for t in clipped:
            usage = usage + self._memo[t][1]
        return np.stack([self._memo[t][0] for t in clipped]), usage

    def embed_query(self, text: str) -> tuple[np.ndarray, Usage]:
        vecs, usage = self.embed_documents([text])
        return vecs[0], usage


@dataclass
class Shared:
    """What a run's policies share: one embedding layer and one compaction memo (either may be None).

    :meth:`prewarm` embeds the likely texts of the episodes about to be replayed
    in large batches before their renders; :meth:`clear` drops the memos after
    them so memory stays bounded.
    """

    embedder: SharedEmbeddings | None = None
    compactor: MemoCompactor | None = None

    def prewarm(self, episodes: Episode | Sequence[Episode], progress: bool = False,
                budget: int | None = None) -> int:
        """Embed every text :func:`likely_embedded_texts` expects of ``episodes`` (one or several) at once.

        ``budget``: leave out the queries of turns whose full history fits it. Returns the
        number of texts embedded; ``progress``: a tqdm bar over them on stderr.
        """
        if self.embedder is None:
            return 0
        eps = [episodes] if isinstance(episodes, Episode) else list(episodes)
        texts = [t for e in eps for t in likely_embedded_texts(e, budget=budget)]
        if not progress:
            return self.embedder.prefetch(texts)
        with tqdm(desc=f"embed {len(eps)} traces", unit="text", file=sys.stderr, dynamic_ncols=True,
                  leave=False, position=1) as bar:

            def tick(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            return self.embedder.prefetch(texts, tick)

    def clear(self) -> None:
        if self.embedder is not None:
            self.embedder.clear()
        if self.compactor is not None:
            self.compactor.clear()


def method_configs(methods: Sequence[str], overrides: Mapping[str, Mapping[str, Any]] | None = None,
                   benchmark: str | None = None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(name → method config, name → benchmark-dependent settings used) for registry methods.

    ``benchmark`` selects what depends on it — today ACON's thresholds
    (:func:`contextrender.baselines.acon.resolve_thresholds`, docs/method.md §6); None
    means no benchmark is known (ACON: AppWorld's values).
    """
    from contextrender.baselines.acon import resolve_thresholds
    from contextrender.registry import method_config

    if len(set(methods)) != len(methods):
        raise ValueError(f"methods listed twice: {list(methods)}")
    cfgs: dict[str, Any] = {}
    settings: dict[str, dict[str, Any]] = {}
    for name in methods:
        cfg = method_config(name, dict((overrides or {}).get(name, {}) or {}))
        used = resolve_thresholds(cfg, benchmark)
        if used is not None:
            settings[name] = used
        cfgs[name] = cfg
    return cfgs, settings


def build_policies(methods: Sequence[str], overrides: Mapping[str, Mapping[str, Any]] | None = None, *,
                   embedder: Any = None, compactor: Any = None,
                   benchmark: str | None = None) -> tuple[dict[str, Any], Shared]:
    """Build each method once from ``conf/method/<name>.yaml`` (any name there works).

    All policies get one :class:`SharedEmbeddings` over ``embedder`` and one
    :class:`MemoCompactor` over ``compactor``; pass the returned :class:`Shared`
    to :func:`replay`. Its embedder is None when no policy takes one (nothing to prewarm).
    ``benchmark``: see :func:`method_configs`.
    """
    from hydra.utils import get_class

    from contextrender.registry import build_policy

    cfgs, _ = method_configs(methods, overrides, benchmark)
    shared_emb = SharedEmbeddings(embedder) if embedder is not None else None
    memo_compactor = MemoCompactor(compactor) if compactor is not None else None
    policies: dict[str, Any] = {}
    uses_embedder = False
    for name, cfg in cfgs.items():
        uses_embedder = uses_embedder or "embedder" in inspect.signature(get_class(cfg._target_)).parameters
        policies[name] = build_policy(cfg, embedder=shared_emb, compactor=memo_compactor)
    return policies, Shared(shared_emb if uses_embedder else None, memo_compactor)


def history_tokens(session: Session, rendered: Rendered) -> int:
    """Tok(H_t) recounted from the rendered messages: all but the system prompt and current user message."""
    scope = Scope.of(session)
    outside = sum(session.ntok(s) for s in scope.system)
    if scope.current is not None:
        outside += session.ntok(scope.current)
    return session.counter.messages(list(rendered.messages)) - outside


def _shown_in_full(rendered: Rendered) -> set[tuple[Any, str]]:
    """(tool_call_id, content) of every tool message in the render."""
    out: set[tuple[Any, str]] = set()
    for m in rendered.messages:
        if m.get("role") == "tool":
            content = m.get("content")
            if not isinstance(content, str):
                content = Message.from_openai(m).content
            out.add((m.get("tool_call_id"), content))
    return out


def check_visible(session: Session, rendered: Rendered, where: str) -> None:
    """docs/method.md §7: r is visible only if its complete original text is in the render; enforce the claim."""
    if not rendered.visible:
        return
    shown = _shown_in_full(rendered)
    for seq in rendered.visible:
        if not session.is_result(seq):
            raise ReplayError(f"{where}: visible seq {seq} is not a tool result of the session")
        r = session.result(seq)
        if (r.call_id, session.message(seq).content) not in shown:
            raise ReplayError(f"{where}: result {seq} ({r.tool_name}) is claimed visible but its complete "
                              "original text is not in the rendered messages")


def _advance(session: Session, messages: Sequence[dict[str, Any]], upto: int) -> None:
    """Make ``session`` hold ``messages[:upto]``, adding only what it lacks.

    Same effect as ``session.sync(messages[:upto])`` on a session that only this
    loop writes, without sync's re-check of every stored message (which would
    make replaying an episode quadratic in its length).
    """
    n = len(session)
    if n > upto:
        raise ReplayError(f"session {session.id!r} holds {n} messages, more than the {upto} of this turn")
    session.extend(messages[n:upto])


#: Called after every render with (method, episode, turn j, session, rendered): for inspection and tests.
RenderHook = Callable[[str, Episode, int, Session, Rendered], None]


def replay_episode(episode: Episode, policies: Mapping[str, Any], tallies: Mapping[str, MethodTally],
                   budget: int, graph: ContextGraph | Mapping[str, ContextGraph], session_prefix: str,
                   on_render: RenderHook | None = None, expand: bool = False) -> RecallStats:
    """Replay one episode through every policy; add its renders and recall to ``tallies``.

    ``graph``: one graph for every method, or one per method (a policy that learns from the other
    sessions of its graph file must see only its own earlier episodes, never another method's
    session of this very trace). Each method's session is released from memory after the episode.
    ``expand``: offer the expand tool in the session of each method whose markers carry handles (docs/method.md
    §16), as the proxy does: its renders then give handles, its requests are billed with the tool, and the
    measures count the needed values a render hid that are one expansion away. Returns the episode's event counts.
    """
    msgs = list(episode.messages)
    events = reuse_events(msgs)
    turns = episode.assistant_indices
    counter = _MemoCounter()  # one per episode: its memo holds only this episode's texts
    for name, policy in policies.items():
        tally = tallies[name]
        t0 = time.perf_counter()
        prepare = getattr(policy, "prepare_episode", None)
        if prepare is not None:  # the hindsight ceiling learns this episode's reuse events first
            prepare(episode, events)
        g = graph if isinstance(graph, ContextGraph) else graph[name]
        session = g.session(f"{session_prefix}/{episode.line}:{episode.task_id}/{name}", counter=counter)
        offered = expand and expand_tool.gives_handles(policy)
        if offered:
            expand_tool.offer(session)
        # Each request is billed with the tool definitions it was sent with: the trace's own (where its line carries
        # them), then the expand tool where it is offered (docs/method.md §14, §16).
        tools = [*episode.tools, *([expand_tool.chat_tool()] if offered else [])] or None
        tracker = MeasureTracker(counter)
        billing = SessionBilling(BILLED_PROFILES, counter)  # docs/method.md §14: each request from what it sent
        billed: dict[str, list[PromptUsage]] = {p: [] for p in BILLED_PROFILES}
        visible: dict[int, frozenset[int]] = {}
        for j, idx in enumerate(turns):
            # docs/method.md §7: the selector sees exactly the messages before assistant message j.
            _advance(session, msgs, idx)
            rendered = policy.render(session, budget)
            where = f"{name} on {episode.where or f'line {episode.line}'} (task {episode.task_id}) before turn {j}"
            check_visible(session, rendered, where)
            marked = expand_tool.marked_results(session, rendered.messages) if offered else frozenset()
            tracker.on_render(session, rendered, where, marked)  # raises PairingError on a split call/result pair
            tracker.on_turn(msgs[idx])
            audited = history_tokens(session, rendered)
            if audited != rendered.tokens and not tally.warned:
                tally.warned = True
                log.warning("%s: policy reports %d history tokens, its messages count %d", where,
                            rendered.tokens, audited)
            tally.add_render(rendered.tokens, audited, budget)
            sent = list(rendered.messages)
            if tracker.expansions:  # the model reads them back first: one more request, the round appended
                round_ = expansion_round(session, tracker.expansions, budget, f"x{j}")
                for profile, u in billing.request(sent, tools, counter.message(round_[0])).items():
                    billed[profile].append(u)
                sent += round_
                tally.expansions += len(round_) - 1
            for profile, u in billing.request(sent, tools, counter.message(msgs[idx])).items():
                billed[profile].append(u)
            visible[j] = rendered.visible
            if on_render is not None:
                on_render(name, episode, j, session, rendered)
        g.release(session.id)
        for profile, rows in billed.items():
            tally.billed_per_trace.setdefault(profile, []).append(total(rows))
        covered = recall(events, visible)
        tally.stats = tally.stats + covered
        tally.hits_per_trace.append(covered.hits)
        tally.measures = tally.measures + tracker.stats
        tally.seconds += time.perf_counter() - t0
    return count_events(events)


def expansion_round(session: Session, wanted: Mapping[int, Sequence[str]], budget: int,
                    prefix: str) -> list[dict[str, Any]]:
    """The expand round a model would make before a turn whose needed values ``wanted`` holds (per result marked
    with a handle, the values it holds): one assistant message calling ``contextrender_expand`` per result,
    narrowed to those values, and the tool's answers (clipped as the service clips them), in OpenAI format
    (docs/method.md §16, item 5). Not recorded in the session: a replay bills the round, it does not learn from it."""
    calls, answers = [], []
    room = int(budget * expand_tool.DEFAULT_SHARE)
    for i, (seq, values) in enumerate(wanted.items()):
        words = list(dict.fromkeys(values))
        # Narrowed as the tool can narrow (at most MAX_MATCH_WORDS words, split at spaces and commas), else whole.
        narrow = len(words) <= expand_tool.MAX_MATCH_WORDS and not any(c.isspace() or c == "," for w in words
                                                                       for c in w)
        args = json.dumps({"handle": expand_tool.handle(session, seq), **({"match": " ".join(words)} if narrow else {})})
        cid = f"{prefix}_{i}"
        calls.append({"id": cid, "type": "function", "function": {"name": expand_tool.TOOL_NAME, "arguments": args}})
        try:
            text = expand_tool.expand(session, args, max_tokens=max(room // len(wanted), expand_tool.MIN_TOKENS)).text
        except expand_tool.ExpandError as e:
            text = f"error: {e}"
        answers.append({"role": "tool", "tool_call_id": cid, "content": text})
    return [{"role": "assistant", "content": None, "tool_calls": calls}, *answers]


def likely_embedded_texts(episode: Episode, task_chars: int = 2000, budget: int | None = None) -> list[str]:
    """What relevance scoring will embed during the episode, to embed in large batches up front.

    Every tool result (docs/method.md §2), the task x (the task message's words, clipped;
    docs/method.md §4, §5) and, per turn, the focus f_t as the latest user plus latest assistant
    message. With ``budget``, only the turns where a policy scores relevance:
    those with a tool result before them whose full history exceeds B (every
    policy shows the full history when it fits; docs/method.md §5 step 2), and x only if
    there is one. A policy that builds its queries differently just misses the
    memo for those: a wrong guess costs time, never a different result.
    """
    msgs = [Message.from_openai(m) for m in episode.messages]
    texts = [m.content for m in msgs if m.role == "tool"]
    needed = _over_budget_turns(msgs, budget) if budget is not None else None
    focus: list[str] = []
    last_user: Message | None = None
    last_asst: Message | None = None
    for idx, m in enumerate(msgs):
        if m.role == "assistant":  # the render before this turn sees the focus built so far
            parts = [x.text() for x in (last_user, last_asst) if x is not None]
            if parts and (needed is None or idx in needed):
                focus.append("\n".join(parts))
            last_asst = m
        elif m.role == "user":
            last_user = m
    task = task_index(msgs)
    if task is not None and (needed is None or needed):
        texts.append(task_text(msgs[task], task_chars))
    return list(dict.fromkeys(texts + focus))


def _over_budget_turns(msgs: Sequence[Message], budget: int, need_result: bool = True) -> set[int]:
    """Indices of the assistant messages before which the history (docs/method.md §1 scope, as
    :class:`~contextrender.render.Scope` draws it) holds a tool result (``need_result``) and exceeds ``budget``."""
    counter = TokenCounter()
    n_sys = 0
    while n_sys < len(msgs) and msgs[n_sys].role in SYSTEM_ROLES:
        n_sys += 1
    out: set[int] = set()
    history = 0  # tokens of msgs[n_sys:idx]
    current: int | None = None  # tokens of the latest user message (outside B)
    seen_result = False
    for idx, m in enumerate(msgs):
        if idx >= n_sys:
            if m.role == "assistant" and (seen_result or not need_result) and history - (current or 0) > budget:
                out.add(idx)
            ntok = counter.message(m)
            history += ntok
            if m.role == "user":
                current = ntok
            seen_result = seen_result or m.role == "tool"
    return out


def history_exceeds(messages: Sequence[Mapping[str, Any]], budget: int) -> bool:
    """Whether the history (docs/method.md §1 scope) exceeded ``budget`` before some assistant turn: the trace is in
    the cost set T (docs/method.md §7), as a run's ``exceeded_budget`` says of its episode."""
    return bool(_over_budget_turns([Message.from_openai(m) for m in messages], budget, need_result=False))


def _windows(episodes: Iterable[Episode], size: int) -> Iterator[list[Episode]]:
    """``episodes`` in consecutive lists of ``size`` (the last may be shorter)."""
    window: list[Episode] = []
    for e in episodes:
        window.append(e)
        if len(window) >= size:
            yield window
            window = []
    if window:
        yield window


def method_graph_path(graph_path: str | Path, method: str, methods: int) -> str:
    """The graph file of ``method``'s sessions: ``graph_path`` itself for a single method, else the
    method's name before its suffix (``graph.sqlite`` → ``graph.prune.sqlite``)."""
    p = Path(graph_path)
    if methods <= 1 or str(graph_path) == ":memory:":
        return str(graph_path)
    safe = "".join(c if c.isalnum() or c in "_-" else "_" for c in method)
    return str(p.with_name(f"{p.stem}.{safe}{p.suffix}"))


def replay(episodes: Iterable[Episode], policies: Mapping[str, Any], budget: int, graph_path: str | Path,
           *, shared: Shared | None = None, total: int | None = None, progress: bool = True,
           skipped: Any = None, on_render: RenderHook | None = None, prefetch: int = 1,
           ceiling: Any = None, trim_ceiling: Any = None, expand: bool = False) -> ReplayResult:
    """Replay ``episodes`` through ``policies`` (name → built policy) at ``budget``.

    ``shared``: what the policies were built to share (see :func:`build_policies`).
    ``prefetch``: how many episodes to read ahead and prewarm ``shared`` for in one go
    (their likely embedded texts in large batches, :meth:`Shared.prewarm`); its memos are
    cleared after each such window. 1 (the default) takes ``episodes`` one at a time, so a
    generator that prepares each episode as it is yielded still works; 0 prewarms nothing
    (every text is embedded when a policy asks). No setting changes a result.
    ``skipped``: an object whose ``.skipped`` is read after iteration (a
    :class:`~contextrender.experiments.evaluation.traces.TraceReader`).
    ``ceiling``: a :class:`~contextrender.experiments.evaluation.ceiling.HindsightCeiling` replayed
    with the policies (same renders, audits and measures) and reported apart, as ``result.ceiling``;
    ``trim_ceiling`` the same bound under the prose-first trim, as ``result.trim_ceiling``.
    ``expand``: the expand tool offered where a method's markers carry handles (:func:`replay_episode`).
    """
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be an integer ≥ 0, got {prefetch!r}")
    if ceiling is not None:
        if CEILING_NAME in policies:
            raise ValueError(f"{CEILING_NAME!r} names the hindsight ceiling; a policy cannot have that name")
        policies = {**policies, CEILING_NAME: ceiling}
    if trim_ceiling is not None:
        if TRIM_CEILING_NAME in policies:
            raise ValueError(f"{TRIM_CEILING_NAME!r} names a hindsight ceiling; a policy cannot have that name")
        policies = {**policies, TRIM_CEILING_NAME: trim_ceiling}
    prose_first = tuple(name for name, p in policies.items()
                        if getattr(p, "trim_prose_first", False) and name not in (CEILING_NAME, TRIM_CEILING_NAME))
    tallies = {name: MethodTally(name, bool(getattr(p, "budgeted", True))) for name, p in policies.items()}
    pooled = RecallStats()
    prefix = f"replay-{uuid.uuid4().hex[:12]}"  # never resume sessions of an earlier run in the same file
    n = 0
    exceeded: list[bool] = []
    with_tools: list[bool] = []
    ids: list[str] = []
    places: list[str] = []
    bar = tqdm(total=total, desc=f"replay B={budget}", unit="trace", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    # One graph file per method, as each would be deployed alone: what a learning policy reads of the
    # file's other sessions is its own earlier episodes only. Sessions are named by position (unique
    # across trace files) and released after their episode, so memory stays bounded.
    graphs = {name: ContextGraph(method_graph_path(graph_path, name, len(policies))) for name in policies}
    try:
        for window in _windows(episodes, max(prefetch, 1)):
            if shared is not None and prefetch:
                shared.prewarm(window, progress=progress and len(window) > 1, budget=budget)
            for episode in window:
                pooled = pooled + replay_episode(episode, policies, tallies, budget, graphs, f"{prefix}/{n}",
                                                 on_render, expand)
                exceeded.append(history_exceeds(episode.messages, budget))
                with_tools.append(bool(episode.tools))
                n += 1
                ids.append(episode.task_id)
                places.append(episode.where)
                bar.update(1)
            if shared is not None:
                shared.clear()
    finally:
        for g in graphs.values():
            g.close()
    if bar.total is not None and bar.total != n:
        # ``total`` counts lines: the bad, superseded and excluded ones among them are never replayed
        bar.total = n
        bar.refresh()
    bar.close()
    bound = tallies.pop(CEILING_NAME) if ceiling is not None else None
    trim_bound = tallies.pop(TRIM_CEILING_NAME) if trim_ceiling is not None else None
    return ReplayResult(budget, n, pooled, int(getattr(skipped, "skipped", 0) or 0), tallies, ceiling=bound,
                        trim_ceiling=trim_bound, prose_first=prose_first, trace_ids=ids, trace_where=places,
                        exceeded_per_trace=exceeded, tools_per_trace=with_tools,
                        expand=tuple(name for name, p in policies.items() if expand and expand_tool.gives_handles(p)))


# -- report -------------------------------------------------------------------------

_BIN_LABELS = {"le3": "≤3", "4_10": "4–10", "11_25": "11–25", "gt25": ">25"}


def _fmt(x: float | None, ref: float | None = None) -> str:
    s = "–" if x is None else f"{x:.1f}"
    return s if ref is None else f"{s} ({ref:.1f})"


def _sources_lines(result: ReplayResult) -> list[str]:
    """One line per file read (format, episodes) and one for the files ignored; none without sources."""
    if not result.sources:
        return []
    lines = [""]
    for f in result.sources["files"]:
        extra = [f"{f['skipped']} skipped"] if f["skipped"] else []
        extra += [f"{n} excluded ({r})" for r, n in (f.get("excluded") or {}).items()]
        lines.append(f"- {f['path']}: {format_title(f['format'])}, {f['episodes']} episodes" + (f" ({'; '.join(extra)})" if extra else ""))
    if result.sources["ignored"]:
        lines.append(f"- {len(result.sources['ignored'])} files ignored (not trace files)")
    bench = result.benchmark or {}
    if result.method_settings:
        lines.append(f"- benchmark {bench.get('name')} ({bench.get('from')}): "
                     + "; ".join(f"{m} " + ", ".join(f"{k}={v}" for k, v in s.items()) for m, s in result.method_settings.items()))
    return lines


def _interval_json(intervals: Mapping[str, tuple[float, float] | None] | None,
                   gap_traces: int | None) -> dict[str, Any]:
    """The gap shares' intervals as written to JSON, with how they were computed and how many traces
    hold the gap (none is given below ``min_traces``)."""
    from contextrender.experiments.evaluation.ceiling import (
        GAP_CI_DRAWS,
        GAP_CI_LEVEL,
        GAP_CI_MIN_TRACES,
        GAP_CI_SEED,
    )

    return {"level": GAP_CI_LEVEL, "method": "percentile, paired bootstrap over traces", "draws": GAP_CI_DRAWS,
            "seed": GAP_CI_SEED, "min_traces": GAP_CI_MIN_TRACES, "gap_traces": gap_traces,
            "methods": {k: None if v is None else list(v) for k, v in (intervals or {}).items()}}


def _few_traces_text(count: int | None) -> str:
    from contextrender.experiments.evaluation.ceiling import GAP_CI_MIN_TRACES

    if count is None or count >= GAP_CI_MIN_TRACES:
        return ""
    return (f" The gap lies in {count} trace{'' if count == 1 else 's'}: too few for an interval "
            f"(one needs {GAP_CI_MIN_TRACES}).")


def _shares_text(gaps: Mapping[str, float | None],
                 intervals: Mapping[str, tuple[float, float] | None] | None = None) -> str:
    def one(name: str, g: float | None) -> str:
        if g is None:
            return f"{name} no gap"
        ci = (intervals or {}).get(name)
        return f"{name} {g:.0f} %" + ("" if ci is None else f" (95 % CI {ci[0]:.0f} to {ci[1]:.0f} %)")

    return ", ".join(one(name, g) for name, g in gaps.items())


#: What recall never counts, said next to every recall figure (docs/method.md §7's eligible tokens).
RECALL_DIGIT_RULE = ("Recall counts only tokens of ≥ 6 characters of [A-Za-z0-9_] with an uppercase letter or an "
                     "underscore: digit-only ids, lower-case words and numbers never count, so a render that hides "
                     "the item id the next call needs can still score 100.")


def readiness_lines(result: ReplayResult) -> list[str]:
    """The call-readiness table (overall, trace readiness, and by the age of the oldest need)."""
    rows = list(result.methods.items())  # the hindsight ceiling bounds recall, not readiness: not shown here
    if not rows:
        return []
    first = rows[0][1].measures.readiness
    lines = ["", f"Call readiness: {first.needing} of {first.calls} recorded tool calls needed a value that only an "
                 f"earlier tool result held ({first.needing_traces} of {first.traces} traces); a call is ready when "
                 "every such value occurs, as a whole token (numbers by value), anywhere in the render before it "
                 "(docs/method.md, \"Call readiness\"). Trace readiness: % of traces whose every needing call was "
                 "ready. By the age of the call's oldest need:",
             "",
             "| method | call ready % | trace ready % | " + " | ".join(_BIN_LABELS[b] for b in AGE_BINS) + " |",
             "|---|" + "---:|" * (2 + len(AGE_BINS))]
    for name, t in rows:
        r = t.measures.readiness.summary()
        lines.append(f"| {name} | {_fmt(r['call_readiness'])} | {_fmt(r['trace_readiness'])} | "
                     + " | ".join(_fmt(r["call_readiness_by_age"][b]) for b in AGE_BINS) + " |")
    return lines


def markdown_table(result: ReplayResult, paper: Mapping[str, Any] | None = None) -> str:
    """The recall table; paper Table 2 values in parentheses where the method and budget match.

    The paper's values are read with pandas (``contextrender.experiments.paper``); without it
    (the ``[service]`` extra alone) the table simply has no paper values.
    """
    try:
        from contextrender.experiments.paper import RECALL_AGE_METRICS, RECALL_METRIC, paper_value
    except ImportError as e:
        if paper:
            log.info("paper values omitted from the table: %s", e)
        paper = None
        RECALL_METRIC = ""
        RECALL_AGE_METRICS = dict.fromkeys(AGE_BINS, "")

    def ref(method: str, metric: str) -> float | None:
        if not paper:
            return None
        return paper_value(paper["table"], paper["model"], paper["benchmark"], method, metric, budget=result.budget)

    lines = [f"Replay at B={result.budget}: {result.traces} traces, {result.skipped_lines} skipped lines",
             *_sources_lines(result), *_binding_lines(result), *readiness_lines(result),
             *_recall_lines(result, paper, RECALL_METRIC, RECALL_AGE_METRICS, ref)]
    if result.ceiling is not None:
        lines += _ceiling_lines(result)
    if result.trim_ceiling is not None and result.prose_first:
        lines += _trim_ceiling_lines(result)
    lines += _measure_lines(result)
    lines += expansion_lines(result)
    lines += billing_lines(result.billing())
    return "\n".join(lines) + "\n"


def expansion_lines(result: ReplayResult) -> list[str]:
    """Where the expand tool was offered: per method, the needed values its renders hid and how many of them a
    result the render marked with a handle held (one expansion away), and the calls that one expansion per hidden
    value would have made ready."""
    if not result.expand:
        return []
    lines = ["", "One expansion away (the expand tool offered to " + ", ".join(result.expand) + "; docs/method.md §16): "
             "of the needed values a render hid, those a result it marks with a handle holds. The other methods' "
             "hidden values are lost to the model (a read-only call may be re-issued). The bill below counts, before "
             "each such turn, the request whose answer calls the tool (one call per result, narrowed to the values) "
             "and the turn's own request with that round appended, as the proxy sends them; the tool's schema is in "
             "every offered request.",
             "",
             "| method | hidden needed values | one expansion away | % | calls ready after expanding | expand calls |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, t in result.methods.items():
        m = t.measures
        if name in result.expand:
            pct = _fmt(100 * m.expandable_values / m.hidden_values if m.hidden_values else None)
            lines.append(f"| {name} | {m.hidden_values} | {m.expandable_values} | {pct} | {m.expandable_calls} | "
                         f"{t.expansions} |")
        else:
            lines.append(f"| {name} | {m.hidden_values} | – | – | – | – |")
    return lines


def _binding_lines(result: ReplayResult) -> list[str]:
    """A warning when B rarely bound: where no history exceeded B every method renders it whole, so their
    figures agree by construction and say nothing about them."""
    n, bound = len(result.exceeded_per_trace), sum(result.exceeded_per_trace)
    if not n or bound * 2 > n:
        return []
    return ["", f"Note: B={result.budget} bound in only {bound} of the {n} traces (their history exceeded B at some "
                "turn); in the others every method shows the whole history, so they agree by construction. A smaller "
                "--budget compares the methods where they differ."]


def billing_lines(bill: Mapping[str, Any]) -> list[str]:
    """The bill of each method's replayed requests (docs/method.md §14): ×Full and cache-hit share per profile."""
    methods = bill.get("methods") or {}
    profiles = [p for p in ("anthropic", "openai", "none") if any(p in m for m in methods.values())]
    if not methods or not profiles:
        return []
    models = bill.get("models") or {}
    relative = "full" in methods  # without Full replayed there is nothing to divide by: US$ instead
    lines = ["", f"Billed cost (docs/method.md §14), over the {bill.get('traces_T', 0)} traces whose history exceeded "
             "B: each request billed from its own cached prefix at "
             + ", ".join(f"{p}: {models.get(p, '?')}" for p in profiles) + " prices, "
             + ("as ×Full (cache-hit share)." if relative else
                "in US$ (cache-hit share); add full to the methods for each as ×Full."), "",
             "| method | " + " | ".join(profiles) + " |", "|---|" + "---:|" * len(profiles)]
    for name, per in methods.items():
        cells = []
        for p in profiles:
            row = per.get(p) or {}
            vs, usd, share = row.get("vs_full"), row.get("usd"), row.get("cache_hit_share")
            figure = (f"{vs:.3f}×" if vs is not None else "–") if relative else \
                (f"${usd:.4f}" if usd is not None else "–")
            cells.append(figure + ("" if share is None or p == "none" else f" ({100 * share:.0f} %)"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    tooled, T = bill.get("traces_T_with_tools"), bill.get("traces_T", 0)
    if tooled is not None and tooled < T:
        # A request's tool definitions are part of its prompt, mostly read from the cache: without them every method's
        # bill is smaller, and a ratio to Full's is further from 1 than the provider's bill (docs/method.md §14).
        lines += ["", f"{'None' if not tooled else f'Only {tooled}'} of these {T} traces carry the tool definitions "
                  "their agent was offered: the other requests are billed without them (the harness's trace lines carry "
                  "them; an older line, one restored from a graph and the other formats do not), so each ratio to "
                  "Full is further from 1 than the provider's bill was."]
    if bill.get("note"):
        lines += ["", f"No dollars: {bill['note']}"]
    return lines


def _recall_lines(result: ReplayResult, paper: Mapping[str, Any] | None, metric: str,
                  age_metrics: Mapping[str, str], ref: Callable[[str, str], float | None]) -> list[str]:
    """The recall table: a row per method and ceiling, the paper's values in parentheses."""
    ev = result.events
    lines = [
        "",
        f"Later-Used Result Recall (docs/method.md §7): {ev.events} events "
        f"({', '.join(f'{_BIN_LABELS[b]}: {ev.events_by_age[b]}' for b in AGE_BINS)}). {RECALL_DIGIT_RULE}",
        "",
        "| method | recall | " + " | ".join(_BIN_LABELS[b] for b in AGE_BINS)
        + " | mean tok | max tok | over B | renders |",
        "|---|" + "---:|" * (5 + len(AGE_BINS)),
    ]
    any_ref = False
    rows = list(result.methods.items()) + ([(f"*{CEILING_NAME}* (not a policy)", result.ceiling)]
                                           if result.ceiling is not None else []) \
        + ([(f"*{TRIM_CEILING_NAME}* (not a policy)", result.trim_ceiling)] if result.trim_ceiling is not None else [])
    for name, t in rows:
        s = t.summary()
        refs = [ref(name, metric)] + [ref(name, age_metrics[b]) for b in AGE_BINS]
        any_ref = any_ref or any(r is not None for r in refs)
        cells = [_fmt(s["recall"], refs[0])]
        cells += [_fmt(s["recall_by_age"][b], r) for b, r in zip(AGE_BINS, refs[1:], strict=True)]
        mean = s["mean_rendered_tokens"]
        lines.append(f"| {name} | " + " | ".join(cells)
                     + f" | {'–' if mean is None else f'{mean:.0f}'} | {s['max_rendered_tokens'] or 0}"
                     + f" | {s['over_budget_renders']} | {s['renders']} |")
    if any_ref and paper:
        lines += ["", f"In parentheses: paper {paper['table']} ({paper['model']}, {paper['benchmark']}, "
                      f"B={result.budget})."]
    return lines


def _ceiling_lines(result: ReplayResult) -> list[str]:
    """What the hindsight ceiling is, and each method's share of the gap to it."""
    lines: list[str] = []
    lines += ["", "Hindsight ceiling: at each turn it knows which results that turn reuses and shows the "
                  "smallest first while they fit, with the selectors' scope, verbatim trim and markers — "
                  "the most reuse events any selector with that scope and trim can cover (not a policy). "
                  "It bounds the total; in one age column a method can pass it."]
    gaps = result.gap_covered()
    unbudgeted = [n for n, t in result.methods.items() if not t.budgeted]
    if gaps:
        cis = result.gap_intervals()
        lines += ["", f"Gap to the ceiling covered, from {GAP_REFERENCE} "
                      f"((recall − {GAP_REFERENCE}) / (ceiling − {GAP_REFERENCE})): {_shares_text(gaps, cis)}."
                      + (" The intervals resample the traces (a paired bootstrap: the events of one trace are "
                         "not independent)." if any((cis or {}).values()) else "")
                      + _few_traces_text(result.gap_trace_count())
                      + (f" No share for {', '.join(unbudgeted)}: it ignores B, so no ceiling under B bounds "
                         "it." if unbudgeted else "")]
    return lines


def _trim_ceiling_lines(result: ReplayResult) -> list[str]:
    """The ceiling with a prose-first trim, for the methods that trim that way."""
    lines: list[str] = []
    one = len(result.prose_first) == 1
    shown = bool(result.gap_covered())
    lines += ["", f"{', '.join(result.prose_first)} trim{'s' if one else ''} verbatim overflow prose-first "
                  "(old assistant prose before the oldest turns), so the selectors' ceiling does not bound "
                  f"{'it' if one else 'them'}"
                  + (f" ({'its' if one else 'their'} gap share above can exceed 100 % or read no gap)" if shown
                     else "")
                  + "; the ceiling row with the prose-first trim does."]
    own = result.own_trim_gap_covered()
    if own:
        lines += ["", "Gap covered against the ceiling with the same trim: "
                      f"{_shares_text(own, result.own_trim_gap_intervals())}."
                      + _few_traces_text(result.gap_trace_count(own_trim=True))]
    return lines


def _measure_lines(result: ReplayResult) -> list[str]:
    """The failure-mode measures' table."""
    lines = ["", "Failure-mode measures (experiments/evaluation/measures.py): identifier survival (%), "
                  "recorded re-reads of a result the render hid, prompt-cache prefix retention (%)", "",
              "| method | id survival | " + " | ".join(_BIN_LABELS[b] for b in AGE_BINS)
              + " | re-reads | per episode | per 100 calls | prefix retention | token-weighted |",
              "|---|" + "---:|" * (6 + len(AGE_BINS))]
    for name, t in result.methods.items():
        ms = t.measures.summary()
        per_ep = ms["rereads_per_episode"]
        lines.append(f"| {name} | {_fmt(ms['identifier_survival'])} | "
                     + " | ".join(_fmt(ms["identifier_survival_by_age"][b]) for b in AGE_BINS)
                     + f" | {ms['rereads']} | {'–' if per_ep is None else f'{per_ep:.2f}'}"
                     + f" | {_fmt(ms['rereads_per_100_calls'])} | {_fmt(ms['prefix_retention'])}"
                     + f" | {_fmt(ms['prefix_retention_tokens'])} |")
    return lines


#: A JSON list of numbers only (no strings, objects or lists inside) as json.dumps(indent=2) lays it out:
#: one element per line. A raw newline never occurs inside a JSON string, so no string's text can match.
_NUMBER_LIST = re.compile(r"\[\n\s*([\d.eE+-]+(?:,\n\s*[\d.eE+-]+)*)\n\s*\]")  # no "-?": the class has "-"


def write_json(path: str | Path, obj: Any) -> None:
    """Write next to the target, then rename: a reader never sees half a file. Indented, except that a
    list of numbers (per-trace hits, intervals) stays on one line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = _NUMBER_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
                            json.dumps(obj, indent=2, ensure_ascii=False))
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)


# -- entry points ---------------------------------------------------------------------

TracesSpec = str | Path | Sequence[str | Path]


def _check_budget_and_methods(budget: int, methods: Sequence[str]) -> None:
    if not methods:
        raise ValueError("methods is empty")
    if budget <= 0:
        raise ValueError(f"budget must be positive, got {budget}")


def check_replay_args(traces: TracesSpec, budget: int, methods: Sequence[str], *, trace_format: str | None = None,
                      strict: bool = True) -> TraceSet:
    """Refuse a replay that cannot produce a result; return the trace files to read.

    ``traces``: a file, a directory, a glob (or a list of them); ``trace_format``: one
    of :data:`~contextrender.experiments.evaluation.traces.FORMATS`, None/``auto`` =
    by content. Raises :class:`FileNotFoundError` when ``traces`` names nothing and
    :class:`ValueError` for an empty method list, a non-positive budget, an empty
    trace file, a directory without trace files or an unknown format; with
    ``strict``, a named file of no known format is a
    :class:`~contextrender.experiments.evaluation.traces.TraceError` here.
    Pass the result to :func:`replay_traces`, which then opens no file again.
    """
    _check_budget_and_methods(budget, methods)
    if isinstance(traces, (str, Path)) and not str(traces):
        raise ValueError("traces is empty: give a trace file, a directory or a glob")
    # Recall over zero events is undefined, not a result: empty files and directories are refused.
    found = open_traces(traces, format=trace_format, strict=strict)
    if strict:
        for r in found.readers:
            r.resolve_format()  # a file of no known format fails now, before any policy is built
    return found


def _benchmark_for(found: TraceSet, benchmark: str | None, methods: Sequence[str],
                   overrides: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """The benchmark the traces come from: given, or the one every file records (our runner's key,
    a τ² file's domain, a BFCL entry's category); none when they disagree or record none.

    Benchmark-dependent settings (ACON's thresholds) are chosen for it, and tables match a replay
    to its benchmark's runs by this name.
    """
    if benchmark:
        return {"name": benchmark, "from": "argument"}
    recorded = found.recorded_benchmarks()
    named = sorted(b for b in recorded if b)
    if len(recorded) == 1 and named:
        return {"name": named[0], "from": "traces"}
    if len(named) > 1:
        log.warning("the trace files record several benchmarks (%s): the recall reported pools their events; "
                    "replay each benchmark's files on its own to report them apart", ", ".join(named))
    if named:
        from contextrender.baselines.acon import is_acon_config

        cfgs, _ = method_configs(methods, overrides, None)
        if any(is_acon_config(c) for c in cfgs.values()):
            log.warning("the trace files record several benchmarks (%s, or none): ACON uses its default "
                        "thresholds; pass benchmark=/--benchmark to choose", ", ".join(named))
    return {"name": None, "from": "traces record " + ("several: " + ", ".join(named) if named else "none")}


def replay_traces(traces: TracesSpec | TraceSet, budget: int, methods: Sequence[str], *, embedder: Any = None,
                  compactor: Any = None, overrides: Mapping[str, Mapping[str, Any]] | None = None,
                  strict: bool = True, limit: int | None = None, graph: str | Path | None = None,
                  progress: bool = False, trace_format: str | None = None,
                  benchmark: str | None = None, prefetch: int = PREFETCH_TRACES,
                  ceiling: bool = True, expand: bool = False) -> ReplayResult:
    """Replay trace files through registry methods at ``budget``: the plain-argument entry point.

    ``python -m contextrender.experiments.evaluation.replay`` (Hydra) and
    ``contextrender replay`` both call this; it needs no Hydra app, only the
    method registry (the ``[service]`` extra).

    Args:
        traces: a trace file, a directory of them (recursively) or a glob, or a list of those;
            any format of :mod:`~contextrender.experiments.evaluation.traces`. Or the
            :class:`~contextrender.experiments.evaluation.traces.TraceSet` :func:`check_replay_args`
            returned: its files were checked then and are not opened again (``strict`` and
            ``trace_format`` are the ones it was opened with).
        budget: history budget B in tokens.
        methods: registry method names (``conf/method/<name>.yaml``), each once.
        embedder: shared by every policy that takes one (see :class:`SharedEmbeddings`).
        compactor: shared by every policy that takes one (see :class:`MemoCompactor`).
        overrides: per method, tunable keys (``{"contextrender": {"lam": 0.5}}``).
        strict: raise :class:`~contextrender.experiments.evaluation.traces.TraceError`
            (naming ``file:line`` or ``file: simulations[i]``) at the first malformed record;
            otherwise skip and count them.
        limit: replay only the first ``limit`` valid episodes.
        graph: context-graph file for the replay's sessions; None = a temporary file, deleted after. With
            several methods each gets its own file, its name before the suffix (``graph.prune.sqlite``).
        progress: a progress bar on stderr.
        trace_format: force a format (``contextrender``, ``tau2``, ``taubench``, ``bfcl``); None = by content.
        benchmark: the benchmark the traces come from, for settings that depend on it (ACON's
            thresholds: ``moqa8*`` → QA's); None = the one the trace files record, if any.
        prefetch: traces read ahead whose texts are embedded together before they are replayed
            (see :func:`replay`; 0 = none, every text embedded when a policy asks). Results do not
            depend on it, only time and memory.
        ceiling: also replay the hindsight ceiling (:mod:`~contextrender.experiments.evaluation.ceiling`),
            reported as ``result.ceiling`` / the output's ``"ceiling"`` beside the methods; when a method
            trims prose-first, also the ceiling with that trim (``result.trim_ceiling`` /
            ``"ceiling_prose_first_trim"``, its gap share ``"gap_covered_own_trim"``).
        expand: offer the expand tool to each method whose markers carry handles (``contextrender_plus``), as the
            proxy does, and report per method how many of the needed values its renders hid were one expansion
            away (``one_expansion_away`` in each method's measures). Off: every method renders as without the tool.

    Returns:
        The :class:`ReplayResult`; ``.to_json()`` is what the Hydra entry writes.

    Raises:
        FileNotFoundError: no trace file. ValueError: no methods, a non-positive budget, an
        empty file or directory, an unknown method, override or format, or no valid episode at all.
    """
    methods = list(methods)
    if isinstance(traces, TraceSet):
        _check_budget_and_methods(budget, methods)
        found = traces
    else:
        found = check_replay_args(traces, budget, methods, trace_format=trace_format, strict=strict)
    bench = _benchmark_for(found, benchmark, methods, overrides)
    _, settings = method_configs(methods, overrides, bench["name"])
    policies, shared = build_policies(methods, overrides, embedder=embedder, compactor=compactor,
                                      benchmark=bench["name"])
    total = found.total_hint()
    repeated: list[tuple[str, str, str]] = []
    episodes: Iterable[Episode] = _watch_repeats(found, repeated)
    if limit is not None:
        episodes = _limit(episodes, int(limit))
        total = min(total, int(limit)) if total is not None else None

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cr-replay-") as tmp:
        graph_path = graph or os.path.join(tmp, "graph.sqlite")
        emb = shared.embedder if shared.embedder is not None else embedder
        bound, trim_bound = _ceilings(policies, emb) if ceiling else (None, None)
        result = replay(episodes, policies, budget, graph_path, shared=shared, total=total, progress=progress,
                        skipped=found, prefetch=prefetch, ceiling=bound, trim_ceiling=trim_bound, expand=expand)
    elapsed = time.perf_counter() - t0
    result.sources, result.benchmark, result.method_settings = found.summary(), bench, settings
    _check_replayed(result, repeated, limit)
    _log_replay(result, budget, len(policies), elapsed, shared)
    return result


def _check_replayed(result: ReplayResult, repeated: Sequence[tuple[str, str, str]], limit: int | None) -> None:
    """Say how many episodes repeated a task id of their file; refuse a replay of no episode."""
    sources = result.sources or {}
    if repeated:
        task, first, again = repeated[0]
        sources["repeated_tasks"] = len(repeated)
        log.warning("%d episodes repeat a task id already read from the same file (e.g. task %s at %s and %s); "
                    "each occurrence is replayed and counted — a runner trace file that two configurations "
                    "of one benchmark wrote holds both runs", len(repeated), task, first, again)
    if result.traces == 0:
        where = ", ".join(r["path"] for r in sources.get("files", []))
        raise ValueError(f"{where}: no episode was replayed ({result.skipped_lines} malformed records skipped"
                         + (f", limit={limit}" if limit is not None else "") + ")")


def _watch_repeats(episodes: Iterable[Episode], repeated: list[tuple[str, str, str]]) -> Iterator[Episode]:
    """``episodes`` unchanged; each that repeats a task id of its file goes to ``repeated`` as
    (task id, where it was first read, where again)."""
    # One file holding a task twice (e.g. a runner trace file that two configurations of one
    # benchmark appended to) is replayed as it is, and said: each occurrence counts.
    seen: dict[tuple[str, str], str] = {}
    for e in episodes:
        key = (e.where.rsplit(":", 1)[0], e.task_id)
        if key in seen:
            repeated.append((e.task_id, seen[key], e.where))
        else:
            seen[key] = e.where
        yield e


def _ceilings(policies: Mapping[str, Any], embedder: Any) -> tuple[Any, Any]:
    """The hindsight ceiling, and the one with the prose-first trim when a policy trims so (else None)."""
    from contextrender.experiments.evaluation.ceiling import HindsightCeiling

    trims = any(getattr(p, "trim_prose_first", False) for p in policies.values())
    return (HindsightCeiling(embedder=embedder),
            HindsightCeiling(embedder=embedder, trim_prose_first=True, name=TRIM_CEILING_NAME) if trims else None)


def _log_replay(result: ReplayResult, budget: int, n_methods: int, elapsed: float, shared: Shared) -> None:
    """What a finished replay read, what went over budget, and where the time went."""
    for f in (result.sources or {}).get("files", []):
        log.info("%s: %s, %d episodes%s", f["path"], format_title(f["format"]), f["episodes"],
                 f", {f['skipped']} skipped" if f["skipped"] else "")
    for name, t in result.methods.items():
        if t.budgeted and t.over_budget:
            log.error("%s rendered more than B=%d tokens in %d of %d renders", name, budget, t.over_budget, t.renders)
    log.info("replayed %d traces × %d methods in %.1f s (%s)", result.traces, n_methods, elapsed,
             ", ".join(f"{n} {t.seconds:.1f} s" for n, t in result.methods.items()))
    if shared.embedder is not None:
        c = shared.embedder.counts
        log.info("embeddings: %d texts prefetched, %d embedded on demand, %d lookups served from memory",
                 c["prefetched"], c["on_demand"], c["served"])


def _traces_arg(value: Any) -> TracesSpec:
    """``traces=`` as given to Hydra: one path/glob, or a list of them."""
    if isinstance(value, (str, Path)):
        return value
    items = list(value)
    return [str(v) for v in items]


def run(cfg: DictConfig) -> dict[str, Any]:
    """Replay ``cfg.traces`` and write ``cfg.output``; returns the JSON written."""
    from hydra.utils import instantiate

    methods = cfg.methods
    methods = [methods] if isinstance(methods, str) else list(methods)
    budget = int(cfg.budget)
    traces = _traces_arg(cfg.traces)
    trace_format = cfg.get("trace_format") or None
    benchmark = cfg.get("benchmark_name") or None  # `benchmark` is the config group of conf/benchmark/
    # Before anything is built; the replay reads these files, not the config's paths again.
    found = check_replay_args(traces, budget, methods, trace_format=trace_format, strict=bool(cfg.strict))
    if cfg.get("torch_threads"):  # +torch_threads=1: on a machine another job keeps busy, one thread is faster
        try:
            import torch
        except ImportError:  # only the local embedder runs torch: without it there are no threads to set
            log.warning("torch_threads=%s ignored: torch is not installed (only the local embedder uses it)",
                        cfg.torch_threads)
        else:
            torch.set_num_threads(int(cfg.torch_threads))
    # One cached embedder for every policy: a result is embedded once per run, whoever renders it.
    extra = {"cache_path": cfg.embedding_cache} if cfg.get("embedding_cache") else {}
    embedder = instantiate(cfg.embedding, **extra)
    compactor = instantiate(cfg.compactor)
    raw = OmegaConf.to_container(cfg.method_overrides, resolve=True) if cfg.get("method_overrides") else {}
    assert isinstance(raw, dict)
    overrides = {str(k): dict(v or {}) for k, v in raw.items()}
    limit = int(cfg.limit) if cfg.get("limit") is not None else None
    # +prefetch_traces=N: traces embedded together ahead of their replay (0: none); results never change.
    prefetch = int(cfg.prefetch_traces) if cfg.get("prefetch_traces") is not None else PREFETCH_TRACES
    result = replay_traces(found, budget, methods, embedder=embedder, compactor=compactor,
                           overrides=overrides, strict=bool(cfg.strict), limit=limit, graph=cfg.graph or None,
                           progress=bool(cfg.progress), trace_format=trace_format, benchmark=benchmark,
                           prefetch=prefetch, ceiling=bool(cfg.get("ceiling", True)),
                           expand=bool(cfg.get("expand", False)))
    out = result.to_json()
    write_json(cfg.output, out)
    paper = OmegaConf.to_container(cfg.paper, resolve=True) if cfg.get("paper") else None
    sys.stdout.write(markdown_table(result, paper))  # type: ignore[arg-type]
    sys.stdout.flush()
    log.info("wrote %s", cfg.output)
    return out


def _limit(episodes: Iterable[Episode], n: int) -> Iterable[Episode]:
    for i, e in enumerate(episodes):
        if i >= n:
            return
        yield e


@hydra.main(version_base="1.3", config_path="pkg://contextrender.conf", config_name="replay")
def main(cfg: DictConfig) -> None:
    from contextrender import offline

    offline.enable()
    run(cfg)


if __name__ == "__main__":
    main()
