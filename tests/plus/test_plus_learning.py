"""contextrender_plus learns from the user's own graph file only, and its id forms (NOT the paper's method).

What it learns: per tool name, how often a result was reused later — by a later tool call or by an
assistant's text — in the other sessions of the same graph file (ContextGraph.tool_reuse) and this one
so far. Nothing comes from a config table; a retried harness episode's earlier tries and superseded
attempts are left out; replay gives every method its own file, so no method learns from another's
session of the very trace it replays.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextrender import ContextGraph, HashingEmbedder
from contextrender.graph import ToolReuse
from contextrender.idform import HEADER, MAX_VALUES, id_form
from contextrender.plus import ContextRenderPlus
from contextrender.readiness import RenderedText, transcript_needs
from contextrender.render import Scope
from contextrender.selector import ContextRender
from contextrender.tokens import TokenCounter

EMB = HashingEmbedder(dim=64)


def call(cid: str, name: str, **args: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def result(cid: str, body: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": body if isinstance(body, str) else json.dumps(body)}


def episode(k: int) -> list[dict[str, Any]]:
    """lookup → its id used by a later call; search → mentioned in text only; audit → never used again."""
    return [{"role": "user", "content": f"Case {k}."},
            call(f"a{k}", "lookup"), result(f"a{k}", {"ref": f"REF_{k}00", "note": "x " * 30}),
            call(f"b{k}", "search"), result(f"b{k}", {"hit": f"HIT_{k}11"}),
            call(f"c{k}", "audit"), result(f"c{k}", {"log": f"LOG_{k}22"}),
            {"role": "assistant", "content": f"I found HIT_{k}11."},
            call(f"d{k}", "update", ref=f"REF_{k}00")]


def test_tool_reuse_counts_each_result_once_by_how_it_was_reused():
    g = ContextGraph()
    for k in range(3):
        g.session(f"ep{k}").sync(episode(k))
    got = g.tool_reuse()
    assert got["lookup"] == ToolReuse(results=3, reused=3, by_call=3, by_text=0)
    assert got["search"] == ToolReuse(results=3, reused=3, by_call=0, by_text=3)
    assert got["audit"] == ToolReuse(results=3, reused=0, by_call=0, by_text=0)
    assert g.tool_reuse(exclude=["ep0", "ep2"])["lookup"] == ToolReuse(1, 1, 1, 0)
    g.session("ep3").sync(episode(3)[:3])  # incremental: only what was added since is read
    assert g.tool_reuse()["lookup"] == ToolReuse(results=4, reused=3, by_call=3, by_text=0)


def test_the_learned_rates_come_from_the_file_and_this_session():
    g = ContextGraph()
    pol = ContextRenderPlus(embedder=EMB, id_forms=True, learned_prior=1.0, learned_id_value=True)
    s0 = g.session("first")
    s0.sync(episode(0)[:7])
    alone = pol.learned(s0, pol._stage(s0, 40, None))  # type: ignore[arg-type]
    # the file holds only this session: the newest result (audit) is too young to count and sits at the pooled
    # rate; the two older ones had a later call to be reused by and were not, so they sit below it
    assert alone["lookup"].reuse == alone["search"].reuse < alone["audit"].reuse
    for k in range(1, 6):
        g.session(f"ep{k}").sync(episode(k))
    s = g.session("now")
    s.sync(episode(9)[:7])
    rates = pol.learned(s, pol._stage(s, 40, None))  # type: ignore[arg-type]
    assert rates["lookup"].reuse > 0.6 > 0.25 > rates["audit"].reuse
    assert rates["lookup"].call > rates["lookup"].text and rates["search"].text > rates["search"].call
    st_ = pol._stage(s, 40, None)
    beta = dict(zip((s.result(r).tool_name for r in st_.results), pol.id_values(s, st_), strict=True))  # type: ignore[union-attr, arg-type]
    # ids are worth most for a tool whose results later calls use, least for one that is talked about
    assert beta["lookup"] > 0.8 > beta["audit"] > beta["search"]


def test_superseded_attempts_and_the_sessions_own_tries_are_left_out():
    g = ContextGraph()
    for sid in ("k1#1", "k1#2", "k2#1", "other"):
        g.session(sid).sync(episode(1))
    pol = ContextRenderPlus(embedder=EMB, learned_prior=1.0)
    assert set(pol.siblings(g.session("k2#1"))) == {"k1#1"}  # k1's first try was superseded by k1#2
    g.session("k2#2").sync(episode(2)[:3])
    assert set(pol.siblings(g.session("k2#2"))) == {"k1#1", "k2#1"}  # and its own earlier try


def test_no_method_learns_from_another_methods_session_of_the_same_trace(tmp_path):
    """Replay gives each method its own graph file: the plus's figures do not depend on what else is replayed."""
    from contextrender.experiments.evaluation.replay import replay_traces

    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"task_id": str(k), "messages": episode(k)}) + "\n" for k in range(6)))
    alone = replay_traces(path, 60, ["contextrender_plus"], embedder=EMB, ceiling=False)
    beside = replay_traces(path, 60, ["prune", "contextrender_plus", "contextrender"], embedder=EMB, ceiling=False)
    a, b = alone.methods["contextrender_plus"], beside.methods["contextrender_plus"]
    assert a.summary() == b.summary()


def test_id_forms_keep_what_the_next_call_needs_when_the_result_does_not_fit():
    variants = {str(9000000000 + i): {"item_id": str(9000000000 + i), "colour": "black", "size": i,
                                      "blurb": "a long description of this variant " * 3, "price": 100.5 + i}
                for i in range(12)}
    msgs = [{"role": "user", "content": "Swap my item."},
            call("c1", "get_product", product_id="PROD_77"),
            result("c1", {"product_id": "PROD_77", "variants": variants}),
            call("c2", "swap", new_item=str(9000000000 + 7))]
    session = ContextGraph().session("s")
    session.sync(msgs[:-1])
    full = session.result(2).ntok
    for budget in (full // 3, full // 2):
        on = ContextRenderPlus(embedder=EMB, id_forms=True).render(session, budget)
        off = ContextRenderPlus(embedder=EMB, id_forms=False, tabular=False, stubs=False,
                                compact_omitted=False).render(session, budget)
        [c] = transcript_needs(msgs)[1]
        assert on.tokens <= budget and off.tokens <= budget
        assert RenderedText.of(on.messages).missing(c) == () and RenderedText.of(off.messages).missing(c)
        assert 2 not in on.visible  # an id form is never the complete original text (docs/method.md §7)


def test_id_form_of_json_and_of_other_text():
    form = id_form(json.dumps({"order_id": "#W2378156", "paid": True, "n": 7, "items": [
        {"item_id": "1151293680", "price": 272.33, "note": "short phrase here"},
        {"item_id": "4983901480", "price": 262.47, "note": "x" * 3}],
        "variants": {"111111": {"item_id": "111111"}, "222222": {"colour": "red"}},
        "prose": "word " * 20 + "REF_99 and 12345 inside"}))
    lines = form.splitlines()
    assert lines[0] == HEADER
    assert "order_id: #W2378156" in lines and "items.item_id: 1151293680, 4983901480" in lines
    assert "items.price: 272.33, 262.47" in lines and "items.note: short phrase here" in lines
    assert "variants.*.item_id: 111111" in lines and "variants.*: 222222" in lines  # a key repeated inside: once
    assert "prose: REF_99, 12345" in lines  # long prose gives its ids and numbers only
    assert "n: 7" in lines  # every number: a call that writes it 7.000 needs it
    assert not any(x in form for x in ("True", "paid"))  # booleans: never needed
    text = id_form("Found: ['NVDA', 'AB', 'a long phrase that is far longer than forty characters in all'] total 12,345.5")
    assert text.splitlines()[1] == "12,345.5, NVDA"
    records = id_form(json.dumps({"history": {"booking001": {"to": "LAX", "cost": 640.0},
                                              "booking002": {"to": "SFO", "cost": 400.0}}}))
    assert "history.*.cost: 640.0, 400.0" in records.splitlines()  # a dict of records is keyed by ids
    assert "history.*: booking001, booking002" in records.splitlines()
    many = id_form(json.dumps({"series": [1000 + i for i in range(MAX_VALUES + 10)]}))
    assert many.endswith("(10 more)") and str(1000 + MAX_VALUES) not in many
    assert id_form("") == HEADER and id_form("[true, null]") == HEADER and id_form("[1, 2]") == HEADER + "\n-: 1, 2"


def _recount(session: Any, rendered: Any) -> int:
    scope = Scope.of(session)
    outside = sum(session.ntok(s) for s in scope.system)
    if scope.current is not None:
        outside += session.ntok(scope.current)
    return TokenCounter().messages(list(rendered.messages)) - outside


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 8), width=st.integers(1, 40), budget=st.integers(20, 2500), learned=st.booleans(),
       fixed=st.sampled_from([0.0, 0.5, 1.0]), earlier=st.integers(0, 3), packing=st.booleans())
def test_never_above_budget_with_id_forms_and_learning(n, width, budget, learned, fixed, earlier, packing):
    g = ContextGraph()
    for k in range(earlier):
        g.session(f"e{k}").sync(episode(k))
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    for i in range(n):
        msgs += [call(f"x{i}", ["lookup", "search", "audit"][i % 3], ref=f"REF_{i}"),
                 result(f"x{i}", {"id": f"ID_{i}", "rows": [{"k": f"K_{i}_{j}", "v": j * 1.5} for j in range(width)]})]
    s = g.session("now")
    s.sync(msgs)
    pol = ContextRenderPlus(embedder=EMB, id_forms=True, learned_prior=1.0 if learned else 0.0,
                            learned_id_value=learned, id_value=fixed, packing=packing)
    r = pol.render(s, budget)
    assert r.tokens <= budget and _recount(s, r) == r.tokens
    assert r.visible <= {x.seq for x in s.results}


def test_every_switch_off_is_still_contextrender():
    msgs = [{"role": "user", "content": "go"}, *episode(1)[1:7]]
    s = ContextGraph().session("s")
    s.sync(msgs)
    off = ContextRenderPlus(embedder=EMB, packing=False, stubs=False, tabular=False, lexical=0.0,
                            compact_omitted=False, id_forms=False, learned_prior=0.0)
    for budget in (30, 60, 120):
        assert off.render(s, budget).messages == ContextRender(embedder=EMB).render(s, budget).messages
