"""The peer strategies (``baselines/peers/``): each one's exact selection on a hand-made transcript.

Every test builds a small transcript, picks B so that the full history exceeds it, and checks the
render against the upstream rule of the peer — window, keep-N, protect/minimum thresholds,
placeholder text, summary placement, what happens to tool inputs — and that the shared scope holds
(Tok(H_t) ≤ B recounted independently, pairing valid). The no-render-above-B and pairing property
over random transcripts is in ``test_baseline_properties.py``, shared with the other baselines.
"""

from __future__ import annotations

import json

import pytest
from _baseline_util import RecordingCompactor, Transcript, history_recount, pairing_errors, text_of

from contextrender import ExtractiveCompactor, HashingEmbedder
from contextrender.baselines._common import SummaryPolicy
from contextrender.baselines.peers import (
    ClearToolUses,
    InspectEdit,
    InspectTrim,
    LangChainTrim,
    OpencodePrune,
    OpenHandsForgetting,
    OpenHandsMasking,
    OpenHandsSummary,
    SweLastN,
    TailCompaction,
)
from contextrender.baselines.peers import openhands as oh
from contextrender.baselines.peers import tail_compaction as tc
from contextrender.baselines.peers._shared import Inserted, enforce_budget, layout_tokens
from contextrender.baselines.peers.context_editing import CLEARED
from contextrender.baselines.peers.inspect_compaction import TOOL_RESULT_REMOVED
from contextrender.baselines.peers.opencode import PRUNED
from contextrender.experiments import catalogue
from contextrender.registry import build_policy, method_config
from contextrender.render import ContextPolicy, Scope, marker_text

PEERS = {"openhands_masking": OpenHandsMasking, "openhands_summary": OpenHandsSummary,
         "openhands_forgetting": OpenHandsForgetting, "inspect_edit": InspectEdit, "inspect_trim": InspectTrim,
         "clear_tool_uses": ClearToolUses, "opencode_prune": OpencodePrune, "swe_last_n": SweLastN,
         "langchain_trim": LangChainTrim, "tail_compaction": TailCompaction}


# -- helpers ---------------------------------------------------------------------------------


def calls(n: int, words: int = 40, task: str = "Fix the failing build.", **kw) -> tuple[Transcript, list[int]]:
    """A task and ``n`` single-call invocations; returns the transcript and the result seqs."""
    t = Transcript(task=task)
    return t, [t.call(text_of(f"result {i}", words), **kw) for i in range(n)]


def rendered(out) -> list[int | None]:
    """Sources of the rendered messages (None: an inserted summary)."""
    return list(out.sources)


def body(s, out, seq: int) -> str:
    """The rendered body of stored message ``seq``."""
    return out.messages[out.sources.index(seq)]["content"]


def full(s, out) -> set[int]:
    """Result seqs rendered with their complete original text."""
    return {src for m, src in zip(out.messages, out.sources, strict=True)
            if src is not None and m["role"] == "tool" and m["content"] == s.message(src).content}


def check(s, out, budget: int) -> None:
    assert out.tokens <= budget
    assert out.tokens == history_recount(s, out)
    assert not pairing_errors(out.messages), pairing_errors(out.messages)
    assert out.visible == full(s, out)


def full_tokens(s) -> int:
    return Scope.of(s).full_tokens(s)


def multi_call(t: Transcript, results: list[str], name: str = "lookup") -> list[int]:
    """One invocation with several parallel tool calls; returns the result seqs."""
    ids = [f"par_{len(t.messages)}_{i}" for i in range(len(results))]
    t.messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}} for cid in ids]})
    seqs = []
    for cid, text in zip(ids, results, strict=True):
        t.messages.append({"role": "tool", "tool_call_id": cid, "content": text})
        seqs.append(len(t.messages) - 1)
    return seqs


# -- registry, defaults, scaling, catalogue ------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PEERS))
def test_each_peer_config_builds_its_policy_with_the_shipped_defaults(name):
    compactor = ExtractiveCompactor()
    policy = build_policy(method_config(name), embedder=HashingEmbedder(dim=64), compactor=compactor)
    assert type(policy) is PEERS[name] and policy.name == name and policy.budgeted
    assert isinstance(policy, ContextPolicy)
    if isinstance(policy, SummaryPolicy) and name != "openhands_forgetting":
        assert policy.compactor is compactor  # the one compaction model layer, injected
    info = catalogue.info(name)
    assert info is not None and info.kind == "peer" and "peers" in info.groups and info.label != name


def test_shipped_defaults_and_budget_scaled_sizes():
    p = {n: build_policy(method_config(n)) for n in PEERS}
    assert p["openhands_masking"].attention_window == 5
    assert (p["openhands_summary"].keep_first, p["openhands_summary"].max_event_chars) == (1, 10_000)
    assert p["openhands_forgetting"].keep_first == 1
    assert p["inspect_edit"].keep_tool_uses == 3 and p["inspect_trim"].preserve == 0.8
    assert (p["clear_tool_uses"].keep, p["clear_tool_uses"].clear_at_least) == (3, 0)
    assert (p["swe_last_n"].n, p["swe_last_n"].polling) == (5, 1)
    # opencode: PRUNE_PROTECT 40,000 / PRUNE_MINIMUM 20,000 for a 200,000-token window → 0.2·B / 0.1·B
    assert p["opencode_prune"].thresholds(6000) == (1200, 600)
    assert build_policy(method_config("opencode_prune", {"scale_to_budget": False})).thresholds(6000) == (40_000, 20_000)
    # opencode tail: clamp(25 % of 200,000, 2K, 15K) = 15K → 0.075·B; Codex user messages 20K → 0.1·B
    tail = p["tail_compaction"]
    assert (tail.tail_budget(6000), tail.user_budget(6000)) == (450, 600)
    absolute = build_policy(method_config("tail_compaction", {"scale_to_budget": False}))
    assert (absolute.tail_budget(6000), absolute.tail_budget(40_000), absolute.tail_budget(100_000)) == \
        (2000, 10_000, 15_000)
    assert absolute.user_budget(6000) == 20_000


def test_the_catalogue_gives_every_peer_its_own_colour_and_marker():
    entries = catalogue.catalogue().values()
    assert tuple(n for n, m in catalogue.catalogue().items() if m.kind == "peer") == tuple(PEERS)
    # the peer head-to-head (make peers) runs every peer plus full, prune, contextrender and contextrender_plus
    assert catalogue.group("peers") == ("full", "prune", "contextrender", "contextrender_plus", *PEERS)
    assert len({m.colour for m in entries}) == len({m.marker for m in entries}) == len(entries)


@pytest.mark.parametrize("name", sorted(PEERS))
def test_every_peer_returns_the_full_history_while_it_fits(name):
    t, r = calls(4)
    s = t.session()
    comp = RecordingCompactor()
    policy = build_policy(method_config(name), compactor=comp)
    out = policy.render(s, full_tokens(s))
    assert list(out.messages) == s.openai_messages() and out.visible == set(r) and comp.calls == []


# -- OpenHands observation masking -------------------------------------------------------------


def test_openhands_masking_masks_observations_outside_the_last_five_events():
    t, r = calls(6)
    s = t.session()
    budget = full_tokens(s) - 1
    out = OpenHandsMasking().render(s, budget)
    # events: system 0, task 1, then (call, result) pairs: results at 3, 5, 7, 9, 11, 13 of 14 events;
    # the window is the last 5 (indices 9–13): results 3–5 stay, 0–2 are masked.
    assert [body(s, out, x) for x in r[:3]] == ["<MASKED>"] * 3
    assert full(s, out) == set(r[3:])
    assert rendered(out) == list(range(len(s)))  # every call (tool input) stays, with its tool message
    check(s, out, budget)


def test_openhands_masking_counts_each_parallel_call_as_an_event():
    t, r = calls(2)
    par = multi_call(t, [text_of("a", 40), text_of("b", 40)])
    s = t.session()
    # events: sys, task, call0, r0 (3), call1, r1 (5), call2a, call2b, r2a (8), r2b (9): 10 events
    out = OpenHandsMasking(attention_window=5).render(s, full_tokens(s) - 1)
    assert body(s, out, r[0]) == "<MASKED>" and full(s, out) == {r[1], *par}
    out = OpenHandsMasking(attention_window=4).render(s, full_tokens(s) - 1)
    assert {body(s, out, x) for x in r} == {"<MASKED>"} and full(s, out) == set(par)


def test_openhands_masking_falls_back_to_masking_the_oldest_remaining_results():
    t, r = calls(6)
    s = t.session()
    masked = {x: "<MASKED>" for x in r[:3]}
    budget = layout_tokens(s, Scope.of(s).history, masked) - 1  # the window's rule alone leaves H above B
    out = OpenHandsMasking().render(s, budget)
    assert body(s, out, r[3]) == "<MASKED>" and full(s, out) == set(r[4:])  # oldest remaining first
    check(s, out, budget)


# -- SWE-agent last_n_observations -----------------------------------------------------------------


def test_swe_last_n_elides_all_but_the_last_five_with_the_real_line_count():
    t = Transcript(task="Fix the failing build.")
    r = [t.call("\n".join(f"line {j} of output {i}" for j in range(i + 2))) for i in range(7)]
    s = t.session()
    budget = full_tokens(s) - 1
    out = SweLastN().render(s, budget)
    assert body(s, out, r[0]) == "Old environment output: (2 lines omitted)"
    assert body(s, out, r[1]) == "Old environment output: (3 lines omitted)"
    assert full(s, out) == set(r[2:])
    assert out.messages[1]["content"] == "Fix the failing build."  # the instance template is never elided
    assert rendered(out) == list(range(len(s)))
    check(s, out, budget)


def test_swe_last_n_polling_keeps_between_n_and_n_plus_polling():
    t, r = calls(7)
    s = t.session()
    # 8 observations (template + 7); polling 3: elided up to (8 // 3)·3 − 2 = 4 → results 0–2
    out = SweLastN(n=2, polling=3).render(s, full_tokens(s) - 1)
    assert full(s, out) == set(r[3:])


# -- inspect_ai CompactionEdit ----------------------------------------------------------------------


def test_inspect_edit_keeps_the_newest_three_tool_uses_and_the_calls():
    t, r = calls(5)
    s = t.session()
    budget = full_tokens(s) - 1
    out = InspectEdit().render(s, budget)
    assert [body(s, out, x) for x in r[:2]] == ["(Tool result removed)"] * 2 and full(s, out) == set(r[2:])
    assert rendered(out) == list(range(len(s)))  # keep_tool_inputs: the calls stay
    check(s, out, budget)


def test_inspect_edit_clears_again_only_when_the_compacted_history_exceeds_b():
    t, r = calls(5)
    s = t.session()
    budget = full_tokens(s) - 1
    policy = InspectEdit()
    policy.render(s, budget)
    r += [t.call(text_of(f"small {i}", 2)) for i in range(2)]
    s.sync(t.messages)
    out = policy.render(s, budget)  # compacted input + new messages fit: appended in full
    assert full(s, out) == set(r[2:]) and len(full(s, out)) == 5
    r.append(t.call(text_of("big", 60)))
    s.sync(t.messages)
    out = policy.render(s, budget)  # over again: all but the newest three tool uses are cleared
    assert full(s, out) == set(r[-3:])
    assert {body(s, out, x) for x in r[:-3]} == {TOOL_RESULT_REMOVED}
    check(s, out, budget)


def test_inspect_edit_excluded_tools_are_neither_cleared_nor_counted():
    t = Transcript(task="Fix the failing build.")
    r = [t.call(text_of(f"r{i}", 40), name=n) for i, n in enumerate(["lookup", "lookup", "read_file", "lookup"])]
    s = t.session()
    out = InspectEdit(keep_tool_uses=2, exclude_tools=["read_file"]).render(s, full_tokens(s) - 1)
    assert body(s, out, r[0]) == TOOL_RESULT_REMOVED and full(s, out) == set(r[1:])


# -- Anthropic / LangChain clear_tool_uses ------------------------------------------------------------


def test_clear_tool_uses_clears_all_but_the_newest_three_and_is_stateless():
    t, r = calls(5)
    s = t.session()
    budget = full_tokens(s) - 1
    policy = ClearToolUses()
    out = policy.render(s, budget)
    assert [body(s, out, x) for x in r[:2]] == ["[cleared]"] * 2 and full(s, out) == set(r[2:])
    assert rendered(out) == list(range(len(s)))  # clear_tool_inputs False: the calls stay
    check(s, out, budget)
    r += [t.call(text_of(f"small {i}", 2)) for i in range(2)]
    s.sync(t.messages)
    out = policy.render(s, budget)  # applied to each request: again only the newest three stay
    assert full(s, out) == set(r[-3:]) and {body(s, out, x) for x in r[:-3]} == {CLEARED}


def test_clear_tool_uses_excluded_tools_count_towards_keep_and_clear_at_least_stops():
    t = Transcript(task="Fix the failing build.")
    r = [t.call(text_of(f"r{i}", 40), name=n) for i, n in enumerate(["lookup", "lookup", "read_file", "lookup"])]
    s = t.session()
    budget = full_tokens(s) - 1
    # LangChain slices off the newest `keep` before checking exclusions: candidates r0, r1 (r2 excluded, r3 kept)
    out = ClearToolUses(keep=2, exclude_tools=["read_file"]).render(s, budget)
    assert {body(s, out, x) for x in r[:2]} == {CLEARED} and full(s, out) == set(r[2:])
    # clear_at_least: stop once that many tokens are freed (one result frees ≈ 45)
    out = ClearToolUses(keep=1, clear_at_least=10).render(s, budget)
    assert body(s, out, r[0]) == CLEARED and full(s, out) == set(r[1:])


# -- opencode prune ------------------------------------------------------------------------------------


def _turns() -> tuple[Transcript, list[int]]:
    """Three user turns: results r0–r3 (turn 1), r4–r5 (turn 2), r6 (turn 3, the current one)."""
    t = Transcript(task="Fix the failing build.")
    r = [t.call(text_of(f"turn one {i}", 40)) for i in range(4)]
    t.user("Now also fix the linter.")
    r += [t.call(text_of(f"turn two {i}", 40)) for i in range(2)]
    t.user("And update the changelog.")
    r.append(t.call(text_of("turn three", 40)))
    return t, r


def test_opencode_prune_protects_recent_output_and_the_last_two_turns():
    t, r = _turns()
    s = t.session()
    est = s.counter.text(s.message(r[0]).content)  # every output has the same estimate
    policy = OpencodePrune(protect_tokens=est, minimum_tokens=2 * est - 1, scale_to_budget=False)
    # the walk skips turns 3 and 2; in turn 1 newest first: r3 protected (total = protect), r2, r1, r0 candidates
    assert policy.to_prune(s, 1000, set()) == [r[2], r[1], r[0]]
    budget = full_tokens(s) - 1
    out = policy.render(s, budget)
    assert [body(s, out, x) for x in r[:3]] == ["[Old tool result content cleared]"] * 3
    assert full(s, out) == set(r[3:]) and rendered(out) == list(range(len(s)))
    check(s, out, budget)


def test_opencode_prune_needs_more_than_the_minimum_and_stops_at_pruned_output():
    t, r = _turns()
    s = t.session()
    est = s.counter.text(s.message(r[0]).content)
    assert OpencodePrune(protect_tokens=est, minimum_tokens=3 * est, scale_to_budget=False).to_prune(s, 1, set()) == []
    policy = OpencodePrune(protect_tokens=est, minimum_tokens=0, scale_to_budget=False)
    # r0 already pruned: the walk stops there, r1 and r2 are the candidates
    assert policy.to_prune(s, 1, {r[0]}) == [r[2], r[1]]
    # one user message: the last two user turns are the whole transcript, nothing is ever pruned
    single, _ = calls(8)
    assert policy.to_prune(single.session(), 1, set()) == []


def test_opencode_prune_is_budget_scaled_and_persists():
    t, r = _turns()
    s = t.session()
    est = s.counter.text(s.message(r[0]).content)
    budget = 400
    policy = OpencodePrune()
    assert policy.thresholds(budget) == (80, 40) and est <= 80 < 2 * est  # protect 0.2·B, minimum 0.1·B
    assert full_tokens(s) > budget
    out = policy.render(s, budget)
    # turns 3 and 2 skipped; r3 protected; r2 + r1 + r0 = 3·est > 40 are pruned
    assert {body(s, out, x) for x in r[:3]} == {PRUNED} and full(s, out) == set(r[3:])
    t.user("One more thing.")
    t.call(text_of("turn four", 5))
    s.sync(t.messages)
    later = policy.render(s, budget)
    assert {body(s, later, x) for x in r[:3]} == {PRUNED} and full(s, later) == set(r[3:]) | {len(s) - 1}
    check(s, later, budget)


# -- inspect_ai CompactionTrim --------------------------------------------------------------------------


def test_inspect_trim_keeps_system_input_and_the_newest_80_percent():
    t, r = calls(10)
    s = t.session()
    conv = list(range(2, len(s)))  # 20 conversation messages after the task (the input)
    keep = conv[4:]  # int(20 · 0.2) = 4 dropped
    budget = s.tokens_of(keep)
    assert full_tokens(s) > budget
    out = InspectTrim().render(s, budget)
    assert rendered(out) == [0, 1, *keep]
    check(s, out, budget)


def test_inspect_trim_trims_again_until_it_fits_and_keeps_tool_pairs():
    t, r = calls(10)
    s = t.session()
    conv = list(range(2, len(s)))
    # second trim: int(16 · 0.2) = 3 more → starts at r3, whose call was dropped → r3 goes too
    keep = conv[8:]
    assert s.message(conv[7]).role == "tool" and s.message(keep[0]).role == "assistant"
    budget = s.tokens_of(keep)
    out = InspectTrim().render(s, budget)
    assert rendered(out) == [0, 1, *keep]
    check(s, out, budget)


def test_inspect_trim_appends_to_the_trimmed_history_until_it_is_over_again():
    t, r = calls(10)
    s = t.session()
    conv = list(range(2, len(s)))
    budget = s.tokens_of(conv[4:]) + 40
    policy = InspectTrim()
    policy.render(s, budget)
    t.call("ok")
    s.sync(t.messages)
    out = policy.render(s, budget)
    assert rendered(out) == [0, 1, *conv[4:], len(s) - 2, len(s) - 1]  # not trimmed again: it fits
    assert out.tokens <= budget


# -- LangChain trim_messages -----------------------------------------------------------------------------


def _two_users() -> Transcript:
    t = Transcript(task="Fix the failing build.")
    t.call(text_of("first", 40))
    t.call(text_of("second", 40))
    t.user("Now also fix the linter.")  # becomes history once the next user message arrives
    t.call(text_of("third", 40))
    t.call(text_of("fourth", 40))
    t.user("And update the changelog.")  # the current user message
    t.call(text_of("fifth", 40))
    return t


def test_langchain_trim_keeps_the_newest_whole_messages_that_fit():
    t = _two_users()
    s = t.session()
    hist = Scope.of(s).history
    cur = Scope.of(s).current
    assert (hist[-8:], cur) == ((5, 6, 7, 8, 9, 10, 12, 13), 11)
    budget = s.tokens_of(hist[-8:])  # the run: A1's result (seq 5) and everything after it
    out = LangChainTrim().render(s, budget)
    # the run starts on a tool message whose call was trimmed: dropped by the pairing rule; the task
    # message (no longer the current user message) is gone too
    assert rendered(out) == [0, 6, 7, 8, 9, 10, 11, 12, 13]
    check(s, out, budget)


def test_langchain_trim_start_on_human_starts_the_run_on_a_user_message():
    t = _two_users()
    s = t.session()
    hist, cur = Scope.of(s).history, Scope.of(s).current
    run = [x for x in hist if x >= 4]  # A1 and its result fit
    budget = s.tokens_of(run)
    assert rendered(LangChainTrim().render(s, budget)) == sorted([0, cur, *run])
    out = LangChainTrim(start_on_human=True).render(s, budget)
    assert rendered(out) == sorted([0, cur, *(x for x in run if x >= 6)])  # starts at "Now also fix the linter."
    assert out.messages[1]["content"] == "Now also fix the linter."


# -- OpenHands forgetting and summarizing ----------------------------------------------------------------


def test_openhands_forgetting_keeps_the_head_and_the_newest_half_of_the_events():
    t, r = calls(10)
    s = t.session()
    # 22 events (system, task, 10 pairs); keep_first 1 = the system prompt; tail 22 // 2 − 1 = 10 events
    tail = list(range(12, len(s)))
    budget = s.tokens_of(tail)
    out = OpenHandsForgetting().render(s, budget)
    assert rendered(out) == [0, 1, *tail]  # the task stays: it is the current user message (outside B)
    check(s, out, budget)


def test_openhands_forgetting_never_splits_a_call_from_its_result_and_condenses_again():
    t, r = calls(10)
    s = t.session()
    # keep_first 2 = system + task; tail 11 − 2 = 9 events: starts on r5, whose call is forgotten
    tail = list(range(14, len(s)))
    out = OpenHandsForgetting(keep_first=2).render(s, s.tokens_of(tail))
    assert rendered(out) == [0, 1, *tail]
    # a budget the first halving does not meet: the view (10 events) is halved again → 5 − 2 = 3 events,
    # which start on r8 (its call forgotten) → from call 9
    tail2 = list(range(20, len(s)))
    out = OpenHandsForgetting(keep_first=2).render(s, s.tokens_of(range(18, len(s))))
    assert rendered(out) == [0, 1, *tail2]
    check(s, out, s.tokens_of(range(18, len(s))))


def test_openhands_forgotten_events_stay_forgotten():
    t, r = calls(10)
    s = t.session()
    tail = list(range(12, len(s)))
    budget = s.tokens_of(tail) + 200
    policy = OpenHandsForgetting()
    policy.render(s, budget)
    t.call("ok")
    s.sync(t.messages)
    out = policy.render(s, budget)
    assert rendered(out) == [0, 1, *tail, len(s) - 2, len(s) - 1]


def test_openhands_summary_places_the_summary_event_after_the_head():
    t, r = calls(10)
    s = t.session()
    comp = RecordingCompactor()
    # tail: 22 // 2 − 1 (head) − 1 (summary event) = 9 events → starts on r5 (call forgotten) → from call 6
    tail = list(range(14, len(s)))
    budget = 2 * s.tokens_of(tail)
    out = OpenHandsSummary(compactor=comp).render(s, budget)
    # head = the system prompt: the summary event comes right after it, then the (current) task
    assert rendered(out) == [0, None, 1, *tail]
    assert out.messages[1]["content"].startswith(oh.SUMMARY_LABEL + "\n")
    (text, cap, instructions), = comp.calls
    assert "result 0" in text and "result 5" in text and "result 6" not in text
    assert instructions == oh.SUMMARY_PROMPT and out.usage == comp.usages[0]
    assert cap == int(0.5 * budget) - s.counter.text(oh.SUMMARY_LABEL + "\n") - 4
    check(s, out, budget)
    # keep_first 4 (system, task, call 0, result 0): the summary follows the head
    out = OpenHandsSummary(compactor=RecordingCompactor(), keep_first=4).render(s, budget)
    assert rendered(out)[:5] == [0, 1, 2, 3, None]
    check(s, out, budget)


def test_openhands_summary_folds_the_previous_summary_in_and_truncates_long_events():
    t, r = calls(10)
    t.messages[5]["content"] = "ORDER-77 " + "x" * 12_000  # result 1, longer than max_event_length
    s = t.session()
    comp = RecordingCompactor()
    policy = OpenHandsSummary(compactor=comp)
    budget = 900
    policy.render(s, budget)
    assert "[... truncated ...]" in comp.calls[0][0] and len(comp.calls[0][0]) < 12_000
    for i in range(6):
        t.call(text_of(f"later {i}", 40))
    s.sync(t.messages)
    out = policy.render(s, budget)
    assert len(comp.calls) >= 2 and "[Summary so far]" in comp.calls[1][0]
    check(s, out, budget)


# -- opencode / Codex tail compaction ---------------------------------------------------------------------


def test_tail_compaction_summarises_the_head_and_keeps_the_newest_units_after_the_summary():
    t, r = calls(8)
    t.messages[3]["content"] = "ORDER-9 " + "y" * 3000  # r0: longer than opencode's 2,000-character cut
    s = t.session()
    comp = RecordingCompactor()
    unit = s.ntok(len(s) - 2) + s.ntok(len(s) - 1)
    # tail budget 0.25·B (no clamp): exactly the last two units
    policy = TailCompaction(compactor=comp, tail_share=0.25, tail_min_tokens=0, tail_max_tokens=10**9,
                            scale_to_budget=False)
    budget = 8 * unit + 3
    assert policy.tail_budget(budget) // unit == 2 and full_tokens(s) > budget
    out = policy.render(s, budget)
    tail = list(range(len(s) - 4, len(s)))
    assert rendered(out) == [0, 1, None, *tail]  # system, task (current), summary, then the tail
    assert out.messages[2]["content"].startswith(tc.SUMMARY_LABEL + "\n")
    (text, _, instructions), = comp.calls
    assert instructions == tc.SUMMARY_PROMPT and "result 5" in text and "result 6" not in text
    assert ("ORDER-9 " + "y" * 3000)[:2000] + "\n[truncated]" in text and "y" * 2000 not in text
    check(s, out, budget)


def test_tail_compaction_codex_keeps_recent_user_messages_then_the_summary():
    t = _two_users()
    s = t.session()
    cur = Scope.of(s).current
    comp = RecordingCompactor()
    budget = 250
    assert full_tokens(s) > budget and s.ntok(1) + s.ntok(6) <= 25
    out = TailCompaction(compactor=comp, codex=True).render(s, budget)
    # the newest history user messages within 0.1·B (25 tokens): both; the current one (outside B);
    # then the summary of everything else
    assert rendered(out) == [0, 1, 6, cur, None]
    assert out.messages[-1]["content"].startswith(tc.SUMMARY_LABEL + "\n")
    assert out.visible == frozenset()
    check(s, out, budget)


# -- the shared fallback -----------------------------------------------------------------------------------


def test_the_fallback_ends_with_the_verbatim_overflow_rule_and_never_exceeds_b():
    t = Transcript(task="Fix the failing build.")
    for i in range(8):
        t.say(text_of(f"reasoning {i}", 120))
        t.call(text_of(f"result {i}", 40))
    s = t.session()
    for policy in (SweLastN(), OpenHandsMasking(), ClearToolUses(), InspectEdit(), OpencodePrune()):
        budget = 400  # the assistant messages alone exceed B
        out = policy.render(s, budget)
        assert out.messages[1]["content"] == "Fix the failing build."  # the task message is never dropped
        assert len(out.messages) < len(s) and out.visible == frozenset()
        check(s, out, budget)


def test_enforce_budget_uses_the_peer_placeholder_then_drops_the_summary_if_nothing_else_fits():
    t, r = calls(4)
    s = t.session()
    scope = Scope.of(s)
    summary = {"role": "user", "content": "[S]\n" + "z " * 50}
    ins = Inserted(-1, summary, s.counter.message(summary))
    budget = layout_tokens(s, scope.history, {x: marker_text(s, x) for x in r[:2]}) + ins.tokens
    shown, bodies, kept = enforce_budget(s, scope, budget, scope.history, {}, ins, lambda _s, _x: "[gone]")
    assert kept is ins and bodies == {r[0]: "[gone]", r[1]: "[gone]"}
    shown, bodies, kept = enforce_budget(s, scope, 30, scope.history, {}, ins, lambda _s, _x: "[gone]")
    assert kept is None and layout_tokens(s, shown, bodies) <= 30


def test_peers_keep_parallel_calls_paired():
    t, r = calls(3)
    multi_call(t, [text_of("a", 60), text_of("b", 60), text_of("c", 60)])
    t.call(text_of("last", 30))
    s = t.session()
    for name in PEERS:
        for budget in (120, 250, 500):
            out = build_policy(method_config(name)).render(s, budget)
            check(s, out, budget)
            json.dumps(out.messages)
