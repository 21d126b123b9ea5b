"""contextrender_plus (NOT the paper's method): budget, switches, stubs, config."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextrender import ContextGraph, HashingEmbedder
from contextrender.compaction import ExtractiveCompactor
from contextrender.plus import ContextRenderPlus
from contextrender.registry import build_policy, method_config
from contextrender.render import Scope
from contextrender.selector import ContextRender
from contextrender.tokens import TokenCounter

EMB = HashingEmbedder(dim=64)


def _transcript(sizes: list[int], reuse: list[int], follow_up: int | None) -> list[dict[str, Any]]:
    """Results of the given sizes (words); call i+1 reuses an id from result reuse[i] % (i+1)."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"},
                                  {"role": "user", "content": "Fix the orders."}]
    for i, n in enumerate(sizes):
        arg = f"ord_{1000 + reuse[i - 1] % i}" if i and i - 1 < len(reuse) else "start"
        cid = f"c{i}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "get", "arguments": json.dumps({"q": arg})}}]})
        msgs.append({"role": "tool", "tool_call_id": cid,
                     "content": f"ord_{1000 + i} sku_{2000 + i} " + " ".join(["lorem ipsum"] * n)})
        if follow_up is not None and i == follow_up:
            msgs.append({"role": "assistant", "content": "ok"})
            msgs.append({"role": "user", "content": f"now check ord_{1000 + i // 2} again"})
    return msgs


def _session(msgs: list[dict[str, Any]], sid: str = "s"):
    s = ContextGraph().session(sid)
    s.sync(msgs)
    return s


def _recount(session, rendered) -> int:
    scope = Scope.of(session)
    outside = sum(session.ntok(s) for s in scope.system)
    if scope.current is not None:
        outside += session.ntok(scope.current)
    return TokenCounter().messages(list(rendered.messages)) - outside


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=12),
       reuse=st.lists(st.integers(0, 20), max_size=12),
       follow_up=st.one_of(st.none(), st.integers(0, 11)),
       budget=st.integers(20, 1500),
       packing=st.booleans(), stubs=st.booleans(), lexical=st.sampled_from([0.0, 1.0, 3.0]),
       compact=st.booleans())
def test_never_above_budget(sizes, reuse, follow_up, budget, packing, stubs, lexical, compact):
    session = _session(_transcript(sizes, reuse, follow_up))
    pol = ContextRenderPlus(embedder=EMB, packing=packing, stubs=stubs, lexical=lexical,
                            compactor=ExtractiveCompactor() if compact else None)
    r = pol.render(session, budget)
    assert r.tokens <= budget
    assert _recount(session, r) == r.tokens
    # visible = complete original text shown
    shown = {(m.get("tool_call_id"), m.get("content")) for m in r.messages if m["role"] == "tool"}
    for seq in r.visible:
        assert (session.result(seq).call_id, session.message(seq).content) in shown


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=10),
       reuse=st.lists(st.integers(0, 20), max_size=10),
       budget=st.integers(20, 1500))
def test_switches_off_is_contextrender(sizes, reuse, budget):
    """Documented baseline: every switch off is ContextRender with the same parameters."""
    msgs = _transcript(sizes, reuse, None)
    a = ContextRenderPlus(embedder=EMB, packing=False, stubs=False, lexical=0.0,
                          compact_omitted=False, compactor=ExtractiveCompactor(), lam=0.2, gamma=0.5)
    b = ContextRender(embedder=EMB, compactor=ExtractiveCompactor(), lam=0.2, gamma=0.5)
    ra, rb = a.render(_session(msgs, "a"), budget), b.render(_session(msgs, "b"), budget)
    assert ra.messages == rb.messages and ra.tokens == rb.tokens and ra.visible == rb.visible


def test_stubs_keep_values_and_are_not_visible():
    msgs = _transcript([400, 400, 400, 5], [0, 0, 0], None)
    session = _session(msgs)
    r = ContextRenderPlus(embedder=EMB, stubs=True).render(session, 700)
    stubs = [m for m in r.messages if m["role"] == "tool" and "values:" in m["content"]]
    assert stubs, "an omitted result should leave a stub when the budget allows"
    by_id = {session.result(s).call_id: s for s in (x.seq for x in session.results)}
    for m in stubs:
        seq = by_id[m["tool_call_id"]]
        assert seq not in r.visible
        assert all(v in m["content"] for v in session.result_values(seq)[:3])
    assert r.tokens <= 700
    plain = ContextRenderPlus(embedder=EMB, stubs=False).render(_session(msgs, "p"), 700)
    assert plain.visible == r.visible  # stubs only use budget left after full results


def test_packing_prefers_several_small_over_one_large():
    msgs = _transcript([5, 5, 5, 600, 0], [0, 0, 0, 3], None)
    # the large result is the most recent and most reused; the small ones fit together
    session = _session(msgs)
    budget = ContextRenderPlus(embedder=EMB).render(session, 10 ** 6).tokens - 200
    plain = ContextRender(embedder=EMB).render(_session(msgs, "a"), budget)
    packed = ContextRenderPlus(embedder=EMB, stubs=False, lexical=0.0).render(_session(msgs, "b"), budget)
    assert len(packed.visible) >= len(plain.visible)


def test_large_omitted_result_keeps_a_compacted_form():
    # A 1,500-word listing just under B cannot fit next to the recent results: the paper's selector
    # only compacts results larger than B, so without compact_omitted its identifiers are lost.
    msgs = _transcript([5, 5, 5], [0, 0], None)
    big = "\n".join(f"row {k}: acct_{7000 + k} lorem ipsum dolor sit amet" for k in range(150))
    msgs[5]["content"] = big  # the second result (tool call "c1")
    session = _session(msgs, "c")
    budget = session.counter.text(big) + 60
    kw = {"embedder": EMB, "stubs": False, "lexical": 0.0, "compactor": ExtractiveCompactor()}
    off = ContextRenderPlus(compact_omitted=False, **kw).render(_session(msgs, "off"), budget)
    on = ContextRenderPlus(compact_omitted=True, **kw).render(session, budget)
    big_seq = 5
    assert big_seq not in on.visible and big_seq not in off.visible
    body = next(m["content"] for m in on.messages if m.get("tool_call_id") == "c1")
    assert "acct_7000" in body and body != big
    assert on.tokens <= budget and _recount(session, on) == on.tokens
    off_body = next(m["content"] for m in off.messages if m.get("tool_call_id") == "c1")
    assert "acct_7000" not in off_body


def test_config_instantiates():
    p = build_policy(method_config("contextrender_plus"), embedder=EMB)
    assert isinstance(p, ContextRenderPlus) and p.name == "contextrender_plus"
    assert p.embedder is EMB  # runtime embedder injected (never the default local model)
    assert p.packing and p.stubs and p.lexical > 0 and p.params.lam == 0.1
    q = build_policy(method_config("contextrender_plus", {"packing": False, "stubs": False, "lexical": 0.0}),
                     embedder=EMB)
    assert not q.packing and not q.stubs and q.lexical == 0.0
