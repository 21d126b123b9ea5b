"""The prose-first verbatim trim (render.fit_verbatim(prose_first=True); contextrender_plus's
``trim_prose_first``): old assistant prose goes before the oldest units, the target stays 50 % of B,
the first user message and the newest assistant message are never dropped, and the paper's policy
keeps the project rule."""

from __future__ import annotations

from contextrender import ContextRender, HashingEmbedder
from contextrender.experiments.evaluation.ceiling import HindsightCeiling
from contextrender.plus import ContextRenderPlus
from contextrender.render import Scope, first_user, fit_verbatim

from ._helpers import Transcript, filler, result_seq


def _prose(tag: str, words: int) -> str:
    return " ".join(f"{tag}word" for _ in range(words))


def _dialogue():
    """A lookup first (its result reused by the last call), then a long chat of assistant prose and user
    replies, then the call that reuses the lookup's value."""
    t = Transcript(task="Change my booking.", system=None)
    lookup = t.call("get_user_details", {"user_id": "mia_li_3668"}, "reservations: RES_AB12CD " + filler("u", 30))
    for i in range(12):
        t.say(_prose(f"recap{i}", 25))
        t.user(_prose(f"answer{i}", 6))
    t.say("Shall I go ahead with RES_AB12CD?")
    t.user("yes")
    return t, lookup


def test_prose_goes_first_and_the_old_lookup_stays_a_candidate():
    t, lookup = _dialogue()
    s = t.into()
    scope = Scope.of(s)
    budget = 700
    seq = result_seq(s, lookup)
    call_seq = s.result(seq).call_seq
    old = fit_verbatim(s, scope, budget)
    new = fit_verbatim(s, scope, budget, prose_first=True)
    # The project rule drops the oldest unit first: the lookup's call and result go.
    assert call_seq not in old.kept and seq not in old.kept
    # Prose first: the lookup survives; only assistant prose is dropped, never a user message.
    assert call_seq in new.kept and seq in new.kept
    dropped = [q for q in scope.history if q not in new.kept]
    assert dropped and all(s.message(q).role == "assistant" and not s.message(q).tool_calls for q in dropped)
    # Same target: at most half of B, and not one dropped message more than needed.
    assert new.base_tokens <= 0.5 * budget
    assert new.base_tokens + min(s.ntok(q) for q in dropped) > 0.5 * budget
    # The newest assistant message (what the user's "yes" answers) and the task message are kept.
    newest = max(q for q in scope.history if s.message(q).role == "assistant")
    assert newest in new.kept
    assert first_user(s)[0] in new.kept


def test_prose_first_falls_back_to_the_oldest_units_when_prose_is_not_enough():
    t = Transcript(task="Keep going.", system=None)
    calls = [t.call("read", {"id": i}, filler(f"r{i}", 60)) for i in range(8)]
    t.say(_prose("only", 5))
    t.user(_prose("more", 40))
    s = t.into()
    scope = Scope.of(s)
    budget = 160
    assert fit_verbatim(s, scope, 10_000).base_tokens > budget  # the calls and their markers overflow B
    trim = fit_verbatim(s, scope, budget, prose_first=True)
    assert trim.base_tokens <= 0.5 * budget
    kept_calls = [c for c in calls if result_seq(s, c) in trim.kept]
    assert kept_calls == calls[len(calls) - len(kept_calls):]  # the oldest calls went, in order
    assert first_user(s)[0] in trim.kept


def test_prose_first_is_a_no_op_within_the_budget_and_off_for_the_paper_policy():
    t, _ = _dialogue()
    s = t.into()
    scope = Scope.of(s)
    assert fit_verbatim(s, scope, 100_000, prose_first=True) == fit_verbatim(s, scope, 100_000)
    assert ContextRender(embedder=HashingEmbedder(dim=64)).trim_prose_first is False
    assert ContextRenderPlus(embedder=HashingEmbedder(dim=64)).trim_prose_first is False  # the yaml turns it on
    assert HindsightCeiling(embedder=HashingEmbedder(dim=64)).trim_prose_first is False


def test_plus_with_prose_first_shows_the_old_result_and_stays_under_b():
    t, lookup = _dialogue()
    s = t.into()
    seq = result_seq(s, lookup)
    budget = 700
    emb = HashingEmbedder(dim=64)
    paper = ContextRender(embedder=emb).render(s, budget)
    plus = ContextRenderPlus(embedder=emb, trim_prose_first=True).render(s, budget)
    assert seq not in paper.visible
    assert seq in plus.visible
    assert plus.tokens <= budget and paper.tokens <= budget
