"""Usefulness score U_t(r), ablation weights, ages and the query vector q_t (docs/method.md §4)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from contextrender import ContextRender, HashingEmbedder, Weights
from contextrender.registry import build_policy, method_config
from contextrender.scoring import ScoringParams, usefulness

from ._helpers import Transcript, filler, result_seq


def U(age, c, s, w=(1.0, 1.0, 1.0)):
    """Spec §4 by hand, with (W_rec, W_rel, W_reuse)."""
    return w[0] * math.exp(-0.3 * age) + w[2] * (1 - math.exp(-0.2 * c)) + w[1] * s


@pytest.mark.parametrize("age, c, s, expected", [
    (1, 0.0, 0.0, 0.7408182206817179),
    (3, 2.5, 0.4, math.exp(-0.9) + 1 - math.exp(-0.5) + 0.4),
    (10, 2.0, 0.0, 0.049787068367863944 + 0.3296799539643607),
    (0, 0.0, 1.0, 2.0),
    (25, 100.0, 0.25, math.exp(-7.5) + 1 - math.exp(-20.0) + 0.25),
])
def test_usefulness_formula_by_hand(age, c, s, expected):
    got = usefulness(np.array([age], float), np.array([c], float), np.array([s], float), ScoringParams())
    assert got[0] == pytest.approx(expected, rel=1e-12)


def test_default_constants():
    p = ScoringParams()
    assert (p.lam, p.gamma, p.diversity, p.task_weight, p.focus_weight, p.task_chars, p.result_chars) == (
        0.3, 0.2, 0.5, 0.4, 0.6, 2000, 8000)
    assert p.weights == Weights(1.0, 1.0, 1.0)


@pytest.mark.parametrize("name, weights", [
    ("contextrender", (1.0, 1.0, 1.0)),
    ("cr_recency", (1.0, 0.0, 0.0)),
    ("cr_relevance", (0.0, 1.0, 0.0)),
    ("cr_recency_relevance", (1.0, 1.0, 0.0)),
])
def test_ablation_configs_zero_weights_without_renormalising(name, weights, hashing_embedder):
    policy = build_policy(method_config(name), embedder=hashing_embedder)
    w = policy.params.weights
    assert (w.recency, w.relevance, w.reuse) == weights
    assert (policy.params.lam, policy.params.gamma, policy.params.diversity) == (0.3, 0.2, 0.5)


def _scored_session():
    """Results with non-zero reuse and relevance, and varied ages; full history > budget."""
    t = Transcript(task="Find the invoice total for customer acme_corp_7 in the billing ledger.")
    a = t.call("search_customers", {"q": "acme"}, "customer acme_corp_7 billing ledger id ledger_55\n" + filler("x", 80))
    t.call("read_ledger", {"id": "ledger_55", "customer": "acme_corp_7"}, "invoice total 4200 for acme_corp_7 " + filler("y", 80))
    t.call("weather", {}, filler("sunny_day", 80))
    t.call("note", {"customer": "acme_corp_7"}, filler("note_text_1", 80))
    return t.into(), a


@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (1.0, 1.0, 0.0)])
def test_selector_usefulness_equals_formula_for_each_weighting(weights, hashing_embedder):
    s, a = _scored_session()
    full = ContextRender(embedder=hashing_embedder).select(s, 300)
    assert not full.shortcut
    by_seq = {r.seq: r for r in full.scores}
    assert by_seq[result_seq(s, a)].reuse_count > 0 and max(r.relevance for r in full.scores) > 0

    w = Weights(recency=weights[0], relevance=weights[1], reuse=weights[2])
    sel = ContextRender(weights=w, embedder=hashing_embedder).select(s, 300)
    for r in sel.scores:
        ref = by_seq[r.seq]
        assert r.usefulness == pytest.approx(U(ref.age, ref.reuse_count, ref.relevance, weights), rel=1e-9, abs=1e-12)
    if weights == (1.0, 0.0, 0.0):  # CR-Recency: exactly exp(-0.3·age), reuse and relevance add nothing
        for r in sel.scores:
            assert r.usefulness == pytest.approx(math.exp(-0.3 * r.age), rel=1e-12)


def test_ages_count_turns_since_the_producing_invocation(hashing_embedder):
    t = Transcript()
    first = t.call("a", {}, filler("one_result", 100))
    s = t.into()
    t2 = Transcript()
    t2.messages = list(t.messages)
    t2._calls = t._calls
    ids = t2.turn(("b", {}, filler("two_result", 100)), ("c", {}, filler("three_result", 100)))
    t2.say("thinking without tools")
    s2 = t2.into()

    assert s.next_invocation == 1
    sel = ContextRender(embedder=hashing_embedder).select(s, 20)
    assert [(r.seq, r.age) for r in sel.scores] == [(result_seq(s, first), 1)]  # the very next call: age 1

    sel2 = ContextRender(embedder=hashing_embedder).select(s2, 60)
    ages = {r.seq: r.age for r in sel2.scores}
    assert s2.next_invocation == 3
    assert ages == {result_seq(s2, first): 3, result_seq(s2, ids[0]): 2, result_seq(s2, ids[1]): 2}


class RecordingEmbedder(HashingEmbedder):
    def __init__(self):
        super().__init__(dim=256)
        self.queries: list[str] = []

    def embed_query(self, text):
        self.queries.append(text)
        return super().embed_query(text)


def test_query_vector_uses_clipped_task_and_latest_user_plus_assistant():
    task = ("Audit the payroll records for the engineering team. " * 40) + ("zebra giraffe elephant " * 200)
    assert len(task) > 2000
    t = Transcript(task=task)
    t.call("list_payroll", {"team": "engineering"}, "payroll engineering salaries records " * 100)
    t.call("list_animals", {}, "zebra giraffe elephant " * 100)
    t.user("Now check the overtime hours of the engineering team.")
    t.call("overtime", {"team": "engineering"}, "overtime hours engineering team " * 100, content="Checking overtime")
    s = t.into()
    emb = RecordingEmbedder()
    budget = 1500
    sel = ContextRender(embedder=emb).select(s, budget)
    assert not sel.shortcut and all(r.candidate for r in sel.scores)
    x, f = emb.queries
    assert x == task[:2000]
    last_asst = s.messages[-2]
    assert "Now check the overtime hours" in f and "Checking overtime" in f and "overtime" in f
    assert f.endswith(last_asst.tool_calls[0].text()) or last_asst.tool_calls[0].arguments in f

    ref = HashingEmbedder(dim=256)
    unit = lambda v: v / np.linalg.norm(v)  # noqa: E731
    q = 0.4 * unit(ref.embed_query(task[:2000])[0].astype(float)) + 0.6 * unit(ref.embed_query(f)[0].astype(float))
    for r in sel.scores:
        e = ref.embed_documents([s.message(r.seq).content])[0][0].astype(float)
        expected = max(float(e @ q) / float(np.linalg.norm(q)), 0.0)
        assert r.relevance == pytest.approx(expected, abs=1e-6)
    # The clip matters: the tail of the task (animals) is not part of x.
    animals = next(r for r in sel.scores if s.result(r.seq).tool_name == "list_animals")
    payroll = next(r for r in sel.scores if s.result(r.seq).tool_name == "list_payroll")
    assert payroll.relevance > animals.relevance


def test_embeddings_are_of_the_first_8000_chars(hashing_embedder):
    head = "alpha beta gamma delta " * 400  # > 8000 chars
    t = Transcript()
    a = t.call("read", {}, head[:8000] + " omega_tail " * 500)
    b = t.call("read", {}, head[:8000])
    s = t.into()
    embs, _ = s.result_embeddings(hashing_embedder, [result_seq(s, a), result_seq(s, b)])
    assert np.array_equal(embs[0], embs[1])
