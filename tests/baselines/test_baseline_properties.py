"""Property: no budgeted policy ever renders above B, and renders are valid and deterministic.

Covers every baseline, ContextRender and its three ablations, and every peer strategy
with a few of their options, on random
transcripts rendered before every invocation (as an agent loop would), at
random budgets including ones below the verbatim messages.
"""

from __future__ import annotations

import json
import random

from _baseline_util import history_recount, pairing_errors
from hypothesis import given, settings
from hypothesis import strategies as st

from contextrender import ContextGraph, ExtractiveCompactor, HashingEmbedder
from contextrender.registry import build_policy, method_config

EMB = HashingEmbedder(dim=64)
BUDGETED = ("prune", "semantic_retrieval", "compact", "recency_summary", "acon",
            "contextrender", "cr_recency", "cr_relevance", "cr_recency_relevance")
#: The peer strategies (baselines/peers/): same property, same transcripts.
PEERS = ("openhands_masking", "openhands_summary", "openhands_forgetting", "inspect_edit", "inspect_trim",
         "clear_tool_uses", "opencode_prune", "swe_last_n", "langchain_trim", "tail_compaction")
WORDS = ("the", "invoice", "status", "error", "total", "report", "server", "config", "naïve", "日本語",
         "path/to/file.txt", "(x)", '"quoted"', "a,b", "🙂")


def make_policies() -> dict[str, object]:
    compactor = ExtractiveCompactor()
    out = {n: build_policy(method_config(n), embedder=EMB, compactor=compactor) for n in (*BUDGETED, *PEERS)}
    # Small thresholds so that ACON's compression paths run on short transcripts too.
    out["acon_small"] = build_policy(method_config("acon", {"history_threshold": 200, "observation_threshold": 60},
                                                     label="acon_small"), compactor=compactor)
    # Peer options whose paths the defaults leave cold on short transcripts.
    for label, method, overrides in PEER_VARIANTS:
        out[label] = build_policy(method_config(method, overrides, label=label), compactor=compactor)
    return out


PEER_VARIANTS = (
    ("opencode_prune_all_turns", "opencode_prune", {"skip_user_turns": 0}),
    ("tail_compaction_codex", "tail_compaction", {"codex": True}),
    ("openhands_summary_keep4", "openhands_summary", {"keep_first": 4}),
    ("langchain_trim_human", "langchain_trim", {"start_on_human": True}),
    ("swe_last_n_polling", "swe_last_n", {"n": 2, "polling": 3}),
    ("clear_tool_uses_at_least", "clear_tool_uses", {"keep": 1, "clear_at_least": 50}),
)


@st.composite
def transcripts(draw):
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    n_turns = draw(st.integers(1, 9))
    max_words = draw(st.sampled_from([5, 40, 200, 600]))

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    values: list[str] = []
    msgs: list[dict] = []
    if rng.random() < 0.8:
        msgs.append({"role": "system", "content": "You are an agent. " + words(rng.randint(0, 20))})
    msgs.append({"role": "user", "content": "Task: " + words(rng.randint(2, 300 if rng.random() < 0.2 else 30))})
    n_call = 0
    for _ in range(n_turns):
        if rng.random() < 0.15:
            msgs.append({"role": "user", "content": words(rng.randint(1, 80))})
        used = " ".join(v for v in values if rng.random() < 0.3)
        n_calls = rng.choice([0, 1, 1, 1, 2, 3])
        content = (words(rng.randint(0, 60)) + " " + used).strip() if rng.random() < 0.6 or not n_calls else None
        calls = []
        for _ in range(n_calls):
            args = {"q": words(rng.randint(0, 8)), "ids": [v for v in values if rng.random() < 0.2]}
            calls.append({"id": f"call_{n_call}", "type": "function",
                          "function": {"name": rng.choice(["search", "read_file", "exec"]),
                                       "arguments": json.dumps(args, ensure_ascii=False)}})
            n_call += 1
        msgs.append({"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})})
        for c in calls:
            value = f"ID_{rng.randint(0, 10**6)}"
            values.append(value)
            lines = [words(rng.randint(1, 12)) for _ in range(max(1, rng.randint(1, max_words) // 8))]
            lines.insert(rng.randint(0, len(lines)), f"id: {value}")
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": "\n".join(lines)})
    return msgs


STATEFUL = ("compact", "recency_summary", "acon", "acon_small", "openhands_summary", "openhands_forgetting",
            "inspect_edit", "inspect_trim", "opencode_prune", "tail_compaction", "opencode_prune_all_turns",
            "tail_compaction_codex", "openhands_summary_keep4")


# Built once (Hydra instantiation is slow) and shared by every example: policies keep no state of
# their own, only graph artifacts, so reusing the objects across graphs is itself part of the property.
POLICIES = make_policies()
REPLAY = {n: p for n, p in make_policies().items() if n in STATEFUL}


def run(messages: list[dict], budget: int, policies: dict[str, object]) -> dict[str, list[tuple]]:
    """Render with every policy before each invocation and at the end; check each render."""
    session = ContextGraph().session("p")
    seen: dict[str, list[tuple]] = {name: [] for name in policies}

    def render_all() -> None:
        for name, policy in policies.items():
            out = policy.render(session, budget)
            assert out.tokens <= budget, (name, out.tokens, budget)
            assert out.tokens == history_recount(session, out), name
            assert not pairing_errors(out.messages), (name, pairing_errors(out.messages))
            assert out.visible <= {r.seq for r in session.results}
            again = policy.render(session, budget)  # same state, same render
            assert (again.messages, again.tokens, again.visible) == (out.messages, out.tokens, out.visible), name
            seen[name].append((out.messages, out.tokens, out.visible))

    for m in messages:
        if m["role"] == "assistant":
            render_all()
        session.add(m)
    render_all()
    return seen


@settings(max_examples=50, deadline=None)
@given(transcripts(), st.integers(4, 2500))
def test_budgeted_policies_never_exceed_budget_and_are_deterministic(messages, budget):
    first = run(messages, budget, POLICIES)
    # Stateful policies replayed on a fresh graph with other objects: identical renders throughout.
    assert run(messages, budget, REPLAY) == {n: first[n] for n in STATEFUL}
