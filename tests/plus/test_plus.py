"""contextrender_plus (NOT the paper's method): budget, switches, stubs, config."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from _code_agent import search_call
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextrender import ContextGraph, HashingEmbedder
from contextrender.cache_aware import CacheAware
from contextrender.compaction import ExtractiveCompactor
from contextrender.plus import ContextRenderPlus, call_words
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
       compact=st.booleans(), prior=st.sampled_from([0.0, 1.0, 8.0]), known=st.booleans(),
       session_prior=st.sampled_from([0.0, 2.0]), min_age=st.integers(0, 3))
def test_never_above_budget(sizes, reuse, follow_up, budget, packing, stubs, lexical, compact, prior, known,
                            session_prior, min_age):
    session = _session(_transcript(sizes, reuse, follow_up))
    pol = ContextRenderPlus(embedder=EMB, packing=packing, stubs=stubs, lexical=lexical,
                            tool_prior={"get": 0.7} if known else {}, prior_weight=prior, prior_default=0.1,
                            session_prior=session_prior, prior_min_age=min_age,
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
    a = ContextRenderPlus(embedder=EMB, packing=False, stubs=False, tabular=False, lexical=0.0, prior_weight=0.0,
                          session_prior=0.0, prior_min_age=2, tool_prior={"get": 0.9}, compact_omitted=False, compactor=ExtractiveCompactor(),
                          lam=0.2, gamma=0.5)
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


def _catalogue_transcript(n_products: int) -> list[dict[str, Any]]:
    """A user record, then product catalogues (JSON, 12 variants each): the shape of τ²-retail's results."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"},
                                  {"role": "user", "content": "Exchange my keyboard for a tactile one."}]
    results = [json.dumps({"user_id": "yusuf_rossi_9620", "orders": ["#W2378156"]})]
    for p in range(n_products):
        results.append(json.dumps({"name": f"Product {p}", "product_id": str(1656367028 + p), "variants": {
            str(9690244451 + 100 * p + k): {"item_id": str(9690244451 + 100 * p + k),
                                            "options": {"switch type": "tactile", "size": f"{60 + k}%"},
                                            "available": True, "price": 200.5 + k} for k in range(12)}}))
    for i, content in enumerate(results):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "get", "arguments": json.dumps({"i": i})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": content})
    return msgs


def test_an_omitted_json_result_keeps_its_tabular_form():
    """Two catalogues that cannot both be shown whole: the omitted one keeps every item id in its tabular
    form (lossless), which is not a visible result, and the full results are the same as without it."""
    from contextrender.tabular import tabulate, untabulate

    msgs = _catalogue_transcript(2)
    session = _session(msgs, "t")
    one = session.counter.text(msgs[5]["content"])
    budget = one + session.counter.text(tabulate(msgs[5]["content"]) or "") + 120
    kw = {"embedder": EMB, "stubs": False, "lexical": 0.0, "compact_omitted": False}
    on = ContextRenderPlus(tabular=True, **kw).render(session, budget)
    off = ContextRenderPlus(tabular=False, **kw).render(_session(msgs, "t_off"), budget)
    assert on.visible == off.visible and len(on.visible) < 3
    tab = [m for m in on.messages if m["role"] == "tool" and m["content"] == tabulate(
        next(x["content"] for x in msgs if x.get("tool_call_id") == m["tool_call_id"]))]
    assert len(tab) == 1
    seq = next(s for s in (x.seq for x in session.results) if session.result(s).call_id == tab[0]["tool_call_id"])
    assert seq not in on.visible
    assert untabulate(tab[0]["content"]) == json.loads(session.message(seq).content)
    assert on.tokens <= budget and _recount(session, on) == on.tokens
    assert all("9690244" not in m["content"] or m["content"] == session.message(
        next(s for s in off.visible if session.result(s).call_id == m["tool_call_id"])).content
        for m in off.messages if m["role"] == "tool")  # without the switch the hidden ids are gone


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 4), budget=st.integers(20, 3000), tabular=st.booleans(), stubs=st.booleans())
def test_tabular_forms_never_exceed_the_budget(n, budget, tabular, stubs):
    session = _session(_catalogue_transcript(n), f"p{n}-{budget}")
    r = ContextRenderPlus(embedder=EMB, tabular=tabular, stubs=stubs).render(session, budget)
    assert r.tokens <= budget and _recount(session, r) == r.tokens


def test_config_instantiates():
    aware = build_policy(method_config("contextrender_plus"), embedder=EMB)
    # docs/method.md §15: the plus renders cache-aware by default, around the selector its config describes
    assert isinstance(aware, CacheAware) and aware.name == "contextrender_plus" and aware.profile == "anthropic"
    p = aware.inner
    assert isinstance(p, ContextRenderPlus) and p.name == "contextrender_plus"
    assert p.embedder is EMB  # runtime embedder injected (never the default local model)
    assert p.packing and p.id_forms and not p.learned_id_value and p.id_value == 0.4 and p.tabular_cap and p.learned_prior > 0
    assert p.lexical == 0.0
    assert p.params.lam == 0.3 and p.params.gamma == 0.2  # the paper's constants: nothing fitted
    q = build_policy(method_config("contextrender_plus", {"packing": False, "id_forms": False, "lexical": 1.0,
                                                          "cache_aware": False}), embedder=EMB)
    assert not q.packing and not q.id_forms and q.lexical == 1.0
    f = build_policy(method_config("contextrender_plus_fitted"), embedder=EMB)
    assert f.name == "contextrender_plus_fitted" and f.tool_prior and f.prior_weight > 0 and not f.id_forms
    r = build_policy(method_config("contextrender_plus_fitted", {"prior_weight": 0.0}), embedder=EMB)
    assert r.prior_weight == 0.0 and r.tool_prior  # the prior stays configured, switched off


def test_the_default_config_names_no_tool():
    """What an agent builder gets by default learns from their own graph file: no table of our benchmarks'
    tools, task ids or prompts (the fitted profile is a separate, optional config)."""
    from omegaconf import OmegaConf

    from contextrender.registry import CONF_DIR

    cfg = OmegaConf.to_container(method_config("contextrender_plus"))
    assert not cfg.get("tool_prior") and not cfg.get("call_prior") and cfg["prior_weight"] == 0.0  # type: ignore[union-attr, index]
    text = (CONF_DIR / "method" / "contextrender_plus.yaml").read_text()
    fitted = OmegaConf.to_container(method_config("contextrender_plus_fitted"))
    names = set(fitted["tool_prior"]) | set(fitted["call_prior"])  # type: ignore[index, arg-type]
    assert len(names) > 50 and not [n for n in names if re.search(rf"\b{re.escape(n)}\b", text)]


def _two_tools() -> list[dict[str, Any]]:
    """An old small ``get_order`` result, then two recent large ``get_catalog`` results."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Help me."}]
    for i, (tool, body) in enumerate([("get_order", "order ORD_A1 item ITEM_B2 status pending"),
                                      ("get_catalog", " ".join(f"PROD_{k} lorem ipsum" for k in range(60))),
                                      ("get_catalog", " ".join(f"PROD_{k + 100} dolor sit" for k in range(60)))]):
        cid = f"k{i}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": tool, "arguments": json.dumps({"i": i})}}]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": body})
    return msgs


def test_tool_prior_prefers_tools_reused_in_training():
    """Room for the newest catalogue or the old order, not both: recency alone shows the catalogue; a prior
    fitted on training episodes (orders are reused, catalogues are not) shows the order instead."""
    msgs = _two_tools()
    session = _session(msgs, "n")
    full = ContextRender(embedder=EMB).render(session, 10 ** 6).tokens
    seqs = [3, 5, 7]  # the three results
    base = full - sum(session.ntok(q) - session.result(q).marker_ntok for q in seqs)
    saved = {q: session.ntok(q) - session.result(q).marker_ntok for q in seqs}
    budget = base + saved[7] + 1  # the newest catalogue alone fits; it and the order together do not
    assert saved[3] + saved[7] > budget - base
    kw = {"embedder": EMB, "packing": False, "stubs": False, "lexical": 0.0, "compact_omitted": False}
    prior = {"get_order": 0.6, "get_catalog": 0.0}
    off = ContextRenderPlus(tool_prior=prior, prior_weight=0.0, **kw).render(_session(msgs, "a"), budget)
    on = ContextRenderPlus(tool_prior=prior, prior_weight=4.0, **kw).render(_session(msgs, "b"), budget)
    assert off.visible == {7}  # without the prior the newest catalogue wins
    assert 3 in on.visible and 7 not in on.visible
    assert on.tokens <= budget and off.tokens <= budget


def test_unknown_tool_gets_the_default_prior():
    pol = ContextRenderPlus(embedder=EMB, tool_prior={"get_order": 0.6}, prior_weight=1.0, prior_default=0.05)
    assert pol.prior_of("get_order") == 0.6 and pol.prior_of("never_seen") == 0.05


def test_fitted_prior_is_read_from_config_not_from_data(monkeypatch):
    """The fitted prior comes from conf/method/contextrender_plus_fitted.yaml; rendering never fits or reads traces."""
    from omegaconf import OmegaConf

    from contextrender.experiments.studies import plus_fitted_data, plus_fitted_fit

    cfg = method_config("contextrender_plus_fitted")
    want = {str(k): float(v) for k, v in OmegaConf.to_container(cfg.tool_prior).items()}
    assert want and cfg.prior_weight > 0
    p = build_policy(cfg, embedder=EMB)
    assert p.tool_prior == want and p.prior_weight == cfg.prior_weight and p.prior_default == cfg.prior_default

    def boom(*a, **k):
        raise AssertionError("the prior must not be fitted at render time")

    monkeypatch.setattr(plus_fitted_fit, "fit_tool_prior", boom)
    monkeypatch.setattr(plus_fitted_data, "read_traces", boom)
    msgs = _two_tools()
    r = p.render(_session(msgs, "cfg"), 200)
    assert r.tokens <= 200
    assert p.tool_prior == want  # unchanged by what it rendered


def test_session_prior_learns_an_unseen_domain_from_this_session():
    """No fitted prior for any tool: with W_sess, a tool whose results this session already reused
    (get_order: its result's ORD_A1 is the next call's argument) scores above one never reused."""
    msgs = _two_tools()
    msgs[4]["tool_calls"][0]["function"]["arguments"] = json.dumps({"order": "ORD_A1"})  # reuses result 3
    kw = {"embedder": EMB, "packing": False, "stubs": False, "lexical": 0.0, "compact_omitted": False,
          "tool_prior": {}, "prior_default": 0.05}
    budget = ContextRender(embedder=EMB).render(_session(msgs, "full"), 10 ** 6).tokens - 20  # must choose

    def util(pol):
        sel = pol.select(_session(msgs, f"u{id(pol)}"), budget)
        return {sc.seq: sc.usefulness for sc in sel.scores}

    off = util(ContextRenderPlus(session_prior=0.0, **kw))
    on = util(ContextRenderPlus(session_prior=2.0, **kw))
    assert on[3] - off[3] == pytest.approx(2.0 * (1 + 2 * 0.05) / (1 + 2))  # 1 of 1 get_order results reused
    assert on[5] - off[5] == pytest.approx(2.0 * (0 + 2 * 0.05) / (2 + 2))  # 0 of 2 get_catalog results
    # a tool the fitted prior knows keeps its fitted value, never the session's
    known = util(ContextRenderPlus(session_prior=2.0, prior_weight=1.0,
                                   **{**kw, "tool_prior": {"get_order": 0.5}}))
    assert known[3] - off[3] == pytest.approx(0.5)


def test_prior_min_age_keeps_the_latest_results_on_top():
    """The prior reorders only older results: with prior_min_age=2 the latest result (age 1, a tool the
    prior says is never reused) gets the largest prior term of the render instead of none."""
    msgs = _two_tools()
    kw = {"embedder": EMB, "packing": False, "stubs": False, "lexical": 0.0, "compact_omitted": False,
          "tool_prior": {"get_order": 0.6, "get_catalog": 0.0}, "prior_weight": 4.0}
    budget = ContextRender(embedder=EMB).render(_session(msgs, "full"), 10 ** 6).tokens - 20

    def util(pol, sid):
        return {sc.seq: sc for sc in pol.select(_session(msgs, sid), budget).scores}

    base = util(ContextRenderPlus(**{**kw, "prior_weight": 0.0}), "b")
    every = util(ContextRenderPlus(prior_min_age=0, **kw), "e")
    recent = util(ContextRenderPlus(prior_min_age=2, **kw), "r")
    assert every[7].age == 1 and every[5].age == 2
    assert every[7].usefulness == pytest.approx(base[7].usefulness)  # the catalogue's prior is 0
    assert recent[7].usefulness == pytest.approx(base[7].usefulness + 4.0 * 0.6)  # the render's largest term
    assert recent[5].usefulness == pytest.approx(base[5].usefulness)  # age 2: the prior applies (0)
    assert recent[3].usefulness == pytest.approx(every[3].usefulness)


def test_per_result_caches_are_bounded_and_never_change_a_render(monkeypatch):
    import contextrender.plus as plus_mod

    monkeypatch.setattr(plus_mod, "CACHE_SIZE", 3)
    msgs = _catalogue_transcript(3)
    budget = 900
    pol = ContextRenderPlus(embedder=EMB)
    renders = [pol.render(_session(msgs, f"s{i}"), budget) for i in range(4)]
    assert len(pol._tables) == 3 and len(pol._values) <= 3  # filled to the bound, not past it
    fresh = ContextRenderPlus(embedder=EMB).render(_session(msgs, "fresh"), budget)
    assert all(r.messages == fresh.messages and r.tokens == fresh.tokens for r in renders)


def test_a_deeply_nested_result_renders_with_tabular_on():
    msgs = _catalogue_transcript(1)
    msgs[3]["content"] = "[" * 600 + "1" + "]" * 600  # the first result: deeper than any tabular form
    for tabular in (True, False):
        session = _session(msgs, f"deep{tabular}")
        r = ContextRenderPlus(embedder=EMB, tabular=tabular).render(session, 700)
        assert r.tokens <= 700


def _questions(asks: list[str]) -> list[dict[str, Any]]:
    """A code agent's searches: one tool runs them all; each result is about the same size."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "sys"},
                                  {"role": "user", "content": "Answer the questions."}]
    for i, ask in enumerate(asks):
        cid = f"q{i}"
        msgs.append(search_call(cid, f"Entity{i} {ask}"))
        msgs.append({"role": "tool", "tool_call_id": cid,
                     "content": f"Entity{i} Person_{i}A " + " ".join(["lorem ipsum dolor"] * 40)})
    return msgs


def test_call_words_are_the_letters_of_keys_and_values():
    words = call_words(json.dumps({"code": "print(wikipedia_search(query='Mount Hiapeith height', n_results=3))"}))
    assert {"code", "print", "wikipedia", "search", "query", "mount", "hiapeith", "height", "results"} == words
    assert call_words("not json: Founder of X2") == {"not", "json", "founder"}  # raw text when not JSON


def test_call_prior_with_one_word_is_that_words_probability():
    """Naive Bayes on the log-odds: one fitted word replaces P(tool) by P(tool, word); two multiply odds."""
    pol = ContextRenderPlus(embedder=EMB, tool_prior={"t": 0.2}, prior_default=0.05,
                            call_prior={"t": {"height": 0.01, "founder": 0.8, "first": 0.6}})
    assert pol.prior_of("t") == pytest.approx(0.2)
    assert pol.prior_of("t", frozenset({"height", "unfitted"})) == pytest.approx(0.01)
    odds = (0.8 / 0.2) * (0.6 / 0.4) / (0.2 / 0.8)  # odds(t) · OR(founder) · OR(first)
    assert pol.prior_of("t", frozenset({"founder", "first"})) == pytest.approx(odds / (1 + odds))
    assert pol.prior_of("other", frozenset({"founder"})) == pytest.approx(0.05)  # words only for fitted tools
    off = ContextRenderPlus(embedder=EMB, tool_prior={"t": 0.2}, use_call_prior=False,
                            call_prior={"t": {"founder": 0.8}})
    assert off.prior_of("t", frozenset({"founder"})) == pytest.approx(0.2)
    with pytest.raises(ValueError, match=r"call_prior\['t'\]"):
        ContextRenderPlus(embedder=EMB, call_prior={"t": {"x": 1.5}})
    with pytest.raises(ValueError, match="tool_prior"):
        ContextRenderPlus(embedder=EMB, tool_prior={"t": 1.2})
    with pytest.raises(ValueError, match="prior_default"):
        ContextRenderPlus(embedder=EMB, prior_default=-0.1)


def test_call_prior_stays_a_probability_under_any_legal_values():
    """P(tool) 1 and sixty words at P 0: the log-odds sum is far below any float exp() takes; P stays in
    [0, 1] (an override could set these, so a render must never raise). A tool the words leave alone keeps
    its P exactly, even 0."""
    words = {f"w{chr(97 + i // 26)}{chr(97 + i % 26)}x": 0.0 for i in range(60)}
    pol = ContextRenderPlus(embedder=EMB, tool_prior={"t": 1.0, "z": 0.0}, call_prior={"t": words, "z": {"aaa": 0.5}})
    p = pol.prior_of("t", frozenset(words))
    assert 0.0 <= p <= 1e-6
    assert pol.prior_of("t", frozenset({"unfitted"})) == 1.0 and pol.prior_of("z", frozenset({"bbb"})) == 0.0
    high = ContextRenderPlus(embedder=EMB, tool_prior={"t": 0.0}, call_prior={"t": {k: 1.0 for k in words}})
    assert 1.0 - 1e-6 <= high.prior_of("t", frozenset(words)) <= 1.0


def test_call_prior_cache_is_bounded(monkeypatch):
    import contextrender.plus as plus_mod

    monkeypatch.setattr(plus_mod, "CACHE_SIZE", 2)
    msgs = _questions(["founder", "height", "shipyard"])
    kw = {"embedder": EMB, "prior_weight": 8.0, "tool_prior": {"python_interpreter": 0.3},
          "call_prior": {"python_interpreter": {"founder": 0.6, "height": 0.01}}}
    pol = ContextRenderPlus(**kw)
    outs = [pol.render(_session(msgs, f"c{i}"), 400) for i in range(3)]
    assert len(pol._call_p) == 2
    fresh = ContextRenderPlus(**kw).render(_session(msgs, "cfresh"), 400)
    assert all(o.messages == fresh.messages for o in outs)


def test_call_prior_keeps_the_result_whose_question_is_answered_by_a_name():
    """Room for one of two same-size results of one tool: by recency the newest (a height) is shown; with a
    call prior fitted on training episodes (heights are never quoted, founders are), the older founder."""
    msgs = _questions(["founder", "height"])
    session = _session(msgs, "qfull")
    seqs = [3, 5]
    full = ContextRender(embedder=EMB).render(session, 10 ** 6).tokens
    saved = {q: session.ntok(q) - session.result(q).marker_ntok for q in seqs}
    budget = full - sum(saved.values()) + max(saved.values())  # either one fits, not both
    assert budget < full
    kw = {"embedder": EMB, "packing": False, "stubs": False, "tabular": False, "lexical": 0.0,
          "compact_omitted": False, "prior_weight": 8.0, "tool_prior": {"python_interpreter": 0.3}}
    calls = {"python_interpreter": {"founder": 0.6, "height": 0.01}}
    plain = ContextRenderPlus(**kw).render(_session(msgs, "qa"), budget)
    worded = ContextRenderPlus(call_prior=calls, **kw).render(_session(msgs, "qb"), budget)
    switched_off = ContextRenderPlus(call_prior=calls, use_call_prior=False, **kw).render(_session(msgs, "qc"), budget)
    assert plain.visible == {5} and switched_off.visible == {5}
    assert worded.visible == {3}
    assert worded.tokens <= budget


class _CountingCompactor(ExtractiveCompactor):
    """The extractive compactor, counting the texts it was asked to compact (each one a charged model call)."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def compact(self, text: str, max_tokens: int, *, instructions: str | None = None):
        self.texts.append(text)
        return super().compact(text, max_tokens, instructions=instructions)


def _oversized(body: str) -> tuple[list[dict[str, Any]], int]:
    """Three small results, then ``body`` as a fourth result larger than the budget returned with it."""
    msgs = _transcript([5, 5, 5], [0, 0], None)
    msgs.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": "big", "type": "function", "function": {"name": "get", "arguments": "{}"}}]})
    msgs.append({"role": "tool", "tool_call_id": "big", "content": body})
    msgs.append({"role": "assistant", "content": "done"})
    msgs.append({"role": "user", "content": "and now?"})
    return msgs, TokenCounter().text(body) // 2


def test_an_oversized_result_with_an_id_form_is_never_compacted():
    """The paper compacts every result larger than B; with id forms on, one whose id form is shorter is not
    (the id form keeps its values), so the compactor is not charged — and one without values still is."""
    ids = "\n".join(f"row {k}: acct_{7000 + k} lorem ipsum dolor sit amet" for k in range(200))
    prose = " ".join(["the quick brown fox jumps over the lazy dog"] * 200)
    for body, compacted in ((ids, False), (prose, True)):
        msgs, budget = _oversized(body)
        plus = ContextRenderPlus(embedder=EMB, id_forms=True, stubs=False, lexical=0.0, compact_omitted=False,
                                 compactor=(comp := _CountingCompactor()))
        session = _session(msgs, f"o{compacted}")
        r = plus.render(session, budget)
        assert (body in comp.texts) is compacted
        assert r.tokens <= budget and _recount(session, r) == r.tokens
        paper = ContextRender(embedder=EMB, compactor=(comp2 := _CountingCompactor()))
        paper.render(_session(msgs, f"p{compacted}"), budget)
        assert body in comp2.texts  # the paper's fallback (docs/method.md §5 step 5) is unchanged
    kept = next(m["content"] for m in r.messages if m.get("tool_call_id") == "big")
    assert kept != prose and len(kept) < len(prose)


def test_tabular_cap_keeps_a_large_tabular_form_out():
    """With tabular_cap, an omitted result's tabular form is offered only when it is at most oversized_share·B."""
    from contextrender.tabular import tabulate

    msgs = _catalogue_transcript(2)
    table = tabulate(msgs[5]["content"]) or ""
    n_table = TokenCounter().text(table)
    one = TokenCounter().text(msgs[5]["content"])
    budget = one + n_table + 120
    kw = {"embedder": EMB, "stubs": False, "lexical": 0.0, "compact_omitted": False, "tabular": True}
    for share, offered in ((0.95 * n_table / budget, False), (min(1.0, 2.0 * n_table / budget), True)):
        session = _session(msgs, f"cap{offered}")
        r = ContextRenderPlus(tabular_cap=True, oversized_share=share, **kw).render(session, budget)
        shown = [m for m in r.messages if m["role"] == "tool" and m["content"] == table]
        assert bool(shown) is offered, (share, budget, n_table)
        assert r.tokens <= budget and _recount(session, r) == r.tokens


def test_one_policy_over_graphs_that_reuse_a_session_id_renders_each_from_its_own_text():
    """A policy object outlives graphs (replay_readiness opens an in-memory graph per transcript, each with a
    session of the same id): its per-result caches must never answer for another graph's text."""
    def msgs(tag: str) -> list[dict[str, Any]]:
        rows = {"car": [{"plate": f"{tag}_{k:04d}", "km": 1000 + k} for k in range(40)]}
        out = _transcript([5, 5], [0], None)
        out.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": "z", "type": "function", "function": {"name": "get", "arguments": "{}"}}]})
        out.append({"role": "tool", "tool_call_id": "z", "content": json.dumps(rows)})
        out += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"y{k}", "type": "function", "function": {"name": "get", "arguments": "{}"}}]} for k in range(1)]
        out.append({"role": "tool", "tool_call_id": "y0", "content": " ".join(["lorem ipsum"] * 400)})
        return out
    plus = ContextRenderPlus(embedder=EMB, id_forms=True, stubs=False, lexical=0.0, compact_omitted=False)
    bodies = []
    for tag in ("alpha", "bravo"):
        session = ContextGraph().session("same-id")
        session.sync(msgs(tag))
        r = plus.render(session, 600)
        body = next(m["content"] for m in r.messages if m.get("tool_call_id") == "z")
        bodies.append(body)
        assert f"{tag}_0000" in body
    assert bodies[0] != bodies[1]
