"""A fixed corpus of varied transcripts and budgets, and a replay of every method over it.

Used by the render-equivalence test (exact outputs pinned as digests) and the
``Rendered.sources`` test. Deterministic: a seeded generator, the recorded
traces in ``tests/data``, the session's one token counter, ``HashingEmbedder``
and the extractive compactor.

Each transcript is rendered the way an agent loop renders it: the session
grows message by message and a render runs before every assistant message
(the model call that produces it) and once more at the end, on one session,
so stateful policies (summaries, compressed observations) build and re-use
their state across calls.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from contextrender import ContextGraph, ExtractiveCompactor, HashingEmbedder
from contextrender.registry import build_policy, method_config, method_names

DATA = Path(__file__).resolve().parents[1] / "data"

#: History budgets B: from smaller than a few messages (verbatim overflow, clipped task) to roomy.
BUDGETS = (120, 400, 1000, 2500, 6000)

#: Every registry method, plus variants that switch on code paths the defaults leave cold.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    **{name: (name, {}) for name in method_names()},
    "acon_qa": ("acon", {"history_threshold": 2048, "observation_threshold": 400}),
    "acon_keep2": ("acon", {"keep_last_turns": 2, "summary_share": 0.3, "observation_ratio": 0.3}),
    # session_prior 0 and the project trim in the three below: they pin the paths they pinned before W_sess
    # was fitted on and before the plus trimmed prose-first (on the fitted profile, which the plus was then)
    "plus_off": ("contextrender_plus_fitted", {"packing": False, "stubs": False, "tabular": False, "lexical": 0.0,
                                        "compact_omitted": False, "session_prior": 0.0, "trim_prose_first": False}),
    "plus_stubs_no_packing": ("contextrender_plus_fitted", {"packing": False, "tabular": False, "session_prior": 0.0,
                                                     "trim_prose_first": False}),
    "plus_tabular_only_fill": ("contextrender_plus_fitted", {"stubs": False, "compact_omitted": False,
                                                      "session_prior": 0.0, "trim_prose_first": False}),
    "compact_share": ("compact", {"summary_share": 0.3}),
    "recency_summary_share": ("recency_summary", {"summary_share": 0.5}),
    "semantic_retrieval_1turn": ("semantic_retrieval", {"recent_turns": 1, "recent_share": 0.3}),
    # peer strategies: options the shipped defaults leave cold
    "opencode_prune_all_turns": ("opencode_prune", {"skip_user_turns": 0}),
    "opencode_prune_absolute": ("opencode_prune", {"skip_user_turns": 0, "scale_to_budget": False}),
    "tail_compaction_codex": ("tail_compaction", {"codex": True}),
    "tail_compaction_absolute": ("tail_compaction", {"scale_to_budget": False}),
    "openhands_summary_keep4": ("openhands_summary", {"keep_first": 4}),
    "langchain_trim_human": ("langchain_trim", {"start_on_human": True}),
    # the cache-aware option (docs/method.md §15): off, the plus renders as it did before it was its default; on,
    # the paper's selector
    "plus_not_cache_aware": ("contextrender_plus", {"cache_aware": False}),
    "contextrender_cache_aware": ("contextrender", {"cache_aware": True}),
}


def build(variant: str) -> Any:
    method, overrides = VARIANTS[variant]
    return build_policy(method_config(method, overrides), embedder=HashingEmbedder(dim=256),
                        compactor=ExtractiveCompactor())


# -- transcripts ----------------------------------------------------------------------------

_WORDS = ("the", "result", "shows", "value", "list", "page", "entry", "field", "record", "status", "note",
          "item", "owner", "region", "update", "total", "count", "order", "account", "message")


class _Gen:
    def __init__(self, seed: int, system: str | None = "You are a careful tool-using agent.") -> None:
        self.rng = random.Random(seed)
        self.messages: list[dict[str, Any]] = []
        if system is not None:
            self.messages.append({"role": "system", "content": system})
        self.ids: list[str] = []
        self._n = 0

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(n))

    def ident(self) -> str:
        kind = self.rng.randrange(4)
        n = self.rng.randrange(1000, 99999)
        ident = (f"ORD-{n}", f"user_{n}@mail.example.com", f"/srv/app/cfg_{n}.yaml", f"acct.{n}.primary")[kind]
        self.ids.append(ident)
        return ident

    def result(self, tokens: int) -> str:
        lines = []
        while sum(len(x.split()) for x in lines) < tokens * 0.75:
            lines.append(f"{self.ident()}: {self.words(self.rng.randrange(4, 14))}")
        return "\n".join(lines)

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def say(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def calls(self, sizes: list[int], *, content: str | None = None, reuse: bool = True,
              deliver: bool = True, args_raw: bool = False) -> list[tuple[str, str]]:
        tcs, results = [], []
        for size in sizes:
            cid = f"call_{self._n:03d}"
            self._n += 1
            arg = self.rng.choice(self.ids) if reuse and self.ids else self.words(2)
            raw = json.dumps({"query": arg, "limit": self.rng.randrange(1, 50)})
            if args_raw:
                raw = f"query={arg}"
            name = self.rng.choice(("search", "read_file", "list_orders", "get_account"))
            tcs.append({"id": cid, "type": "function", "function": {"name": name, "arguments": raw}})
            results.append((cid, self.result(size)))
        self.messages.append({"role": "assistant", "content": content, "tool_calls": tcs})
        if deliver:
            for cid, text in results:
                self.messages.append({"role": "tool", "tool_call_id": cid, "content": text})
        return results

    def deliver(self, results: list[tuple[str, str]]) -> None:
        for cid, text in results:
            self.messages.append({"role": "tool", "tool_call_id": cid, "content": text})


def _tool_heavy() -> list[dict[str, Any]]:
    g = _Gen(1)
    g.user("Reconcile every open order against the accounts and report mismatches.")
    for i in range(18):
        g.calls([g.rng.choice((40, 90, 160, 320, 600))], content=g.words(6) if i % 3 == 0 else None)
    g.say("Done: " + " ".join(g.ids[:6]))
    return g.messages


def _parallel() -> list[dict[str, Any]]:
    g = _Gen(2)
    g.user("Find the three cheapest flights and the hotels near each airport.")
    for _ in range(7):
        g.calls([g.rng.choice((30, 80, 200)) for _ in range(g.rng.randrange(2, 5))])
    # a parallel batch whose results arrive interleaved with a later assistant message
    late = g.calls([60, 70, 80], deliver=False)
    g.deliver(late[:1])
    g.say("Waiting for the other results " + g.ids[-1])
    g.deliver(late[1:])
    g.calls([50, 50])
    g.say("Summary of options " + " ".join(g.ids[-4:]))
    return g.messages


def _verbatim_overflow() -> list[dict[str, Any]]:
    g = _Gen(3)
    g.user("Plan the migration step by step; explain your reasoning at each step. " + g.words(120))
    for i in range(10):
        g.say(f"Step {i}: " + g.words(220))
        if i % 2 == 0:
            g.calls([g.rng.choice((60, 150))], content=g.words(80))
        g.user(f"Follow-up {i}: " + g.words(90))
    g.say("Final plan " + g.words(150))
    return g.messages


def _oversized() -> list[dict[str, Any]]:
    g = _Gen(4)
    g.user("Read the logs and find the failing request id.")
    for size in (150, 3200, 80, 1400, 7000, 60, 450, 2600):
        g.calls([size])
    g.say("The failing request is " + g.ids[len(g.ids) // 2])
    return g.messages


def _multi_user() -> list[dict[str, Any]]:
    g = _Gen(5)
    g.user("Set up the project and run the tests.")
    for turn in range(5):
        for _ in range(3):
            g.calls([g.rng.choice((50, 120, 250))])
        g.say(f"Turn {turn} done; ids " + " ".join(g.ids[-2:]))
        g.user(f"Now also check {g.ids[-1]} and {g.rng.choice(g.ids)}; " + g.words(12))
    g.calls([100, 100])
    return g.messages


def _odd_roles() -> list[dict[str, Any]]:
    """A developer prompt, a system message in mid-transcript, raw (non-JSON) arguments, an orphan result."""
    g = _Gen(6, system=None)
    g.messages.append({"role": "developer", "content": "Developer rules: cite identifiers exactly."})
    g.messages.append({"role": "system", "content": "Second leading system prompt."})
    g.user("Audit the configuration files.")
    for i in range(6):
        g.calls([g.rng.choice((70, 140, 300))], args_raw=i % 2 == 0)
        if i == 2:
            g.messages.append({"role": "system", "content": "Reminder injected mid-run: stay within scope."})
    g.messages.append({"role": "tool", "tool_call_id": "call_orphan", "name": "cron", "content": g.result(90)})
    g.calls([120])
    g.say("Audit complete " + g.ids[0])
    return g.messages


def _no_system_big_task() -> list[dict[str, Any]]:
    """No system prompt and a task message larger than the small budgets (clipped task)."""
    g = _Gen(7, system=None)
    g.user("Task: " + g.words(900) + " " + " ".join(g.ident() for _ in range(20)))
    for _ in range(6):
        g.calls([g.rng.choice((40, 200, 500))])
    g.say("Answer " + g.ids[3])
    return g.messages


def _tiny() -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": "Hello."}]


def _traces(name: str) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    for line in (DATA / name).read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            yield f"trace:{d['task_id']}", d["messages"]


def transcripts() -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {
        "tool_heavy": _tool_heavy(), "parallel": _parallel(), "verbatim_overflow": _verbatim_overflow(),
        "oversized": _oversized(), "multi_user": _multi_user(), "odd_roles": _odd_roles(),
        "no_system_big_task": _no_system_big_task(), "tiny": _tiny(),
    }
    for f in ("react_traces.jsonl", "parallel_agent_traces.jsonl"):
        out.update(_traces(f))
    return out


# -- replay ---------------------------------------------------------------------------------


def render_points(messages: list[dict[str, Any]]) -> list[int]:
    """Prefix lengths at which an agent loop renders: before each assistant message, and at the end."""
    points = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i > 0]
    return [*points, len(messages)]


def replay(variant: str, name: str, messages: list[dict[str, Any]], budget: int,
           on_render: Callable[[Any, Any], None]) -> None:
    """Render ``messages`` with a fresh policy ``variant`` at ``budget``, calling ``on_render(session, out)``
    after each render (``out`` is the Rendered or the exception raised)."""
    policy = build(variant)
    graph = ContextGraph()
    try:
        session = graph.session(f"{name}|{budget}")
        for n in render_points(messages):
            session.sync(messages[:n])
            try:
                out: Any = policy.render(session, budget)
            except Exception as e:  # noqa: BLE001 - a refusal is behaviour too
                out = e
            on_render(session, out)
    finally:
        graph.close()


def record(out: Any) -> dict[str, Any]:
    """What a render produced, as plain JSON data (the fields that existed before ``sources``)."""
    if isinstance(out, Exception):
        return {"error": type(out).__name__, "detail": str(out)}
    return {"messages": list(out.messages), "tokens": out.tokens, "visible": sorted(out.visible),
            "usage": out.usage.to_dict()}


def digest(records: list[dict[str, Any]]) -> str:
    blob = json.dumps(records, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def all_digests(check: Callable[[str, str, int, Any, Any], None] | None = None) -> tuple[dict[str, str], int]:
    """``variant|transcript`` → digest of every render's output at every budget, and the number of renders.

    ``check(variant, transcript, budget, session, out)``, if given, also sees each render as it happens.
    """
    out: dict[str, str] = {}
    count = 0
    for name, messages in transcripts().items():
        for variant in VARIANTS:
            recs: list[dict[str, Any]] = []
            for budget in BUDGETS:
                def on_render(session: Any, o: Any, recs: list[dict[str, Any]] = recs, budget: int = budget,
                              variant: str = variant, name: str = name) -> None:
                    recs.append(record(o))
                    if check is not None:
                        check(variant, name, budget, session, o)

                replay(variant, name, messages, budget, on_render)
            count += len(recs)
            out[f"{variant}|{name}"] = digest(recs)
    return out, count
