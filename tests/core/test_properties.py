"""Property test: every ContextRender weighting renders within B, validly and deterministically."""

from __future__ import annotations

import json
import random

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from contextrender import ContextGraph, ContextRender, ExtractiveCompactor, HashingEmbedder, TokenCounter, Weights

from ._helpers import history_recount, pairing_errors

EMB = HashingEmbedder(dim=128)
COUNTER = TokenCounter()
WEIGHTINGS = {
    "contextrender": Weights(1.0, 1.0, 1.0),
    "cr_recency": Weights(1.0, 0.0, 0.0),
    "cr_relevance": Weights(0.0, 1.0, 0.0),
    "cr_recency_relevance": Weights(1.0, 1.0, 0.0),
}
COMPACTOR = ExtractiveCompactor()
WORDS = ("the", "invoice", "status", "error", "ledger", "total", "report", "value", "server", "config",
         "naïve", "café", "日本語", "данные", "✓", "🙂", "path/to/file.txt", "a,b", "(x)", '"quoted"')


@st.composite
def transcripts(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    n_turns = draw(st.integers(1, 10))
    max_result_words = draw(st.sampled_from([5, 60, 300, 900]))
    reuse = draw(st.floats(0.0, 1.0))
    follow_ups = draw(st.floats(0.0, 0.5))
    long_task = draw(st.booleans())
    rng = random.Random(seed)

    def words(n):
        return " ".join(rng.choice(WORDS) for _ in range(n))

    values: list[str] = []
    msgs = []
    if rng.random() < 0.8:
        msgs.append({"role": "system", "content": "You are an agent. " + words(rng.randint(0, 30))})
    msgs.append({"role": "user", "content": "Task: " + words(rng.randint(3, 600 if long_task else 40))})
    call_no = 0
    for k in range(n_turns):
        if k and rng.random() < follow_ups:
            msgs.append({"role": "user", "content": words(rng.randint(1, 150))})
        used = [v for v in values if rng.random() < reuse * 0.5][:6]
        n_calls = rng.choice([0, 1, 1, 1, 2, 3])
        content = (words(rng.randint(0, 80)) + " " + " ".join(used)).strip() if rng.random() < 0.6 or not n_calls else None
        calls = []
        for _ in range(n_calls):
            cid = f"call_{call_no}"
            call_no += 1
            args = {"q": words(rng.randint(0, 10)), "ids": [v for v in values if rng.random() < reuse * 0.3][:5]}
            calls.append({"id": cid, "type": "function", "function": {"name": rng.choice(["search", "read_file", "exec"]),
                                                                       "arguments": json.dumps(args, ensure_ascii=False)}})
        msg = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        msgs.append(msg)
        for c in calls:
            fresh = [f"id_{rng.randint(0, 40)}_{rng.choice(['x', 'y', 'z'])}x" for _ in range(rng.randint(0, 4))]
            old = [v for v in values if rng.random() < reuse * 0.3][:4]
            values.extend(v for v in fresh if v not in values)
            body = words(rng.randint(0, max_result_words)) + " " + " ".join(fresh + old)
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": body})
    budget = draw(st.integers(50, 3000))
    return msgs, budget


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(transcripts())
def test_render_within_budget_valid_and_deterministic(case):
    msgs, budget = case
    session = ContextGraph().session("p")
    session.sync(msgs)
    result_seqs = {r.seq for r in session.results}
    originals = {r.call_id: session.message(r.seq).content for r in session.results}
    sel = ContextRender(embedder=EMB).select(session, budget)
    event("shortcut" if sel.shortcut else ("trimmed" if any(not x.candidate for x in sel.scores) else "selected"))
    variants = [(name, w, None) for name, w in WEIGHTINGS.items()]
    variants.append(("contextrender+compactor", WEIGHTINGS["contextrender"], COMPACTOR))  # oversized fallback on
    for name, w, compactor in variants:
        policy = ContextRender(weights=w, embedder=EMB, name=name, compactor=compactor)
        first = policy.render(session, budget)
        assert first.tokens <= budget, name
        assert history_recount(COUNTER, first.messages) == first.tokens <= budget, name
        assert first.visible <= result_seqs, name
        assert pairing_errors(first.messages) == [], name
        for seq in first.visible:  # visible means the complete original text is rendered
            r = session.result(seq)
            assert any(m["role"] == "tool" and m["tool_call_id"] == r.call_id and m["content"] == originals[r.call_id]
                       for m in first.messages), name
        again = policy.render(session, budget)
        assert (again.messages, again.tokens, again.visible) == (first.messages, first.tokens, first.visible), name
        fresh = ContextRender(weights=w, embedder=EMB, name=name, compactor=compactor).render(session, budget)
        assert (fresh.messages, fresh.tokens, fresh.visible) == (first.messages, first.tokens, first.visible), name
