"""The paper's motivating example (docs/method.md §3.1): reuse keeps Nancy's address in context.

With the real local embedder, at the final invocation of the dinner-bill
transcript and the same B for every method, ContextRender keeps the contact
search result visible while Prune, Semantic Retrieval and the
CR-Recency+Relevance ablation drop it; without the reuse edges (the payment
calls' addresses altered so they match nothing) ContextRender drops it too.
"""

from __future__ import annotations

import pytest

from contextrender import CachedEmbedder, ContextGraph
from contextrender.experiments.fixtures.scenarios import DINNER_BILL_BUDGET, DINNER_BILL_CONTACT_SEQ, dinner_bill
from contextrender.registry import build_policy, method_config

pytestmark = pytest.mark.slow  # loads the sentence-transformers model


def _session(reuse: bool):
    s = ContextGraph().session("dinner")
    s.sync(dinner_bill(reuse=reuse))
    return s


def test_transcript_shape():
    msgs = dinner_bill()
    assert sum(m["role"] == "assistant" for m in msgs) == 18  # invocations 0–17; the next one asks Nancy
    contacts = msgs[DINNER_BILL_CONTACT_SEQ]["content"]
    assert "kathrynmaldonado@gmail.com" in contacts and "nancy.ritter@gmail.com" in contacts
    s = _session(True)
    assert s.next_invocation == 18 and s.result(DINNER_BILL_CONTACT_SEQ).invocation == 8
    assert "nancy.ritter" in s.result_values(DINNER_BILL_CONTACT_SEQ)
    edges = [e for e in s.reuse_edges() if e.source == DINNER_BILL_CONTACT_SEQ]
    calls = {(s.message(e.op_seq).tool_calls[e.part].name, e.value) for e in edges if e.part >= 0}
    assert calls == {("venmo__create_payment_request", "gmail.com"), ("venmo__create_payment_request", "troy_solo")}
    assert {s.invocation_of(e.op_seq) for e in edges} == {14, 16}
    assert not [e for e in _session(False).reuse_edges() if e.source == DINNER_BILL_CONTACT_SEQ]


@pytest.fixture(scope="module")
def renders(local_embedder, tmp_path_factory):
    # The two transcripts share their tool results: cache embeddings across the two sessions.
    embedder = CachedEmbedder(local_embedder, tmp_path_factory.mktemp("emb") / "embeddings.sqlite")
    out = {}
    for reuse in (True, False):
        s = _session(reuse)
        for name in ("contextrender", "prune", "semantic_retrieval", "cr_recency_relevance"):
            policy = build_policy(method_config(name), embedder=embedder)
            out[name, reuse] = policy.render(s, DINNER_BILL_BUDGET)
    return out


def test_reuse_keeps_the_contact_result(renders):
    for rendered in renders.values():
        assert rendered.tokens <= DINNER_BILL_BUDGET
    assert DINNER_BILL_CONTACT_SEQ in renders["contextrender", True].visible
    for name in ("prune", "semantic_retrieval", "cr_recency_relevance"):
        assert DINNER_BILL_CONTACT_SEQ not in renders[name, True].visible, name


def test_without_reuse_edges_contextrender_drops_it_too(renders):
    assert DINNER_BILL_CONTACT_SEQ not in renders["contextrender", False].visible
