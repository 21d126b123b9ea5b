"""Later-Used Result Recall (docs/method.md §7), computed by hand on small transcripts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contextrender.experiments.evaluation.recall import (
    AGE_BINS,
    Event,
    RecallStats,
    age_bin,
    count_events,
    eligible,
    recall,
    reuse_events,
)
from contextrender.experiments.evaluation.traces import read_traces

DATA = Path(__file__).resolve().parents[1] / "data"


def call(cid: str, name: str, args: dict | str) -> dict:
    raw = args if isinstance(args, str) else json.dumps(args)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": raw}}


def asst(content: str | None, *calls: dict) -> dict:
    m: dict = {"role": "assistant", "content": content}
    if calls:
        m["tool_calls"] = list(calls)
    return m


def tool(cid: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": cid, "content": content}


# seq: 0 system, 1 user, 2 asst j=0, 3 tool (k=0), 4 asst j=1, 5 tool (k=1), 6 asst j=2, 7 tool (k=2), 8 asst j=3
HAND = [
    {"role": "system", "content": "Agent. Header name: API_KEY_HEADER."},
    {"role": "user", "content": "Pay roommate Kathryn_Lee for invoice INV_2024."},
    asst("Plan: draft DRAFT_PLAN_X first.", call("c1", "search_contacts", {"relationship": "roommate"})),
    tool("c1", json.dumps({"contacts": [{"name": "Kathryn_Lee", "email": "troy_solo@gmail.com"},
                                        {"name": "Stephanie", "note": "Nancy_Boyd"}],
                           "refs": ["INV_2024", "API_KEY_HEADER", "DRAFT_PLAN_X", "Ab_12", "lowercase_only"],
                           "apis": ["show_payment_card"]})),
    asst("Troy first: troy_solo, troy_solo again.", call("c2", "get_profile", {"email": "troy_solo@gmail.com",
                                                                              "who": "Kathryn_Lee"})),
    tool("c2", json.dumps({"profile_id": "PROF_77", "card": "CARD_9911", "also": "Nancy_Boyd"})),
    asst(None, call("c3", "show_payment_card", {"profile_id": "PROF_77"})),
    tool("c3", "ok"),
    asst("Done: INV_2024 DRAFT_PLAN_X API_KEY_HEADER Stephanie Nancy_Boyd CARD_9911 Ab_12"),
]


def test_events_by_hand():
    ev = reuse_events(HAND)
    assert ev == [
        Event(1, 3, 1),  # troy_solo (content and arguments: one event)
        Event(2, 3, 2),  # show_payment_card: a tool call's function name counts
        Event(2, 5, 1),  # profile_id and PROF_77 from result 5: one distinct (j, r) pair
        Event(3, 3, 3),  # Stephanie (Titlecase allowed here) and Nancy_Boyd (first in 3, not 5)
        Event(3, 5, 2),  # CARD_9911
    ]


def test_first_appearance_outside_a_result_is_not_linked():
    ev = reuse_events(HAND)
    linked = {(e.j, e.result_seq) for e in ev}
    # INV_2024 (task input), API_KEY_HEADER (system prompt), DRAFT_PLAN_X (an earlier assistant
    # message) and Kathryn_Lee (user) all appear in result 3 too, yet are linked to nothing: if they
    # were, turn 1 ("who": "Kathryn_Lee") would already link result 3, which it does through troy_solo only.
    only_those = [
        {"role": "user", "content": "invoice INV_2024"},
        asst("draft DRAFT_PLAN_X", call("c1", "lookup", {})),
        tool("c1", "INV_2024 DRAFT_PLAN_X"),
        asst("INV_2024 DRAFT_PLAN_X"),
    ]
    assert reuse_events(only_those) == []
    assert (3, 3) in linked  # via Stephanie / Nancy_Boyd, not via the excluded tokens


def test_token_in_call_arguments_before_its_result_is_not_linked():
    msgs = [
        {"role": "user", "content": "go"},
        asst(None, call("c1", "fetch", {"id": "ORDER_555"})),
        tool("c1", "ORDER_555 shipped with TRACK_ABC"),
        asst("ORDER_555 TRACK_ABC"),
    ]
    assert reuse_events(msgs) == [Event(1, 2, 1)]  # TRACK_ABC only


def test_token_eligibility():
    assert eligible("Stephanie") and eligible("ab_cde") and eligible("ABCDEF") and eligible("x1Y234")
    assert not eligible("Ab_12")  # 5 chars
    assert not eligible("lowercase")  # no uppercase or underscore
    assert not eligible("12345678")


def test_raw_arguments_are_matched_as_emitted():
    # The raw JSON string: keys count, escapes are not decoded ("\\nSUPER_ID" reads nSUPER_ID).
    msgs = [
        {"role": "user", "content": "go"},
        asst(None, call("c1", "read", {})),
        tool("c1", json.dumps({"access_token": "t", "x": "SUPER_ID KEEP_ME"})),
        asst(None, call("c2", "run", '{"access_token": "t", "code": "a\\nSUPER_ID"}')),
        asst(None, call("c3", "run", '{"code": "KEEP_ME"}')),
    ]
    assert reuse_events(msgs) == [Event(1, 2, 1), Event(2, 2, 2)]


def test_first_result_wins_and_pairs_are_distinct():
    msgs = [
        {"role": "user", "content": "go"},
        asst(None, call("a", "f", {}), call("b", "f", {})),  # parallel calls: both results from invocation 0
        tool("b", "SHARED_VAL ONLY_B"),
        tool("a", "SHARED_VAL ONLY_A"),
        asst("SHARED_VAL SHARED_VAL ONLY_A ONLY_B", call("c", "f", {"v": "SHARED_VAL"})),
    ]
    assert reuse_events(msgs) == [Event(1, 2, 1), Event(1, 3, 1)]


def _long_trace(use_at: list[int]) -> list[dict]:
    """Result at seq 2 (invocation 0) holds TOKEN_A; assistant turn j mentions it for j in use_at."""
    msgs: list[dict] = [{"role": "user", "content": "go"}, asst(None, call("c0", "f", {})), tool("c0", "TOKEN_A")]
    for j in range(1, max(use_at) + 1):
        msgs.append(asst("TOKEN_A" if j in use_at else "thinking", call(f"c{j}", "f", {})))
        msgs.append(tool(f"c{j}", "nothing here"))
    return msgs


def test_ages_and_bins():
    ages = [1, 3, 4, 10, 11, 25, 26, 40]
    ev = reuse_events(_long_trace(ages))
    assert [(e.j, e.result_seq, e.age) for e in ev] == [(a, 2, a) for a in ages]
    assert [age_bin(a) for a in ages] == ["le3", "le3", "4_10", "4_10", "11_25", "11_25", "gt25", "gt25"]
    stats = count_events(ev)
    assert stats.events == 8 and dict(stats.events_by_age) == dict.fromkeys(AGE_BINS, 2)


def test_recall_with_reselection_after_omission():
    ev = reuse_events(_long_trace([1, 2, 5, 12, 30]))
    # Visible at 1, omitted at 2, selected again at 5 and 30, omitted at 12.
    visible = {1: {2}, 2: set(), 5: {2}, 12: {4}, 30: {2, 4}}
    s = recall(ev, visible)
    assert (s.events, s.hits) == (5, 3)
    assert s.pct == pytest.approx(60.0)
    assert s.pct_by_age == {"le3": 50.0, "4_10": 100.0, "11_25": 0.0, "gt25": 100.0}


def test_compacted_result_is_not_visible():
    # A policy that shows result 2 only in compacted form leaves it out of V_j (docs/method.md §7),
    # even though the compacted text may carry the token.
    ev = reuse_events(_long_trace([1]))
    assert recall(ev, {1: frozenset()}).pct == 0.0
    assert recall(ev, {1: frozenset({2})}).pct == 100.0


def test_empty_bins_are_none_and_no_events_is_none():
    s = recall([Event(1, 2, 1)], {1: {2}})
    assert s.pct_by_age == {"le3": 100.0, "4_10": None, "11_25": None, "gt25": None}
    empty = recall([], {})
    assert empty.pct is None and all(v is None for v in empty.pct_by_age.values())


def test_missing_render_is_an_error():
    with pytest.raises(KeyError, match="turn 3"):
        recall([Event(3, 2, 3)], {1: set()})


def test_stats_pool_as_micro_average():
    a = recall([Event(1, 2, 1)], {1: {2}})
    b = recall([Event(1, 2, 1), Event(2, 2, 12), Event(3, 2, 30)], {1: set(), 2: {2}, 3: set()})
    pooled = a + b
    assert (pooled.events, pooled.hits) == (4, 2)
    assert pooled.pct == 50.0 and pooled.pct_by_age["le3"] == 50.0
    assert RecallStats() + a == a


def test_orphan_result_is_rejected():
    with pytest.raises(ValueError, match="call id 'nope'"):
        reuse_events([{"role": "user", "content": "x"}, asst("y"), tool("nope", "z")])


def test_unseen_agent_style():
    """Parallel calls answered out of order, content-part lists, no system prompt, a second user turn."""
    (ep,) = read_traces(DATA / "parallel_agent_traces.jsonl")
    assert reuse_events(list(ep.messages)) == [
        Event(1, 3, 1),  # LIS_PORTELA_02 (the Lisbon result, second of the parallel pair)
        Event(2, 5, 1),  # hotel_id / HTL_LIS_0107, in a compact raw argument string
        Event(3, 2, 3),  # OSL_GARDERMOEN_01 from a content-parts tool message
        Event(3, 3, 3),
        Event(3, 5, 2),  # Alfama, a Titlecase word
        Event(3, 9, 1),  # BK_55X_LIS
    ]


def test_react_fixture_has_events_in_several_bins():
    eps = list(read_traces(DATA / "react_traces.jsonl"))
    stats = sum((count_events(reuse_events(list(e.messages))) for e in eps), RecallStats())
    assert stats.events == 21
    assert stats.events_by_age["le3"] > 0 and stats.events_by_age["4_10"] > 0
