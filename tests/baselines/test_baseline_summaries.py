"""Compact, Recency + Summary and ACON: summaries, merging, usage and restart-resume (docs/method.md §6)."""

from __future__ import annotations

import pytest
from _baseline_util import (
    RecordingCompactor,
    Transcript,
    base_tokens,
    delta,
    history_recount,
    pairing_errors,
)

from contextrender import ContextGraph, Usage
from contextrender.baselines import Acon, Compact, Prune, RecencySummary
from contextrender.baselines.acon import OBSERVATION_LABEL, load_guidelines, parse_history_summary
from contextrender.baselines.acon import SUMMARY_LABEL as ACON_LABEL
from contextrender.baselines.compact import SUMMARY_LABEL as COMPACT_LABEL
from contextrender.baselines.recency_summary import SUMMARY_LABEL as RS_LABEL
from contextrender.compaction import fill
from contextrender.render import Scope, marker_text


def order(i: int, words: int = 60) -> str:
    """A result with one identifying line, then filler lines with no qualifying values."""
    return f"ORDER-{1000 + i} shipped to warehouse_{i}\n" + "\n".join(["note note note note note"] * (words // 5))


def orders(sizes: list[int], task: str = "Reconcile the orders.") -> tuple[Transcript, list[int]]:
    t = Transcript(task=task)
    return t, [t.call(order(i, n)) for i, n in enumerate(sizes)]


def summary_of(rendered, label: str) -> str:
    msg = rendered.messages[1]
    assert msg["role"] == "user" and msg["content"].startswith(label + "\n")
    return msg["content"][len(label) + 1:]


def check(session, rendered, budget):
    assert rendered.tokens <= budget
    assert rendered.tokens == history_recount(session, rendered)
    assert not pairing_errors(rendered.messages)


# -- Compact -------------------------------------------------------------------------


def test_compact_is_full_history_until_the_budget_is_exceeded():
    t, r = orders([60, 60])
    s = t.session()
    comp = RecordingCompactor()
    out = Compact(compactor=comp).render(s, 1000)
    assert list(out.messages) == s.openai_messages() and out.visible == set(r)
    assert comp.calls == [] and out.usage == Usage()


def test_compact_summarises_the_whole_history_then_appends_and_recompacts():
    t, r = orders([60, 60, 60, 60])
    s = t.session()
    budget = 300
    assert Scope.of(s).full_tokens(s) > budget
    comp = RecordingCompactor()
    policy = Compact(compactor=comp)
    out = policy.render(s, budget)
    # system prompt, the summary right after it, then the task (current user message, outside B).
    assert [m["role"] for m in out.messages] == ["system", "user", "user"]
    assert out.messages[2]["content"] == "Reconcile the orders."
    summary = summary_of(out, COMPACT_LABEL)
    assert "ORDER-1000" in summary and "ORDER-1003" in summary
    assert len(comp.calls) == 1
    text, cap, instructions = comp.calls[0]
    assert all(f"ORDER-{1000 + i}" in text for i in range(4)) and "Reconcile the orders." not in text
    assert instructions is None  # the docs/method.md §6 summary prompt (SUMMARY_PROMPT) is the default
    assert cap + s.counter.text(COMPACT_LABEL + "\n") + 4 == budget // 2
    assert out.visible == frozenset()
    assert out.usage == comp.usages[0] and out.usage.input > 0 and out.usage.output > 0
    check(s, out, budget)

    # The next turn is appended verbatim after the summary; no new compaction.
    r4 = t.call(order(4, 20))
    s.sync(t.messages)
    nxt = policy.render(s, budget)
    assert nxt.messages[:3] == out.messages and len(nxt.messages) == 5 and nxt.visible == {r4}
    assert nxt.usage == Usage() and len(comp.calls) == 1
    check(s, nxt, budget)

    # Overflow again: the previous summary and the new turns are compacted together.
    for i in range(5, 8):
        t.call(order(i, 60))
    s.sync(t.messages)
    again = policy.render(s, budget)
    assert len(comp.calls) == 2
    text2 = comp.calls[1][0]
    assert text2.startswith("[Summary so far]\n" + summary) and "ORDER-1007" in text2 and "ORDER-1000" not in text2[
        len("[Summary so far]\n" + summary):]
    assert again.visible == frozenset() and again.usage == comp.usages[1]
    assert "ORDER-1000" in summary_of(again, COMPACT_LABEL)
    check(s, again, budget)


# -- Recency + Summary -------------------------------------------------------------


def test_recency_summary_window_is_contiguous_and_older_results_are_summarised():
    t, r = orders([60, 60, 400, 60, 60])
    s = t.session()
    budget = 565
    reserve = budget // 4
    room = budget - base_tokens(s) - reserve
    # The window holds r4 and r3; r2 does not fit and stops it, although r1 would still fit.
    assert delta(s, r[4]) + delta(s, r[3]) + delta(s, r[2]) > room >= sum(delta(s, r[i]) for i in (4, 3, 1))
    comp = RecordingCompactor()
    out = RecencySummary(compactor=comp).render(s, budget)
    assert out.visible == {r[3], r[4]}
    assert r[1] in Prune().render(s, budget).visible  # Prune would skip r2 and keep r1
    bodies = {m["tool_call_id"]: m["content"] for m in out.messages if m["role"] == "tool"}
    for i in (0, 1, 2):  # evicted: call kept, marker shown, content in the summary
        assert bodies[s.result(r[i]).call_id] == marker_text(s, r[i])
    summary = summary_of(out, RS_LABEL)
    assert all(f"ORDER-{1000 + i}" in summary for i in (0, 1, 2)) and "ORDER-1003" not in summary
    assert len(comp.calls) == 1 and comp.calls[0][2] is None  # same prompt as Compact
    assert out.usage == comp.usages[0]
    check(s, out, budget)


def test_recency_summary_merges_the_previous_summary_with_newly_evicted_results():
    t, r = orders([60, 60, 400, 60, 60])
    s = t.session()
    budget = 565
    comp = RecordingCompactor()
    policy = RecencySummary(compactor=comp)
    first = summary_of(policy.render(s, budget), RS_LABEL)
    r5, r6 = t.call(order(5)), t.call(order(6))
    s.sync(t.messages)
    out = policy.render(s, budget)
    assert out.visible == {r[4], r5, r6}  # r3 is newly evicted
    assert len(comp.calls) == 2
    text = comp.calls[1][0]
    assert text.startswith("[Summary so far]\n" + first)  # the compactor got the previous summary
    assert "ORDER-1003" in text and "ORDER-1002" not in text[len("[Summary so far]\n" + first):]
    assert out.usage == comp.usages[1]
    second = summary_of(out, RS_LABEL)
    assert "ORDER-1000" in second and "ORDER-1002" in second and "ORDER-1003" in second  # old and new
    check(s, out, budget)
    # A repeated render changes nothing and costs nothing.
    again = policy.render(s, budget)
    assert again.messages == out.messages and again.usage == Usage() and len(comp.calls) == 2


# -- ACON ----------------------------------------------------------------------------


def test_acon_compresses_history_past_threshold_keeping_the_last_turn():
    t, r = orders([60, 60, 60, 60, 60])
    s = t.session()
    reply = "The agent listed five orders.\n## History Summary\nORDER-1000 to ORDER-1003 shipped."
    comp = RecordingCompactor(reply=reply)
    policy = Acon(compactor=comp, history_threshold=300)
    assert 300 < Scope.of(s).full_tokens(s) < 2000
    out = policy.render(s, 2000)
    assert [m["role"] for m in out.messages] == ["system", "user", "user", "assistant", "tool"]
    assert summary_of(out, ACON_LABEL) == "ORDER-1000 to ORDER-1003 shipped."  # parsed after the heading
    assert out.messages[4]["content"] == s.message(r[4]).content and out.visible == {r[4]}
    text, cap, instructions = comp.calls[0]
    assert "ORDER-1003" in text and "ORDER-1004" not in text
    assert "History Summary" in instructions and "interaction history of an agent" in instructions
    assert cap == 150 - s.counter.text(ACON_LABEL + "\n") - 4
    assert out.usage == comp.usages[0]
    check(s, out, 2000)

    # Turns are appended after the summary until the threshold is passed again; then the previous
    # summary is compressed with every turn but the last.
    r5 = t.call(order(5))
    s.sync(t.messages)
    assert policy.render(s, 2000).visible == {r[4], r5} and len(comp.calls) == 1
    t.call(order(6))
    r7 = t.call(order(7))
    s.sync(t.messages)
    nxt = policy.render(s, 2000)
    assert len(comp.calls) == 2 and comp.calls[1][0].startswith("[Summary so far]\nORDER-1000 to ORDER-1003")
    assert all(f"ORDER-{i}" in comp.calls[1][0] for i in (1004, 1005, 1006)) and "ORDER-1007" not in comp.calls[1][0]
    assert nxt.visible == {r7}
    check(s, nxt, 2000)


def test_acon_summary_falls_back_to_whole_output_without_heading():
    assert parse_history_summary("just a summary") == "just a summary"
    assert parse_history_summary("notes\n### **History Summary**\n- a\n- b") == "- a\n- b"
    assert parse_history_summary("History summary: all done") == "all done"
    assert parse_history_summary("reasoning\n## History Summary\n") == "reasoning\n## History Summary"
    t, _ = orders([60] * 5)
    s = t.session()
    out = Acon(compactor=RecordingCompactor(reply="plain ORDER-1001 text"), history_threshold=300).render(s, 2000)
    assert summary_of(out, ACON_LABEL) == "plain ORDER-1001 text"


def test_acon_compresses_large_observations_once():
    t = Transcript(task="Reconcile the orders.")
    small = t.call(order(0, 20))
    big = t.call(order(1, 400))
    s = t.session()
    comp = RecordingCompactor()
    policy = Acon(compactor=comp, observation_threshold=100)
    out = policy.render(s, 3000)
    body = {m["tool_call_id"]: m["content"] for m in out.messages if m["role"] == "tool"}[s.result(big).call_id]
    assert body.startswith(OBSERVATION_LABEL + "\n") and "ORDER-1001" in body
    assert s.counter.text(body) + 4 <= 50  # at most observation_ratio (0.5) of the threshold
    assert out.visible == {small}  # a compressed observation is not its complete text
    assert len(comp.calls) == 1 and "one long tool output" in comp.calls[0][2]
    assert out.usage == comp.usages[0]
    again = policy.render(s, 3000)
    assert again.messages == out.messages and again.usage == Usage() and len(comp.calls) == 1
    check(s, out, 3000)


def test_acon_thresholds_never_exceed_the_budget():
    t, _ = orders([60] * 8)
    budget = 400
    a = Acon(history_threshold=4096, observation_threshold=1024).render(t.session(ContextGraph(), "a"), budget)
    b = Acon(history_threshold=budget, observation_threshold=budget).render(t.session(ContextGraph(), "b"), budget)
    assert a.messages == b.messages and a.tokens <= budget
    assert a.messages[1]["content"].startswith(ACON_LABEL)


def test_acon_guideline_from_a_user_file(tmp_path):
    shipped_history, shipped_observation = load_guidelines("baselines/acon_guideline.md")
    assert "interaction history" in shipped_history and "one long tool output" in shipped_observation
    path = tmp_path / "authors_guideline.txt"
    path.write_text("Keep CUSTOM-RULE-7 values; JSON like {\"id\": 3} stays literal.\n")
    comp = RecordingCompactor()
    t, _ = orders([60] * 5)
    s = t.session()
    out = Acon(compactor=comp, history_threshold=300, guideline_path=str(path)).render(s, 2000)
    instructions = comp.calls[0][2]
    assert "CUSTOM-RULE-7" in instructions and "interaction history of an agent" not in instructions
    prompt = fill(instructions, max_tokens=10)  # what the model is told (compaction.compaction_prompt)
    assert '{"id": 3}' in prompt and '{{"id": 3}}' not in prompt
    check(s, out, 2000)


# -- restart and resume -------------------------------------------------------------


POLICIES = {
    "compact": lambda c: Compact(compactor=c),
    "recency_summary": lambda c: RecencySummary(compactor=c),
    "acon": lambda c: Acon(compactor=c, history_threshold=350, observation_threshold=120),
}


def _long() -> Transcript:
    t = Transcript(task="Reconcile the orders.")
    for i in range(12):
        t.call(order(i, [40, 60, 200, 30][i % 4]), say=f"Checking ORDER-{1000 + i}.")
        if i == 6:
            t.user("Also note which warehouses were used.")
    return t


def _replay(policy, session, messages, budget, upto=None):
    """Feed messages one by one, rendering before every invocation like an agent loop."""
    out = None
    for m in messages[len(session):upto]:
        if m["role"] == "assistant":
            out = policy.render(session, budget)
        session.add(m)
    return policy.render(session, budget) if upto is None else out


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_stateful_policies_resume_identically_after_reopening(tmp_path, name):
    msgs = _long().messages
    budget = 500
    g = ContextGraph(tmp_path / "a.sqlite")
    comp = RecordingCompactor()
    final = _replay(POLICIES[name](comp), g.session("s"), msgs, budget)
    assert comp.calls, "the scenario must exercise the summary"
    g.close()

    # Reopen: a fresh policy object renders the same thing and compacts nothing.
    g = ContextGraph(tmp_path / "a.sqlite")
    comp2 = RecordingCompactor()
    again = POLICIES[name](comp2).render(g.session("s"), budget)
    assert (again.messages, again.tokens, again.visible) == (final.messages, final.tokens, final.visible)
    assert comp2.calls == [] and again.usage == Usage()
    g.close()

    # Interrupted half-way and resumed from the file: same end state as the uninterrupted run.
    g = ContextGraph(tmp_path / "b.sqlite")
    _replay(POLICIES[name](RecordingCompactor()), g.session("s"), msgs, budget, upto=len(msgs) // 2)
    g.close()
    g = ContextGraph(tmp_path / "b.sqlite")
    resumed = _replay(POLICIES[name](RecordingCompactor()), g.session("s"), msgs, budget)
    assert resumed.messages == final.messages and resumed.visible == final.visible
    check(g.session("s"), resumed, budget)
    g.close()


def test_state_is_keyed_by_policy_name_and_budget():
    t, _ = orders([60] * 6)
    s = t.session()
    comp = RecordingCompactor()
    Compact(compactor=comp).render(s, 300)
    Compact(compactor=comp).render(s, 350)  # another budget: its own compaction
    Compact(compactor=comp, name="compact_b").render(s, 300)  # another name: its own state
    assert len(comp.calls) == 3
    Compact(compactor=comp).render(s, 300)
    assert len(comp.calls) == 3
