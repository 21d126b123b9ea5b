"""Property: every budgeted method rendered cache-aware (docs/method.md §15) stays under B, keeps call/result pairing,
answers a repeated render of one invocation with the same render, and only ever appends to its previous render
while that still fits."""

from __future__ import annotations

from types import SimpleNamespace

from _baseline_util import history_recount, pairing_errors
from hypothesis import given, settings
from hypothesis import strategies as st
from test_baseline_properties import BUDGETED, PEERS, transcripts

from contextrender import ContextGraph, ExtractiveCompactor, HashingEmbedder
from contextrender.cache_aware import CacheAware
from contextrender.registry import build_policy, method_config

EMB = HashingEmbedder(dim=64)
METHODS = (*BUDGETED, *PEERS, "contextrender_plus")


def _policies() -> dict[str, CacheAware]:
    compactor = ExtractiveCompactor()
    out = {}
    for name in METHODS:
        p = build_policy(method_config(name, {"cache_aware": True}), embedder=EMB, compactor=compactor)
        assert isinstance(p, CacheAware), name
        out[name] = p
    return out


POLICIES = _policies()


@settings(max_examples=40, deadline=None)
@given(transcripts(), st.integers(4, 2500))
def test_cache_aware_renders_stay_under_budget_and_append_while_they_fit(messages, budget):
    session = ContextGraph().session("ca")
    last: dict[str, tuple] = {}

    def render_all() -> None:
        for name, policy in POLICIES.items():
            out = policy.render(session, budget)
            assert out.tokens <= budget, (name, out.tokens, budget)
            assert out.tokens == history_recount(session, out), name
            assert not pairing_errors(out.messages), (name, pairing_errors(out.messages))
            assert out.visible <= {r.seq for r in session.results}
            again = policy.render(session, budget)
            assert (again.messages, again.tokens) == (out.messages, out.tokens), name
            prev = last.get(name)
            if prev is not None:
                # The previous render with what arrived since appended: taken whenever it fits B.
                prev_msgs, prev_n = prev
                appended = prev_msgs + tuple(session.message(s).to_openai() for s in range(prev_n, len(session)))
                if history_recount(session, SimpleNamespace(messages=appended)) <= budget:
                    assert out.messages == appended, name
            last[name] = (out.messages, len(session))

    for m in messages:
        if m["role"] == "assistant":
            render_all()
        session.add(m)
    render_all()
