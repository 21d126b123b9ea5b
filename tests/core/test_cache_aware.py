"""The cache-aware render (docs/method.md §15): appended to while it fits, changed late and only where the method keeps
what it would keep, headroom from prices, nothing changed with the option off or without a cache."""

from __future__ import annotations

import json
import math

import pytest

from contextrender import ContextGraph, HashingEmbedder
from contextrender.billing import SessionBilling
from contextrender.cache_aware import CacheAware, headroom, write_premium
from contextrender.compaction import ExtractiveCompactor
from contextrender.registry import build_policy, method_config
from contextrender.tokens import TokenCounter

EMB = HashingEmbedder(dim=128)


def plus(**overrides: object) -> object:
    return build_policy(method_config("contextrender_plus", overrides), embedder=EMB, compactor=ExtractiveCompactor())


def order_session_messages(n_orders: int = 8, items: int = 6) -> list[dict]:
    """A customer-service transcript: each call looks up an order (JSON with item ids), the next call needs ids."""
    msgs: list[dict] = [{"role": "system", "content": "You are a support agent."},
                        {"role": "user", "content": "Return the lamp from my latest orders, user anna_7."}]
    for k in range(n_orders):
        cid = f"call_{k}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function",
             "function": {"name": "get_order_details", "arguments": json.dumps({"order_id": f"#W{1000 + k}"})}}]})
        order = {"order_id": f"#W{1000 + k}", "status": "delivered",
                 "items": [{"name": f"item {j} of order {k}", "item_id": f"{4_000_000_000 + 97 * k + j}",
                            "price": 10.5 + j, "options": {"color": "blue", "size": "large"}} for j in range(items)]}
        msgs.append({"role": "tool", "tool_call_id": cid, "content": json.dumps(order)})
    return msgs


def renders(policy: object, messages: list[dict], budget: int, session: object = None) -> list[object]:
    """The render before every assistant message and after the last, as an agent loop renders (in ``session``,
    default a new one)."""
    session = session if session is not None else ContextGraph().session("s")
    out = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            session.extend(messages[len(session):i])
            out.append(policy.render(session, budget))  # type: ignore[attr-defined]
    session.extend(messages[len(session):])
    out.append(policy.render(session, budget))  # type: ignore[attr-defined]
    return out


def test_while_the_history_fits_each_render_only_appends_to_the_previous_one() -> None:
    msgs = order_session_messages(n_orders=8)
    aware = plus()
    assert isinstance(aware, CacheAware)
    seq = renders(aware, msgs, budget=6000)
    for a, b in zip(seq, seq[1:], strict=False):
        assert b.messages[:len(a.messages)] == a.messages  # type: ignore[attr-defined]
    assert all(r.tokens <= 6000 for r in seq)  # type: ignore[attr-defined]


def _bills(policy: object, msgs: list[dict], budget: int) -> dict[str, float]:
    """The session's renders billed at the profiles' price ratios (read 0.1× / 0.25×, write 1.25× / 1×)."""
    billing = SessionBilling(("anthropic", "openai"), TokenCounter())
    total = {"anthropic": 0.0, "openai": 0.0}
    seq = renders(policy, msgs, budget)
    assert all(r.tokens <= budget for r in seq)  # type: ignore[attr-defined]
    for r in seq:
        for p, u in billing.request(r.messages, None, 20).items():  # type: ignore[attr-defined]
            read, write = (0.1, 1.25) if p == "anthropic" else (0.25, 1.0)
            total[p] += u.uncached + read * u.cache_read + write * u.cache_write
    return total


def _policy_session(n: int, items: int) -> list[dict]:
    msgs = order_session_messages(n_orders=n, items=items)
    msgs[0]["content"] = "You are a support agent. " + "Follow the store policy carefully. " * 200
    return msgs


def test_over_budget_a_policy_that_cannot_hold_results_bills_far_less_with_headroom() -> None:
    """Prune re-renders under B − h when it must change, so the next calls append: measured 0.41–0.55× its own bill
    under Anthropic's ratios, 0.58–0.68× under OpenAI's, on these sessions (docs/method.md §15 step 3)."""
    for n, items, budget in ((14, 5, 1500), (30, 4, 3000)):
        msgs = _policy_session(n, items)
        def prune(ca: bool) -> object:
            return build_policy(method_config("prune", {"cache_aware": ca}), embedder=EMB,
                                compactor=ExtractiveCompactor())
        aware, plain = prune(True), prune(False)
        got, ref = _bills(aware, msgs, budget), _bills(plain, msgs, budget)
        assert isinstance(aware, CacheAware) and aware.appended_renders > aware.fresh_renders
        assert got["anthropic"] < 0.7 * ref["anthropic"] and got["openai"] < 0.8 * ref["openai"], (got, ref)


def test_over_budget_the_plus_keeps_what_it_would_show_and_bills_no_more() -> None:
    """The plus may change late only where every result keeps the form its own fresh render gives it (or, for one
    it kept, the form it had): on these sessions that leaves about what it billed without the option (within 1 %),
    appending while nothing it would show is missing."""
    for n, items, budget in ((14, 5, 1500), (30, 4, 3000)):
        msgs = _policy_session(n, items)
        aware = plus()
        got, ref = _bills(aware, msgs, budget), _bills(plus(cache_aware=False), msgs, budget)
        assert isinstance(aware, CacheAware) and aware.appended_renders
        assert got["anthropic"] <= 1.01 * ref["anthropic"] and got["openai"] <= 1.01 * ref["openai"], (got, ref)


def _offered_renders(policy: object, messages: list[dict], budget: int) -> tuple[object, list[object]]:
    """As :func:`renders`, in a session where the expand tool is offered (as the proxy's and the episode's are)."""
    from contextrender import expand

    session = ContextGraph().session("s")
    expand.offer(session)
    return session, renders(policy, messages, budget, session)


def _shared(a: object, b: object) -> int:
    """Leading messages two renders have in common."""
    k = 0
    for x, y in zip(a.messages, b.messages, strict=False):  # type: ignore[attr-defined]
        if x != y:
            break
        k += 1
    return k


def test_where_the_expand_tool_is_offered_the_plus_holds_what_it_showed_and_each_held_back_result_has_its_handle() -> None:
    """docs/method.md §15 step 2: with the tool offered, a result the plus held back stays as it was shown (one
    expansion away, appended at the end), so its renders change only near their end and bill well under the same
    renders without the offer (measured 0.37× under Anthropic's ratios on both sessions); every result not
    shown in full carries the handle that reads it back."""
    from contextrender import expand

    for n, items, budget in ((14, 5, 1500), (30, 4, 3000)):
        msgs = _policy_session(n, items)
        session, seq = _offered_renders(plus(), msgs, budget)
        assert all(r.tokens <= budget for r in seq)  # type: ignore[attr-defined]
        billing = SessionBilling(("anthropic",), TokenCounter())
        got = sum(u.uncached + 0.1 * u.cache_read + 1.25 * u.cache_write
                  for r in seq for u in billing.request(r.messages, None, 20).values())  # type: ignore[attr-defined]
        ref = _bills(plus(), msgs, budget)["anthropic"]
        assert got < 0.85 * ref, (got, ref)
        # a change that re-sends more than the last two messages of the previous render is rare
        early = sum(_shared(a, b) < len(a.messages) - 2 for a, b in zip(seq, seq[1:], strict=False))  # type: ignore[attr-defined]
        assert early < len(seq) // 3, (early, len(seq))
        last, checked = seq[-1], 0
        for m, src in zip(last.messages, last.sources, strict=True):  # type: ignore[attr-defined]
            if src is None or not session.is_result(src) or m["content"] == session.message(src).content:
                continue
            found = expand.MARKER_HANDLE.findall(m["content"])
            assert found and expand.resolve(session, found[-1]) == src, m["content"][-200:]
            checked += 1
        assert checked  # the last render did hold results back


def test_the_newest_results_values_are_shown_whenever_the_methods_own_render_shows_them() -> None:
    """A change is taken only where it keeps what the method keeps of the results new since the last render: every
    item id of the newest order that the plus's own render shows, the cache-aware plus shows too."""
    msgs = order_session_messages(n_orders=12, items=5)
    for budget in (1200, 2000):
        aware, plain = plus(), plus(cache_aware=False)
        sa, sp = ContextGraph().session("a"), ContextGraph().session("p")
        checked = 0
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            sa.extend(msgs[len(sa):i])
            sp.extend(msgs[len(sp):i])
            ra, rp = aware.render(sa, budget), plain.render(sp, budget)  # type: ignore[attr-defined]
            results = [x for x in msgs[:i] if x["role"] == "tool"]
            if not results:
                continue
            ids = {it["item_id"] for it in json.loads(results[-1]["content"])["items"]}
            shown = {v for v in ids if v in json.dumps(rp.messages)}
            assert shown <= {v for v in ids if v in json.dumps(ra.messages)}, (budget, i)
            checked += bool(shown)
        assert checked


def test_a_repeated_render_of_one_invocation_is_the_same_render() -> None:
    msgs = order_session_messages(n_orders=10)
    aware = plus()
    session = ContextGraph().session("r")
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            session.extend(msgs[len(session):i])
            first = aware.render(session, 1500)  # type: ignore[attr-defined]
            again = aware.render(session, 1500)  # type: ignore[attr-defined]
            assert again.messages == first.messages and again.tokens == first.tokens


def test_without_a_cache_or_with_the_option_off_the_method_renders_as_it_always_does() -> None:
    msgs = order_session_messages(n_orders=10)
    plain = plus(cache_aware=False)
    none = CacheAware(plain.inner if isinstance(plain, CacheAware) else plain, profile="none")  # type: ignore[arg-type]
    ref = renders(plain, msgs, 1500)
    got = renders(none, msgs, 1500)
    assert [r.messages for r in got] == [r.messages for r in ref]  # type: ignore[attr-defined]


def test_headroom_is_the_least_cost_room_and_none_when_it_would_not_hold_one_call() -> None:
    for budget, growth, c in ((2000, 150, 1.15), (1000, 150, 0.75), (4000, 300, 1.15)):
        h = headroom(budget, growth, c)
        # the positive root of h² + c·g·h − c·g·B = 0 (rounded down), at most B/2
        root = (-c * growth + math.sqrt((c * growth) ** 2 + 4 * c * growth * budget)) / 2
        assert h == int(min(root, budget / 2))
        assert growth <= h <= budget / 2
    assert headroom(2000, 150, 0.0) == 0  # no cache: nothing to keep warm
    assert headroom(1000, 900, 1.15) == 0  # the room would not hold the next call's growth
    assert headroom(2000, 0, 1.15) == 0


def test_write_premium_comes_from_the_cost_map() -> None:
    pytest.importorskip("litellm")
    assert write_premium("anthropic") == pytest.approx(1.15)  # (1.25 − 0.1) / 1 at claude-sonnet-4-5's prices
    assert write_premium("openai") == pytest.approx(0.75)  # (1 − 0.25) / 1 at gpt-4.1's
    assert write_premium("none") == 0.0


def test_what_the_model_is_reading_back_stays_in_full_until_its_next_other_turn() -> None:
    """docs/method.md §15: with the tool offered, the answers of the expand calls the model made since its last
    other turn are shown in full by the next render, however little room is left: two read-backs that pushed each
    other out would never end (a τ²-retail task at B = 4000 expanded one result, the render dropped it for the
    next, and the closing message lost the first value)."""
    from contextrender import expand
    from contextrender.cache_aware import _reading_back

    budget = 1500
    policy = plus()
    session, seq = _offered_renders(policy, order_session_messages(n_orders=8, items=6), budget)
    held_back = [src for m, src in zip(seq[-1].messages, seq[-1].sources, strict=True)  # type: ignore[attr-defined]
                 if src is not None and session.is_result(src) and expand.MARKER_HANDLE.search(m["content"])]
    assert len(held_back) >= 2
    answers = []
    for i, src in enumerate(held_back[:2]):  # the model reads two held-back orders back, one call at a time
        h = expand.handle(session, src)
        call = {"id": f"x{i}", "type": "function",
                "function": {"name": expand.TOOL_NAME, "arguments": json.dumps({"handle": h})}}
        session.extend([{"role": "assistant", "content": None, "tool_calls": [call]}])
        text = expand.expand(session, {"handle": h}, max_tokens=budget // 2).text
        session.extend([{"role": "tool", "tool_call_id": f"x{i}", "content": text}])
        answers.append(len(session) - 1)
        assert _reading_back(session) == answers
        r = policy.render(session, budget)  # type: ignore[attr-defined]
        shown = {src for m, src in zip(r.messages, r.sources, strict=True)
                 if src is not None and m["content"] == session.message(src).content}
        assert set(answers) <= shown, (answers, sorted(shown))
        assert r.tokens <= budget
    session.extend([{"role": "assistant", "content": "Both orders hold the lamp."}])
    assert _reading_back(session) == []
