"""Call readiness (contextrender/readiness.py; docs/method.md, "Call readiness") pinned on hand-made transcripts.

Each case is a transcript small enough to read: what a call needs is decided by where its argument values
occurred before it (only in tool results, or also elsewhere), and whether it is ready by what a render shows.
"""

from __future__ import annotations

import json

import pytest

from contextrender import ContextGraph, HashingEmbedder
from contextrender.readiness import (
    NeedIndex,
    ReadinessStats,
    ReadinessTracker,
    RenderedText,
    checked_values,
    transcript_needs,
)
from contextrender.registry import build_policy, method_config
from contextrender.tabular import tabulate


def call(cid: str, name: str, **args: object) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def result(cid: str, content: object) -> dict:
    return {"role": "tool", "tool_call_id": cid, "content": content if isinstance(content, str) else json.dumps(content)}


SHOP = [
    {"role": "system", "content": "You are a shop assistant."},
    {"role": "user", "content": "Exchange the keyboard of order #W2378156 for one with clicky switches."},
    call("c1", "get_order_details", order_id="#W2378156"),
    result("c1", {"order_id": "#W2378156", "items": [{"item_id": "1151293680", "price": 272.33}],
                  "payment": "credit_card_9513926"}),
    call("c2", "get_product_details", product_id="1656367028"),
    result("c2", {"variants": {"7706410293": {"item_id": "7706410293", "switch": "clicky", "price": 269.16}}}),
    call("c3", "exchange_items", order_id="#W2378156", item_ids=["1151293680"], new_item_ids=["7706410293"],
         payment_method_id="credit_card_9513926"),
]


def needs_of_last(messages: list[dict]) -> list[tuple[str, int, int]]:
    j, calls = max(transcript_needs(messages).items())
    return [(n.value, n.source, n.age) for c in calls for n in c.needs]


def test_digit_only_ids_are_needed_and_a_value_the_user_gave_is_not():
    # "#W2378156" is in the user's message: the agent has it whatever the render hides. Recall would count
    # none of the two digit-only item ids; readiness needs both.
    assert needs_of_last(SHOP) == [("1151293680", 3, 2), ("7706410293", 5, 1), ("credit_card_9513926", 3, 2)]
    # the product id was never in a tool result before the call that uses it (it came from nowhere the
    # transcript shows), so that call needs nothing
    assert transcript_needs(SHOP)[1][0].needs == ()


def test_a_value_first_seen_in_a_user_or_assistant_message_is_never_needed():
    said = [*SHOP[:6], {"role": "assistant", "content": "Variant 7706410293 is clicky; shall I swap it?"},
            {"role": "user", "content": "yes"}, SHOP[6]]
    assert [v for v, _, _ in needs_of_last(said)] == ["1151293680", "credit_card_9513926"]


def test_numbers_compare_by_value_as_the_oracle_does():
    msgs = [{"role": "user", "content": "Move my savings."},
            call("c1", "get_balance"), result("c1", "Your balance is $5,000.00 and your limit 2120.0"),
            call("c2", "transfer", amount=5000, limit=120, ref="5000")]
    needs = needs_of_last(msgs)
    # 5000 (a number) occurs by value as "$5,000.00"; 120 is written with 3 characters, so it is never needed
    # (and "2120.0" does not show it); the STRING "5000" is a string: "$5,000.00" does not hold it
    assert needs == [("5000", 2, 1)]
    assert RenderedText(["paid 5000 USD"]).shows(transcript_needs(msgs)[1][0].needs[0])
    assert not RenderedText(["paid 5000.5 USD"]).shows(transcript_needs(msgs)[1][0].needs[0])
    said = [msgs[0], msgs[1], msgs[2], {"role": "assistant", "content": "That is 5,000 dollars."},
            {"role": "user", "content": "ok"}, msgs[3]]
    assert needs_of_last(said) == []  # the agent wrote it down: no longer only in a tool result


def test_whole_tokens_only():
    msgs = [{"role": "user", "content": "Mail my roommate."},
            call("c1", "contacts"), result("c1", "roommate_12 and troy_solo@gmail.com"),
            call("c2", "mail", to="roommate_1", cc="troy_solo@gmail.com", domain="gmail.com")]
    # roommate_1 is not in roommate_12; an e-mail address and its domain are whole tokens of the result
    assert [v for v, _, _ in needs_of_last(msgs)] == ["troy_solo@gmail.com", "gmail.com"]


def test_which_values_a_call_can_need():
    args = json.dumps({"a": "abc", "b": "abcd", "c": 123, "d": 1234, "e": 12.5, "f": True, "g": None,
                       "h": ["wxyz", {"i": "----"}], "j": "abcd"})
    assert checked_values(args) == ["abcd", 1234, 12.5, "wxyz"]
    assert checked_values("not json") == [] and checked_values("") == []


@pytest.mark.parametrize("form", ["summary", "tabular", "full", "hidden"])
def test_a_value_kept_only_in_a_summary_or_tabular_form_makes_the_call_ready(form):
    product = SHOP[5]["content"]
    shown = {"summary": "[Summary] The clicky variant is item 7706410293 at $269.16.",
             "tabular": tabulate(product), "full": product, "hidden": "[omitted]"}[form]
    assert form != "tabular" or shown != product
    render = [*SHOP[:5], {"role": "tool", "tool_call_id": "c2", "content": shown}]
    [c] = transcript_needs(SHOP)[2]
    missing = RenderedText.of(render).missing(c)
    # the order result (item 1151293680, the card) is shown in full in every render here
    assert missing == (() if form != "hidden" else ("7706410293",))


def test_tracker_counts_calls_traces_and_ages():
    t = ReadinessTracker()
    render_all = SHOP[:6]
    for j, idx in enumerate(i for i, m in enumerate(SHOP) if m["role"] == "assistant"):
        rendered = render_all if j < 2 else [*SHOP[:3], {"role": "tool", "tool_call_id": "c1", "content": "[omitted]"},
                                             *SHOP[4:6]]
        t.on_turn(SHOP[:idx], rendered, SHOP[idx])
    s = t.stats
    assert (s.calls, s.needing, s.ready, s.traces, s.ready_traces, s.needing_traces) == (3, 1, 0, 1, 0, 1)
    assert s.needing_by_age == {"le3": 1, "4_10": 0, "11_25": 0, "gt25": 0}
    assert s.summary()["call_readiness"] == 0.0 and s.summary()["trace_readiness"] == 0.0
    pooled = s + ReadinessTracker().stats  # an episode without calls is a ready trace
    assert (pooled.traces, pooled.ready_traces, pooled.trace_pct) == (2, 1, 50.0)
    assert ReadinessStats.from_dict(pooled.to_dict()) == pooled


def test_need_index_is_incremental():
    index = NeedIndex()
    for m in SHOP[:6]:
        index.add(m)
    [c] = index.needs(SHOP[6])
    assert [n.value for n in c.needs] == ["1151293680", "7706410293", "credit_card_9513926"]
    with pytest.raises(ValueError, match="shrank"):
        t = ReadinessTracker()
        t.on_turn(SHOP[:6], [], SHOP[6])
        t.on_turn(SHOP[:4], [], SHOP[4])


def test_contextrender_plus_keeps_the_ids_the_next_call_needs_where_the_paper_method_does_not():
    """A budget where the newest product catalogue cannot be shown whole beside the order: the paper's
    selector keeps the order (reused already) and drops the catalogue; the plus keeps its ids."""
    variants = {str(7706410293 + i): {"item_id": str(7706410293 + i), "switch": ["clicky", "linear", "tactile"][i % 3],
                                      "colour": "black", "backlight": "RGB", "price": 200 + i}
                for i in range(24)}
    msgs = [*SHOP[:3], SHOP[3], call("c2", "get_product_details", product_id="1656367028"),
            result("c2", {"name": "Mechanical Keyboard", "variants": variants}),
            call("c3", "exchange_items", order_id="#W2378156", item_ids=["1151293680"],
                 new_item_ids=[str(7706410293 + 21)], payment_method_id="credit_card_9513926")]
    emb = HashingEmbedder(dim=64)
    ready = {}
    for name in ("contextrender", "contextrender_plus"):
        session = ContextGraph().session("s")
        session.sync(msgs[:-1])
        out = build_policy(method_config(name), embedder=emb).render(session, 400)
        assert out.tokens <= 400
        [c] = transcript_needs(msgs)[2]
        ready[name] = RenderedText.of(out.messages).missing(c)
    assert ready["contextrender"] and not ready["contextrender_plus"]
