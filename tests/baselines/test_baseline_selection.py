"""Full history, Prune and Semantic Retrieval: exact selections at a given B (docs/method.md §6)."""

from __future__ import annotations

from _baseline_util import KeywordEmbedder, Transcript, base_tokens, delta, history_recount, pairing_errors, text_of

from contextrender import TokenCounter, Usage
from contextrender.baselines import FullHistory, Prune, SemanticRetrieval
from contextrender.render import Scope, marker_text


def _five_results() -> tuple[Transcript, list[int]]:
    t = Transcript()
    seqs = [t.call(text_of(f"result {i}", n)) for i, n in enumerate([300, 50, 200, 120, 80])]
    return t, seqs


def _tool_bodies(rendered) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in rendered.messages if m["role"] == "tool"}


# -- Full history --------------------------------------------------------------------


def test_full_history_passes_everything_even_above_budget():
    t, r = _five_results()
    s = t.session()
    full = Scope.of(s).full_tokens(s)
    out = FullHistory().render(s, budget=100)
    assert FullHistory.budgeted is False
    assert list(out.messages) == s.openai_messages()
    assert out.tokens == full == history_recount(s, out) > 100
    assert out.visible == set(r)
    assert out.usage == Usage()


# -- Prune ---------------------------------------------------------------------------


def test_prune_returns_full_history_when_it_fits():
    t, r = _five_results()
    s = t.session()
    full = Scope.of(s).full_tokens(s)
    out = Prune().render(s, full)
    assert list(out.messages) == s.openai_messages()
    assert out.visible == set(r) and out.tokens == full


def test_prune_keeps_newest_first_and_skips_what_does_not_fit():
    t, r = _five_results()
    s = t.session()
    slack = 10
    budget = base_tokens(s) + delta(s, r[4]) + delta(s, r[3]) + delta(s, r[1]) + slack
    # After r4 and r3, r2 does not fit (skipped); r1 still does; r0 does not.
    assert delta(s, r[2]) > delta(s, r[1]) + slack and delta(s, r[0]) > slack
    out = Prune().render(s, budget)
    assert out.visible == {r[4], r[3], r[1]}
    assert out.tokens == budget - slack == history_recount(s, out)
    bodies = _tool_bodies(out)
    # Omitted results keep their call and show the marker (charged to B).
    for i in (0, 2):
        assert bodies[s.result(r[i]).call_id] == marker_text(s, r[i])
    assert bodies[s.result(r[1]).call_id] == s.message(r[1]).content
    assert not pairing_errors(out.messages)
    assert out.usage == Usage()


def test_prune_falls_back_to_fit_verbatim_when_messages_alone_exceed_budget():
    t = Transcript(task="Fix the build.")
    for i in range(6):
        t.call(text_of(f"log {i}", 30), say=" ".join(["reasoning"] * 60))
    s = t.session()
    budget = 200
    assert base_tokens(s) > budget
    out = Prune().render(s, budget)
    assert out.tokens <= budget and out.tokens == history_recount(s, out)
    assert not pairing_errors(out.messages)
    # Whole turns went, oldest first; the task message (current, outside B) stays.
    calls = [m["tool_calls"][0]["id"] for m in out.messages if m["role"] == "assistant"]
    assert 0 < len(calls) < 6 and calls == [f"call_{i:03d}" for i in range(6 - len(calls), 6)]
    assert out.messages[1]["content"] == "Fix the build."


# -- Semantic Retrieval ------------------------------------------------------------


def _fruit() -> tuple[Transcript, list[int]]:
    """Seven invocations; the last assistant message asks about bananas."""
    t = Transcript(task="Plan the weekly fruit order.")
    tags = ["apple banana", "banana", "cherry", "banana banana", "durian", "apple", "cherry"]
    sizes = [100, 60, 60, 150, 50, 400, 40]
    seqs = [t.call(text_of(tag, n), say="Now the banana prices." if i == 6 else None)
            for i, (tag, n) in enumerate(zip(tags, sizes, strict=True))]
    return t, seqs


def _fruit_budget(s, r) -> int:
    return base_tokens(s) + sum(delta(s, r[i]) for i in (6, 4, 1, 3, 2)) + 5


def test_semantic_retrieval_recent_turns_first_then_cosine():
    t, r = _fruit()
    s = t.session()
    budget = _fruit_budget(s, r)
    quota = int(0.6 * budget)
    ntok = {i: s.result(r[i]).ntok for i in range(7)}
    # Recent turns (invocations 4–6 at t = 7), newest first: r6, then r5 exceeds 60% of B (skipped), then r4.
    assert ntok[6] + ntok[5] > quota >= ntok[6] + ntok[4]
    # The rest by cosine to "banana": r1 (1.0) > r3 > r0 (apple+banana) > r2 = r5 (tie → older r2 first).
    # r0 does not fit after r1 and r3; r2 does (skip and continue); r5 does not.
    out = SemanticRetrieval(embedder=KeywordEmbedder()).render(s, budget)
    assert out.visible == {r[6], r[4], r[1], r[3], r[2]}
    assert out.tokens == budget - 5 == history_recount(s, out)
    assert _tool_bodies(out)[s.result(r[0]).call_id] == marker_text(s, r[0])
    assert not pairing_errors(out.messages)


def test_semantic_retrieval_reselects_an_omitted_result_later():
    t, r = _fruit()
    s = t.session()
    budget = _fruit_budget(s, r)
    policy = SemanticRetrieval(embedder=KeywordEmbedder())
    assert r[0] not in policy.render(s, budget).visible
    t.call(text_of("durian", 20), say="Back to the apple order.")
    s.sync(t.messages)
    later = policy.render(s, budget)
    assert r[0] in later.visible  # nothing was deleted: the apple result comes back


def test_semantic_retrieval_usage_counts_result_and_query_embeddings():
    t, r = _fruit()
    s = t.session()
    budget = _fruit_budget(s, r)
    emb = KeywordEmbedder()
    policy = SemanticRetrieval(embedder=emb)
    first = policy.render(s, budget)
    # Recent results kept in step 2 need no similarity; the others are embedded once, plus the query.
    embedded = [s.message(x).content for x in (r[0], r[1], r[2], r[3], r[5])]
    query = policy.retrieval_input(s, Scope.of(s), set(Scope.of(s).history))
    assert query == "Plan the weekly fruit order.\nNow the banana prices.\nlookup\n"
    assert first.usage == Usage(embedding=sum(len(x.split()) for x in embedded) + len(query.split()))
    again = policy.render(s, budget)
    assert again.usage == Usage(embedding=len(query.split()))  # stored embeddings are not recomputed
    assert again == first.__class__(first.messages, first.tokens, first.visible, again.usage, first.sources)


def test_semantic_retrieval_is_free_when_the_history_fits(hashing_embedder):
    t, r = _fruit()
    s = t.session()
    out = SemanticRetrieval(embedder=hashing_embedder).render(s, 10_000)
    assert out.visible == set(r) and out.usage == Usage()


def test_semantic_retrieval_with_hashing_embedder_usage(hashing_embedder):
    t, r = _fruit()
    s = t.session()
    out = SemanticRetrieval(embedder=hashing_embedder).render(s, _fruit_budget(s, r))
    assert out.usage.embedding > 0 and out.usage.input == out.usage.output == 0
    cl100k = TokenCounter("cl100k_base")
    assert out.usage.embedding >= sum(cl100k.text(s.message(x).content) for x in (r[0], r[5]))
