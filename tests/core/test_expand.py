"""The expand tool (docs/method.md §16): handles, markers, narrowing, clipping, the graph's record of an expansion,
and the episode loop that answers the tool as the service would."""

from __future__ import annotations

import json
import re

import pytest

from contextrender import expand as ex
from contextrender.graph import ContextGraph
from contextrender.registry import build_policy, method_config
from contextrender.tfa import extract_values

ORDERS = json.dumps({"user_id": "noah_brown_6181", "orders": [
    {"order_id": f"#W{1000 + i}", "status": "delivered",
     "items": [{"item_id": f"IT{i:05d}", "name": "desk lamp", "price": 10.5 + i}]} for i in range(40)]})


def _session(graph, sid="s", results=(ORDERS,), filler=4):
    s = graph.session(sid)
    s.add({"role": "system", "content": "You are a helpful agent."})
    s.add({"role": "user", "content": "Return the lamp of my latest order."})
    texts = list(results) + [f"listing {k}: " + "row of plain words " * 60 for k in range(filler)]
    for k, text in enumerate(texts):
        s.add({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": f"tool_{k}", "arguments": "{}"}}]})
        s.add({"role": "tool", "tool_call_id": f"c{k}", "content": text})
    return s


def _plus(hashing_embedder, **over):
    return build_policy(method_config("contextrender_plus", {"cache_aware": False, **over}), embedder=hashing_embedder)


def test_handles_are_stable_per_session_survive_a_restart_and_differ_across_sessions(tmp_path):
    path = tmp_path / "g.sqlite"
    with ContextGraph(path) as g:
        a, b = _session(g, "a"), _session(g, "b")
        for s in (a, b):
            ex.offer(s)
        ha, hb = ex.handle(a, 3), ex.handle(b, 3)
        assert re.fullmatch(r"\d{9}", ha) and ha != hb  # same seq, another session's key
        assert ex.resolve(a, ha) == 3
        with pytest.raises(ex.ExpandError, match="no result has handle"):
            ex.resolve(a, hb)  # another session's handle is refused, never answered from that session
        with pytest.raises(ex.ExpandError, match="9 digits"):
            ex.resolve(a, "12; DROP")
    with ContextGraph(path) as g:
        again = g.session("a")
        assert ex.offered(again) and ex.handle(again, 3) == ha and ex.resolve(again, ha) == 3


def test_markers_carry_handles_only_where_the_tool_is_offered_and_only_for_methods_with_the_option(
        graph, hashing_embedder):
    s = _session(graph)
    plus, paper = _plus(hashing_embedder), build_policy(method_config("contextrender"), embedder=hashing_embedder)
    before = plus.render(s, 600)
    assert not any(ex.MARKER_HANDLE.search(str(m.get("content"))) for m in before.messages)
    ex.offer(s)
    for budget in (300, 600, 1200):
        r = plus.render(s, budget)
        assert r.tokens <= budget  # the longer markers are charged to B
        handles = {h for m in r.messages for h in ex.MARKER_HANDLE.findall(str(m.get("content")))}
        assert handles and all(ex.resolve(s, h) in {q.seq for q in s.results} for h in handles)
        assert r.sources and all(ex.resolve(s, h) not in r.visible for h in handles)  # only what is not in full
    plain = paper.render(s, 600)  # the paper's method keeps its marker: its figures and digests do not move
    assert not any(ex.MARKER_HANDLE.search(str(m.get("content"))) for m in plain.messages)
    assert any(m.get("content") == "[omitted]" for m in plain.messages)


def test_every_form_that_does_not_show_a_result_in_full_names_its_handle(graph, hashing_embedder):
    """A compaction or a stub keeps part of a result, an id form its ids, a marker nothing: where the tool is offered,
    each says which handle reads the rest back (a compacted form without it left the model no way to the values the
    compaction dropped)."""
    from contextrender.compaction import ExtractiveCompactor

    words = ["amber", "birch", "cedar", "dune", "elm", "fern", "grove", "heath", "iris", "juniper"]
    prose = [" ".join(f"The {words[i % 10]} ledger of the {words[(i + k) % 10]} office stays under review until "
                      f"the {words[(3 * i + k) % 10]} audit closes." for i in range(30)) for k in range(4)]
    s = _session(graph, results=(ORDERS, *prose), filler=2)
    ex.offer(s)
    seen: dict[str, int] = {}
    for over in ({}, {"stubs": True, "compact_omitted": False}):
        plus = build_policy(method_config("contextrender_plus", {"cache_aware": False, **over}),
                            embedder=hashing_embedder, compactor=ExtractiveCompactor())
        for budget in (500, 800, 1200, 1800):
            sel = plus.select(s, budget)
            body = {src: str(m.get("content")) for m, src in zip(sel.rendered.messages, sel.rendered.sources,
                                                                  strict=True) if src is not None}
            for seq, form in sel.forms.items():
                if form in ("full", "tabular", "not rendered"):
                    continue  # in full, or every value kept as a table
                seen[form] = seen.get(form, 0) + 1
                assert [ex.resolve(s, h) for h in ex.MARKER_HANDLE.findall(body[seq])] == [seq], (budget, form)
    assert seen.get("compacted") and seen.get("stub") and seen.get("omitted"), seen


def test_turns_the_trim_dropped_leave_a_line_naming_their_results_handles(graph, hashing_embedder):
    """When the verbatim messages alone overflow B, whole turns go, calls and results together, and leave no marker
    (docs/method.md §5). Where the tool is offered, one user-role line where they were names each dropped result's
    tool and handle, charged to B; without the tool, and for the paper's method, nothing changes."""
    s = graph.session("long")
    s.add({"role": "system", "content": "You are a helpful agent."})
    s.add({"role": "user", "content": "Check every account."})
    for k in range(30):
        s.add({"role": "assistant", "content": f"Looking up account number {k} in the ledger now, then the next.",
               "tool_calls": [{"id": f"c{k}", "type": "function",
                               "function": {"name": "get_account", "arguments": json.dumps({"n": k})}}]})
        s.add({"role": "tool", "tool_call_id": f"c{k}", "content": json.dumps({"account": f"AC{k:04d}", "ok": True})})
    plus = _plus(hashing_embedder)
    plain = plus.render(s, 500)
    assert not any(ex.DROPPED_HEAD in str(m.get("content")) for m in plain.messages)
    ex.offer(s)
    r = plus.render(s, 500)
    assert r.tokens <= 500
    [line] = [m for m in r.messages if ex.DROPPED_HEAD in str(m.get("content"))]
    assert line["role"] == "user" and "get_account" in line["content"]
    named = {ex.resolve(s, h) for h in ex.handles_in(line["content"])}
    shown = {src for src in r.sources if src is not None}
    dropped = {q.seq for q in s.results} - shown
    assert dropped and named == dropped  # every dropped result, and only those
    assert dropped <= ex.marked_results(s, r.messages)  # one expansion away
    assert r.sources[r.messages.index(line)] is None  # not a stored message
    paper = build_policy(method_config("contextrender"), embedder=hashing_embedder)
    assert not any(ex.DROPPED_HEAD in str(m.get("content")) for m in paper.render(s, 500).messages)


def test_a_narrowing_returns_only_the_matching_part(graph):
    s = _session(graph)
    tool = ex.ExpandTool(s, 4000)
    h = ex.handle(s, 3)
    text, err = tool.answer({"handle": h, "key": "orders.7.items"})
    assert not err and json.loads(text) == [{"item_id": "IT00007", "name": "desk lamp", "price": 17.5}]
    text, err = tool.answer(json.dumps({"handle": h, "match": "IT00012, #W1030"}))
    got = json.loads(text)
    assert not err and [o["order_id"] for o in got["orders"]] == ["#W1012", "#W1030"] and "user_id" not in got
    text, err = tool.answer({"handle": h, "key": "orders.99"})
    assert err and "list of 40" in text
    text, err = tool.answer({"handle": h, "key": "order"})
    assert err and "keys there: user_id, orders" in text
    text, err = tool.answer({"handle": h, "match": "nothing_like_this"})
    assert err and "matches" in text
    lines = ex.handle(s, 5)  # a text result: lines
    text, err = tool.answer({"handle": lines, "match": "listing"})
    assert not err and text.startswith("listing 0") and text.count("\n") == 0
    assert tool.answer({"handle": h, "extra": 1})[1] and tool.answer("{not json")[1]


def test_an_expansion_larger_than_its_room_is_clipped_with_a_note_saying_how_to_ask_for_less(graph):
    s = _session(graph)
    tool = ex.ExpandTool(s, 1000)  # room: half of B
    text, err = tool.answer({"handle": ex.handle(s, 3)})
    assert not err
    assert s.counter.text(text) + 4 <= 500
    assert ORDERS.startswith(text.split("\n[contextrender_expand:")[0])
    assert re.search(r"the result is \d+ tokens, cut after \d+ to fit the budget; narrow it with \"key\" "
                     r"\(top-level keys: user_id, orders\)", text)
    [got] = ex.expansions(s)
    assert got["clipped"] and got["seq"] == 3 and got["total_tokens"] > got["tokens"]


def test_an_expansion_counts_as_reuse_of_its_result_and_its_copy_is_not_a_result_of_its_own(tmp_path):
    path = tmp_path / "g.sqlite"
    with ContextGraph(path) as g:
        s = _session(g)
        assert s.reuse_score(3) == 0.0
        tool = ex.ExpandTool(s, 8000)
        s.add({"role": "assistant", "content": None, "tool_calls": [
            {"id": "x1", "type": "function", "function": {"name": ex.TOOL_NAME,
                                                          "arguments": json.dumps({"handle": ex.handle(s, 3),
                                                                                   "key": "orders.3"})}}]})
        text, _ = tool.answer({"handle": ex.handle(s, 3), "key": "orders.3"})
        s.add({"role": "tool", "tool_call_id": "x1", "content": text})
        used = extract_values(text)
        assert s.reuse_score(3) == pytest.approx(len(used))  # each value of the copy: used once, in one result
        assert s.result_values(len(s) - 1) == []  # the copy is not indexed: it would halve every credit
        again, _ = tool.answer({"handle": ex.handle(s, 3), "key": "orders.3"}, at=len(s) - 2)
        assert again == text and s.reuse_score(3) == pytest.approx(len(used))  # once per operation, as in §3
        score = s.reuse_score(3)
    with ContextGraph(path) as g:
        assert g.session("s").reuse_score(3) == score  # the same after a restart


def test_an_omitted_expansion_answer_points_back_to_the_result_it_copies(graph, hashing_embedder):
    """A loop of one's own appends the tool's answer like any tool result; when a later render omits that copy, its
    marker carries the original's handle, never one of its own: the copy is narrowed or clipped, the original holds
    all of it (else a model chases copies of copies)."""
    s = _session(graph)
    tool = ex.ExpandTool(s, 8000)
    h = ex.handle(s, 3)
    args = json.dumps({"handle": h})  # the whole result back: a copy as large as the original
    s.add({"role": "assistant", "content": None, "tool_calls": [
        {"id": "x1", "type": "function", "function": {"name": ex.TOOL_NAME, "arguments": args}}]})
    text, _ = tool.answer(args)
    s.add({"role": "tool", "tool_call_id": "x1", "content": text})
    copy = len(s) - 1
    assert ex.origin(s, copy) == 3 and ex.origin(s, 3) == 3
    assert ex.marker(s, copy) == ex.marker(s, 3) and h in ex.marker(s, copy)
    for k in range(6):  # newer results push the copy out of a small render
        s.add({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"n{k}", "type": "function", "function": {"name": "more", "arguments": "{}"}}]})
        s.add({"role": "tool", "tool_call_id": f"n{k}", "content": f"later {k}: " + "plain words here " * 60})
    rendered = _plus(hashing_embedder).render(s, 700)
    shown = [str(m.get("content")) for m in rendered.messages if m.get("tool_call_id") == "x1"]
    assert shown and "IT00039" not in shown[0]  # the copy is omitted at this budget ...
    assert set(ex.MARKER_HANDLE.findall(shown[0])) == {h}  # ... and its marker names the original
    assert {ex.resolve(s, x) for m in rendered.messages for x in ex.MARKER_HANDLE.findall(str(m.get("content")))} \
        <= {r.seq for r in s.results if r.tool_name != ex.TOOL_NAME}  # no handle names a copy
    refused = json.dumps({"handle": "000000000"})
    s.add({"role": "assistant", "content": None, "tool_calls": [
        {"id": "x2", "type": "function", "function": {"name": ex.TOOL_NAME, "arguments": refused}}]})
    s.add({"role": "tool", "tool_call_id": "x2", "content": tool.answer(refused)[0]})
    assert ex.origin(s, len(s) - 1) == len(s) - 1  # a refused call's error is a result of its own


class _Caller:
    """A model that reads an omitted result back once, then answers: what a real model does with the tool."""

    expands = True
    simulated = True

    def __init__(self):
        self.seen_tools = []

    def complete(self, messages, tools=None):
        from contextrender.events import Completion, Usage

        self.seen_tools.append([t["function"]["name"] for t in tools or []])
        last = messages[-1]
        if last.get("role") == "tool" and "IT00007" in str(last.get("content")):
            return Completion({"role": "assistant", "content": "Your lamp is IT00007."}, Usage(calls=1))
        h = next(h for m in messages for h in ex.MARKER_HANDLE.findall(str(m.get("content"))))
        call = {"id": "e1", "type": "function", "function": {"name": ex.TOOL_NAME,
                                                             "arguments": json.dumps({"handle": h,
                                                                                      "match": "IT00007"})}}
        return Completion({"role": "assistant", "content": None, "tool_calls": [call]}, Usage(calls=1))


def test_the_episode_answers_the_tool_itself_and_counts_the_round(graph, hashing_embedder):
    from contextrender.experiments.runtime.episode import Episode

    s = _session(graph)
    model = _Caller()
    episode = Episode(s, _plus(hashing_embedder), model, 400)
    n = len(s)
    message = episode.step([{"type": "function", "function": {"name": "tool_0", "parameters": {}}}])
    assert message == {"role": "assistant", "content": "Your lamp is IT00007."}
    assert model.seen_tools == [["tool_0", ex.TOOL_NAME]] * 2
    assert [m.role for m in s.messages[n:]] == ["assistant", "tool", "assistant"]  # the call and its answer are kept
    assert episode.expansions == 1 and episode.invocations == 2 and episode.take_rounds() == 1
    assert episode.take_rounds() == 0
    assert all(r.tokens <= 400 for r in episode.renders)


def test_the_oracle_reads_several_values_of_one_result_back_in_one_narrowed_call(graph, hashing_embedder):
    """The expand mode's agent: two hidden values of one omitted result are asked for at once (``match``, the rows
    holding either), one value by the member holding it (``key``), and only then the whole result."""
    from contextrender import TokenCounter
    from contextrender.experiments.runtime.oracle import OracleEpisode, Reference, ScriptedCall

    s = _session(graph)
    ex.offer(s)
    ref = Reference(turns=((ScriptedCall("return_items", {"items": ["IT00003", "IT00031"]}),),))
    episode = OracleEpisode(ref, s, TokenCounter(), name="oracle_expand", mode="expand")
    messages = _plus(hashing_embedder).render(s, 600).messages
    h = ex.handle(s, 3)
    assert any(h in str(m.get("content")) for m in messages)  # the orders result is omitted, its handle shown
    two = episode._expand({"IT00003": "IT00003", "IT00031": "IT00031"}, messages, (0, 0, False))
    assert two == {"handle": h, "match": "IT00003 IT00031"}
    text, error = ex.ExpandTool(s, 600).answer(two)
    assert not error and "IT00003" in text and "IT00031" in text and "IT00004" not in text
    one = episode._expand({"IT00007": "IT00007"}, messages, (0, 1, False))
    assert one["handle"] == h and one["key"].startswith("orders.7") and "match" not in one
    assert episode._expand({"IT00007": "IT00007"}, messages, (0, 1, False)) == {"handle": h}  # then the whole


def test_the_definition_sent_with_every_request_is_short_and_names_what_the_handler_takes():
    """The definition rides in every request the tool is offered in (billed, mostly as a cached read): each API's
    shape of it stays within 120 cl100k tokens (docs/method.md §16), and it declares exactly the arguments the
    handler accepts, handle required."""
    from contextrender.tokens import TokenCounter

    counter = TokenCounter()
    shapes = {"chat": ex.chat_tool(), "responses": ex.responses_tool(), "messages": ex.messages_tool()}
    sizes = {k: counter.text(json.dumps(v)) for k, v in shapes.items()}
    assert max(sizes.values()) <= 120, sizes
    schemas = [shapes["chat"]["function"]["parameters"], shapes["responses"]["parameters"],
               shapes["messages"]["input_schema"]]
    for schema in schemas:
        assert set(schema["properties"]) == {"handle", "key", "match"} and schema["required"] == ["handle"]
    assert shapes["messages"]["name"] == shapes["responses"]["name"] == ex.TOOL_NAME
