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
from contextrender.cache_aware import CacheAware, _covers, _forms
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
    held: dict[str, dict[int, str] | None] = {}  # per method: the forms its latest render held each result in

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
                if history_recount(session, SimpleNamespace(messages=appended)) <= budget and out.messages != appended:
                    # Only a selector that holds results as it showed them (the plus) declines an appended render that
                    # fits, and only when the method would now show some result in a stronger form than the appended
                    # render holds it (an older one the latest messages made relevant; docs/method.md §15).
                    assert policy._pins and held.get(name) is not None, name
                    forms = {**held[name], **{s: "full" for s in range(prev_n, len(session)) if session.is_result(s)}}
                    fresh = policy.inner.pinning(session, budget, explain=False)({})
                    assert not fresh.shortcut and not _covers(forms, _forms(fresh)), name
            last[name] = (out.messages, len(session))
            plan = policy._plans[(session.graph.uid, session.id, budget, False)][1]  # no tool offered here
            held[name] = None if plan.held is None else {q: f for q, (_, f) in plan.held.items()}

    for m in messages:
        if m["role"] == "assistant":
            render_all()
        session.add(m)
    render_all()
