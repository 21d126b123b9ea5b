"""Rules that no other test held (a mutation review changed each one and the suite still passed).

Each test fails if its rule changes: the verbatim-trim target share (0.5·B), Semantic
Retrieval's recency window counted in invocations, JSON-decoded tool-call arguments for TFA,
q_t's "latest visible assistant" after a trim, system messages that are not at the start,
and the recall age of a result that answers an earlier invocation's call.
"""

from __future__ import annotations

import json

import numpy as np

from contextrender import ContextGraph, ContextRender, HashingEmbedder, TokenCounter
from contextrender.baselines.semantic_retrieval import SemanticRetrieval
from contextrender.experiments.evaluation.recall import reuse_events
from contextrender.render import Scope, fit_verbatim
from contextrender.scoring import ScoringParams, query_vector, relevance

from ._helpers import Transcript, filler, result_seq

COUNTER = TokenCounter()


def _prose(tag: str, words: int) -> str:
    return " ".join(f"{tag}word" for _ in range(words))


def test_verbatim_overflow_trims_to_half_the_budget():
    t = Transcript(task="Keep going.")
    for i in range(40):
        t.say(_prose(f"note{i}", 8))
    s = t.into()
    budget = 600
    scope = Scope.of(s)
    trim = fit_verbatim(s, scope, budget)
    assert len(trim.kept) < len(scope.history)
    # At most half of B after the trim, and not one unit more could have stayed (0.5·B, not B or 0.4·B).
    assert trim.base_tokens <= 0.5 * budget
    dropped = [q for q in scope.history if q not in trim.kept]
    newest_dropped = max(dropped)
    assert trim.base_tokens + s.ntok(newest_dropped) > 0.5 * budget


def test_semantic_retrieval_recency_window_counts_invocations_not_results():
    emb = HashingEmbedder(dim=256)
    t = Transcript(task="Find the invoice for the zebra supplier.", system=None)
    old = t.call("search", {"q": "zebra"}, "zebra supplier invoice zebra supplier invoice " + filler("old_r", 40))
    t.call("read", {"id": 1}, filler("mid_r", 40))  # t-3
    b = t.call("read", {"id": 2}, "unrelated weather report " + filler("b_r", 40))  # t-2
    a = t.turn(("read", {"id": 3}, filler("a1", 30)), ("read", {"id": 4}, filler("a2", 30)),
               ("read", {"id": 5}, filler("a3", 30)))  # t-1: three results from one invocation
    t.user("Which zebra supplier invoice?")
    s = t.into()
    recent = [result_seq(s, c) for c in a] + [result_seq(s, b)]
    need = sum(s.ntok(q) - s.result(q).marker_ntok for q in recent)
    base = fit_verbatim(s, Scope.of(s), 10_000).base_tokens
    budget = base + need + 5  # room for the last three invocations' results, and no more
    r = SemanticRetrieval(embedder=emb, recent_turns=3, recent_share=1.0).render(s, budget)
    # Counted in invocations, t-2's result is recent and kept; counted in results (the last three),
    # it would have to compete on similarity with the zebra result, which would win.
    assert set(recent) <= r.visible
    assert result_seq(s, old) not in r.visible


def test_tfa_matches_values_inside_json_decoded_arguments():
    t = Transcript(task="Run it.")
    src = t.call("lookup", {"q": "x"}, "found record REC_VALUE_17 and more")
    raw = json.dumps({"code": "x = 1\nREC_VALUE_17 += 1"})
    assert "\\nREC_VALUE_17" in raw  # raw text glues the escaped newline's 'n' onto the value
    t.call("run", raw, "ok")
    s = t.into()
    edges = [(e.source, e.value) for e in s.reuse_edges()]
    assert (result_seq(s, src), "REC_VALUE_17") in edges


def test_query_uses_latest_visible_assistant_after_a_trim():
    emb = HashingEmbedder(dim=256)
    t = Transcript(task="Audit the ledger.", system=None)
    t.call("read", {"p": 1}, "ledger entries alpha beta " + filler("r1", 30))
    t.call("read", {"p": 2}, "gamma delta entries " + filler("r2", 30),
           content=_prose("verbose", 400))  # the latest assistant: too long to survive the trim
    t.user("Now summarise the ledger.")
    s = t.into()
    budget = 500
    scope = Scope.of(s)
    trim = fit_verbatim(s, scope, budget)
    last_asst = max(i for i, m in enumerate(s.messages) if m.role == "assistant")
    assert last_asst not in trim.kept and not any(s.message(q).role == "assistant" for q in trim.kept)
    sel = ContextRender(embedder=emb).select(s, budget)
    p = ScoringParams()
    embs, _ = s.result_embeddings(emb, [r.seq for r in s.results])
    first_user = next(m for m in s.messages if m.role == "user")
    task, _ = emb.embed_query(first_user.content[: p.task_chars])
    user_only, _ = emb.embed_query(s.message(scope.current).text())
    with_asst, _ = emb.embed_query(s.message(scope.current).text() + "\n" + s.message(last_asst).text())
    expect = relevance(embs, query_vector(task, user_only, p))
    wrong = relevance(embs, query_vector(task, with_asst, p))
    got = np.array([r.relevance for r in sel.scores])
    assert np.allclose(got, expect) and not np.allclose(got, wrong)


def test_system_message_after_the_start_is_history():
    t = Transcript(task="Do it.")
    t.call("read", {"p": 1}, filler("first_r", 20))
    t.messages.append({"role": "system", "content": "Reminder: cite the record ids you use."})
    t.call("read", {"p": 2}, filler("second_r", 20))
    s = t.into()
    scope = Scope.of(s)
    mid = next(i for i, m in enumerate(s.messages) if m.role == "system" and i > 0)
    assert scope.system == (0,) and mid in scope.history
    assert scope.full_tokens(s) == s.total_tokens - s.ntok(0) - s.ntok(scope.current)
    rendered = ContextRender(embedder=HashingEmbedder(dim=64)).render(s, scope.full_tokens(s) - 1)
    roles = [m["role"] for m in rendered.messages]
    assert roles[0] == "system" and roles.count("system") == 2  # kept in place, charged to B
    assert rendered.messages[roles.index("system", 1)]["content"].startswith("Reminder")


def test_recall_age_counts_from_the_invocation_that_made_the_call():
    msgs = [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "slow", "arguments": "{}"}}]},
        {"role": "assistant", "content": "Waiting for the slow tool."},  # invocation 1, no call
        {"role": "tool", "tool_call_id": "c1", "content": "TOKEN_FROM_C1 ready"},  # answers invocation 0
        {"role": "assistant", "content": "Using TOKEN_FROM_C1 now."},  # invocation 2
    ]
    (event,) = reuse_events(msgs)
    assert (event.j, event.result_seq, event.age) == (2, 3, 2)  # 2 − 0, not 2 − 1 (its position)


def test_graph_result_invocation_is_the_calls_invocation():
    # The same rule in the selector's ages (docs/method.md §4): a_t(r) = t − k for the call's invocation k.
    g = ContextGraph()
    s = g.session("late")
    s.extend([
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "slow", "arguments": "{}"}}]},
        {"role": "assistant", "content": "Waiting."},
        {"role": "tool", "tool_call_id": "c1", "content": "late result"},
    ])
    assert s.results[0].invocation == 0 and s.next_invocation == 2
