"""ContextRender selection and budget accounting (docs/method.md §5, Algorithm 1)."""

from __future__ import annotations

import numpy as np
import pytest

from contextrender import ContextGraph, ContextRender, ExtractiveCompactor, HashingEmbedder, TokenCounter, Weights
from contextrender.graph import OMISSION_MARKER
from contextrender.render import fit_verbatim

from ._helpers import Transcript, filler, history_recount, pairing_errors, result_seq
from .test_tfa import CONTACTS

COUNTER = TokenCounter()
RECENCY = Weights(recency=1.0, relevance=0.0, reuse=0.0)


def _marker_history(session):
    """The assembled history with every result as its marker (what is charged before any pick)."""
    out = []
    for m in session.openai_messages():
        if m["role"] == "tool":
            m = {**m, "content": OMISSION_MARKER}
        out.append(m)
    return out


def _check_render(session, rendered, budget):
    assert rendered.tokens <= budget
    assert history_recount(COUNTER, rendered.messages) == rendered.tokens
    assert rendered.visible <= {r.seq for r in session.results}
    assert pairing_errors(rendered.messages) == []


def _rendered_tool(rendered, call_id):
    return next(m for m in rendered.messages if m["role"] == "tool" and m["tool_call_id"] == call_id)


# ---------------------------------------------------------------------------------------------
# Step 2: full-history shortcut
# ---------------------------------------------------------------------------------------------


def test_full_history_shortcut_returns_history_unchanged(hashing_embedder):
    t = Transcript(task="Summarise the logs.")
    t.call("read_log", {"path": "/var/log/app.log"}, "error_code_17 at boot\n" + filler("boot_seq_1"))
    t.user("And the second one?")
    t.call("read_log", {"path": "/var/log/db.log"}, filler("db_ready_2"), content="Reading it.")
    s = t.into()
    full = history_recount(COUNTER, s.openai_messages())
    for budget in (full, full + 1, 10 * full):
        sel = ContextRender(embedder=hashing_embedder).select(s, budget)
        assert sel.shortcut
        assert list(sel.rendered.messages) == s.openai_messages()
        assert sel.rendered.visible == frozenset(r.seq for r in s.results)
        assert sel.rendered.tokens == full
    sel = ContextRender(embedder=hashing_embedder).select(s, full - 1)
    assert not sel.shortcut
    _check_render(s, sel.rendered, full - 1)


# ---------------------------------------------------------------------------------------------
# Step 4: greedy selection
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("swap", [False, True])
def test_ties_go_to_the_older_result(swap, hashing_embedder):
    a, b = filler("res_one_1", 100), filler("res_two_2", 100)
    if swap:
        a, b = b, a
    t = Transcript()
    t.call("warmup", {}, filler("warm_up_0", 100))
    ids = t.turn(("get", {"k": 1}, a), ("get", {"k": 2}, b))  # same invocation: same age, same U
    s = t.into()
    first, second = (result_seq(s, i) for i in ids)
    assert s.result(first).ntok == s.result(second).ntok
    base = COUNTER.messages(_marker_history(s)[2:])  # history: after system + current user
    budget = base + s.result(first).ntok - s.result(first).marker_ntok  # room for exactly one
    sel = ContextRender(weights=RECENCY, embedder=hashing_embedder).select(s, budget)
    by = {r.seq: r for r in sel.scores}
    assert by[first].usefulness == by[second].usefulness
    assert sel.rendered.visible == {first}  # the older warm-up result has lower U and no room is left
    _check_render(s, sel.rendered, budget)


def test_feasibility_is_measured_on_the_assembled_history_including_markers(hashing_embedder):
    t = Transcript()
    for k in range(6):
        t.call("small", {"k": k}, filler(f"small_{k}", 40))
    big = t.call("big", {}, filler("big_result_1", 300))  # newest: highest U
    s = t.into()
    seq = result_seq(s, big)
    base = COUNTER.messages(_marker_history(s)[2:])
    delta = s.result(seq).ntok - s.result(seq).marker_ntok
    # Exactly enough room on the assembled history: selected (≤ B, not < B).
    sel = ContextRender(weights=RECENCY, embedder=hashing_embedder).select(s, base + delta)
    assert seq in sel.rendered.visible and sel.rendered.tokens == base + delta
    # One token less: infeasible, skipped — but smaller, older results still fit and are taken.
    budget = base + delta - 1
    verbatim_only = COUNTER.messages([m for m in s.openai_messages()[2:] if m["role"] != "tool"])
    assert verbatim_only + s.result(seq).ntok <= budget  # "result alone" accounting would wrongly admit it
    sel = ContextRender(weights=RECENCY, embedder=hashing_embedder).select(s, budget)
    assert seq not in sel.rendered.visible
    assert len(sel.rendered.visible) >= 2
    _check_render(s, sel.rendered, budget)


def test_infeasible_high_score_result_skipped_while_smaller_ones_fit(hashing_embedder):
    t = Transcript()
    smalls = [t.call("small", {"k": k}, filler(f"small_{k}", 30)) for k in range(3)]
    big = t.call("big", {}, filler("big_result_1", 600))
    s = t.into()
    budget = COUNTER.messages(_marker_history(s)[2:]) + 200
    sel = ContextRender(weights=RECENCY, embedder=hashing_embedder).select(s, budget)
    by = {r.seq: r for r in sel.scores}
    assert by[result_seq(s, big)].usefulness == max(r.usefulness for r in sel.scores)
    assert result_seq(s, big) not in sel.rendered.visible
    assert sel.rendered.visible == {result_seq(s, c) for c in smalls}
    _check_render(s, sel.rendered, budget)


def test_diversity_penalty_changes_the_choice():
    emb = HashingEmbedder(dim=256)
    t = Transcript()
    c = t.call("weather", {}, " ".join(["sunny warm breeze coast forecast"] * 20))
    b = t.call("stocks", {}, " ".join(["market shares index trading volume"] * 20) + " ticker_b")
    a = t.call("stocks", {}, " ".join(["market shares index trading volume"] * 20) + " ticker_a")
    s = t.into()
    sa, sb, sc = (result_seq(s, x) for x in (a, b, c))
    embs, _ = s.result_embeddings(emb, [sa, sb, sc])
    assert float(embs[0] @ embs[1]) > 0.9 and float(embs[0] @ embs[2]) < 0.2  # preconditions
    sizes = {s.result(x).ntok - s.result(x).marker_ntok for x in (sa, sb, sc)}
    base = COUNTER.messages(_marker_history(s)[2:])
    budget = base + 2 * max(sizes) + min(sizes) - 1  # room for two results, not three
    without = ContextRender(weights=RECENCY, diversity=0.0, embedder=emb).select(s, budget)
    assert without.rendered.visible == {sa, sb}
    with_pen = ContextRender(weights=RECENCY, embedder=emb).select(s, budget)
    assert with_pen.rendered.visible == {sa, sc}
    gains = {r.seq: r.gain for r in with_pen.scores}
    u = {r.seq: r.usefulness for r in with_pen.scores}
    assert gains[sa] == pytest.approx(u[sa])  # D(r, ∅) = 0
    assert gains[sc] == pytest.approx(u[sc] - 0.5 * max(0.0, float(embs[0] @ embs[2])), abs=1e-6)


# ---------------------------------------------------------------------------------------------
# Step 6: output, markers, verbatim messages
# ---------------------------------------------------------------------------------------------


def _mixed_session():
    t = Transcript(task="Prepare the quarterly report for region_eu_1.")
    for k in range(5):
        t.call("fetch", {"part": k}, filler(f"part_{k}_data", 150), content=f"Fetching part {k}.")
    t.user("Also include region_us_2.")
    for k in range(5, 8):
        t.call("fetch", {"part": k}, filler(f"part_{k}_data", 150))
    t.say("Done collecting.")
    return t.into()


@pytest.mark.parametrize("weights", [None, RECENCY])
def test_output_chronological_verbatim_and_markers_charged(weights, hashing_embedder):
    s = _mixed_session()
    budget = COUNTER.messages(_marker_history(s)[2:]) + 400
    sel = ContextRender(weights=weights, embedder=hashing_embedder).select(s, budget)
    r = sel.rendered
    assert all(sc.candidate for sc in sel.scores)
    original = s.openai_messages()
    assert len(r.messages) == len(original)  # nothing dropped: order is the transcript's
    omitted = 0
    for seq, (got, orig) in enumerate(zip(r.messages, original, strict=True)):
        if orig["role"] != "tool":
            assert got == orig  # user/assistant/system verbatim, tool calls included
        elif seq in r.visible:
            assert got == orig
        else:
            assert got == {**orig, "content": OMISSION_MARKER}
            # the marker repeats nothing: the kept assistant message still carries the call
            call = next(m for m in r.messages[:seq][::-1] if m["role"] == "assistant")
            assert s.result(seq).call_id in {c["id"] for c in call["tool_calls"]}
            omitted += 1
    assert omitted > 0 and r.visible
    # The markers are charged to B: the reported count includes them.
    assert r.tokens == history_recount(COUNTER, r.messages)
    assert r.tokens == history_recount(COUNTER, _marker_history(s)) + sum(
        s.result(v).ntok - s.result(v).marker_ntok for v in r.visible)
    _check_render(s, r, budget)


def _long_conversation(first_user="Plan my week.", turns=12):
    t = Transcript(task=first_user)
    for k in range(turns):
        t.user(f"Follow-up {k}: " + "please consider the following constraints carefully " * 8)
        t.call("calendar", {"day": k}, filler(f"day_{k}_events", 40),
               content=f"Step {k}: " + "I am reasoning about the schedule in detail " * 8)
    t.user("Final question: what is free on Friday?")
    return t


def test_verbatim_overflow_trims_oldest_turns_but_keeps_first_user_message(hashing_embedder):
    t = _long_conversation()
    s = t.into()
    verbatim = COUNTER.messages([m for m in s.openai_messages()[1:-1] if m["role"] in ("user", "assistant")])
    budget = verbatim // 3
    sel = ContextRender(embedder=hashing_embedder).select(s, budget)
    r = sel.rendered
    _check_render(s, r, budget)
    msgs = list(r.messages)
    assert msgs[0] == s.openai_messages()[0]  # system prompt (outside B)
    assert msgs[1] == {"role": "user", "content": "Plan my week."}  # first user message never trimmed
    assert msgs[-1] == s.openai_messages()[-1]  # current user message
    all_asst = [m for m in s.openai_messages() if m["role"] == "assistant"]
    kept_asst = [m for m in msgs if m["role"] == "assistant"]
    assert 0 < len(kept_asst) < len(all_asst)
    assert kept_asst == all_asst[len(all_asst) - len(kept_asst):]  # the oldest ones went first
    assert any(not sc.candidate for sc in sel.scores)
    assert "never the first user message" in (fit_verbatim.__doc__ or "")


def test_verbatim_overflow_with_huge_first_user_message_still_fits(hashing_embedder):
    first = "Context for the whole task: " + "the budget constraint must hold always " * 200
    s = _long_conversation(first_user=first, turns=4).into()
    budget = 120
    sel = ContextRender(embedder=hashing_embedder).select(s, budget)
    _check_render(s, sel.rendered, budget)
    kept_first = sel.rendered.messages[1]
    assert kept_first["role"] == "user" and first.startswith(kept_first["content"]) and kept_first["content"]


# ---------------------------------------------------------------------------------------------
# Step 5: oversized-result fallback
# ---------------------------------------------------------------------------------------------


class CountingCompactor(ExtractiveCompactor):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def compact(self, text, max_tokens, *, instructions=None):
        self.calls += 1
        return super().compact(text, max_tokens, instructions=instructions)


def _oversized_session(graph=None, thinking=0):
    t = Transcript(task="Find the failing test.")
    lines = [f"case {i} passed ok" for i in range(600)]
    lines[123] = "test_case_0123 FAILED: AssertionError expected 4 got 5"
    big = t.call("run_tests", {"path": "tests/"}, "\n".join(lines))
    t.call("read", {"f": "conftest.py"}, filler("conftest_py", 40),
           content="Let me think. " + "The failure is in the assertion of the totals. " * thinking)
    return t.into(graph), big


def test_oversized_result_is_compacted_only_in_the_render(hashing_embedder):
    s, big = _oversized_session()
    seq = result_seq(s, big)
    original = s.message(seq).content
    budget = 1200
    assert s.result(seq).ntok > budget
    comp = CountingCompactor()
    policy = ContextRender(embedder=hashing_embedder, compactor=comp)
    sel = policy.select(s, budget)
    _check_render(s, sel.rendered, budget)
    body = _rendered_tool(sel.rendered, big)["content"]
    assert body != original and "test_case_0123 FAILED" in body
    assert COUNTER.text(body) <= int(0.25 * budget)
    assert seq not in sel.rendered.visible  # a compacted form is not visible in full
    assert next(r for r in sel.scores if r.seq == seq).compacted
    assert s.message(seq).content == original  # the original stays in the graph
    assert comp.calls == 1 and sel.rendered.usage.calls == 1

    again = policy.select(s, budget)
    assert comp.calls == 1 and again.rendered.usage.calls == 0  # cached: no second compactor call
    assert again.rendered.messages == sel.rendered.messages
    fresh = ContextRender(embedder=hashing_embedder, compactor=comp).select(s, budget)
    assert comp.calls == 1 and fresh.rendered.messages == sel.rendered.messages  # cached in the graph


def test_compacted_text_used_only_if_it_fits(hashing_embedder):
    s, big = _oversized_session(thinking=60)
    seq = result_seq(s, big)
    small = next(r for r in s.results if r.seq != seq)
    base = COUNTER.messages(_marker_history(s)[2:])
    budget = base + 60  # room for the small result, not for a compacted form of ~0.25·B tokens
    assert s.result(seq).ntok > budget and int(0.25 * budget) > 150
    assert small.ntok - small.marker_ntok <= 60
    comp = CountingCompactor()
    sel = ContextRender(embedder=hashing_embedder, compactor=comp).select(s, budget)
    _check_render(s, sel.rendered, budget)
    assert comp.calls == 1  # it was compacted, then found not to fit
    assert _rendered_tool(sel.rendered, big)["content"] == OMISSION_MARKER
    assert not next(r for r in sel.scores if r.seq == seq).compacted
    assert sel.rendered.visible == {small.seq}


def test_without_compactor_an_oversized_result_is_never_rendered(hashing_embedder):
    s, big = _oversized_session()
    sel = ContextRender(embedder=hashing_embedder).select(s, 1200)
    assert _rendered_tool(sel.rendered, big)["content"] == OMISSION_MARKER
    _check_render(s, sel.rendered, 1200)


# ---------------------------------------------------------------------------------------------
# The worked example (docs/method.md §3.1): reuse keeps Nancy's address in context at Turn 18
# ---------------------------------------------------------------------------------------------


def test_worked_example_reuse_keeps_nancy_in_context_at_turn_18(hashing_embedder):
    t = Transcript(task="Send my roommates the rent reminder.")
    ids = {}
    for k in range(18):
        if k == 8:
            ids[k] = t.call("search_contacts", {"relationship": "roommate"}, CONTACTS)
        elif k == 16:
            ids[k] = t.call("send_email", {"to": "troy_solo@gmail.com", "subject": "Rent"}, filler("sent_16", 100))
        else:
            ids[k] = t.call("read_note", {"n": k}, filler(f"note_{k:02d}", 100))
    s = t.into()
    assert s.next_invocation == 18
    contacts = result_seq(s, ids[8])
    deltas = {k: s.result(result_seq(s, i)).ntok - s.result(result_seq(s, i)).marker_ntok for k, i in ids.items()}
    df, dc = deltas[17], deltas[8]
    assert all(deltas[k] == df for k in deltas if k != 8) and abs(df - dc) < min(df, dc)
    budget = COUNTER.messages(_marker_history(s)[2:]) + 3 * df + max(df, dc)

    no_reuse = ContextRender(weights=RECENCY, diversity=0.0, embedder=hashing_embedder).select(s, budget)
    assert contacts not in no_reuse.rendered.visible
    assert {s.invocation_of(v) for v in no_reuse.rendered.visible} == {14, 15, 16, 17}

    reuse = ContextRender(weights=Weights(recency=1.0, relevance=0.0, reuse=1.0), diversity=0.0,
                          embedder=hashing_embedder).select(s, budget)
    assert contacts in reuse.rendered.visible
    assert {s.invocation_of(v) for v in reuse.rendered.visible} == {8, 15, 16, 17}
    assert "nancy.ritter@gmail.com" in _rendered_tool(reuse.rendered, ids[8])["content"]
    sc = next(r for r in reuse.scores if r.seq == contacts)
    assert sc.age == 10 and sc.reuse_count == pytest.approx(2.0)
    _check_render(s, reuse.rendered, budget)

    full = ContextRender(embedder=hashing_embedder).select(s, budget)
    rr = ContextRender(weights=Weights(1.0, 1.0, 0.0), embedder=hashing_embedder).select(s, budget)
    u_full = next(r for r in full.scores if r.seq == contacts).usefulness
    u_rr = next(r for r in rr.scores if r.seq == contacts).usefulness
    assert u_full - u_rr == pytest.approx(1 - np.exp(-0.4))


# ---------------------------------------------------------------------------------------------
# Determinism: a render depends on the session, not on what the policy object rendered before
# ---------------------------------------------------------------------------------------------


def _task_session(task, graph):
    t = Transcript(task=task)
    for k in range(4):
        body = ("apples bananas fruit orchard harvest " if k % 2 else "kernel compiler linker segfault ") * 60
        t.call("read", {"k": k}, body)
    return t.into(graph, sid="task-1")  # the same session id in two different graph files


def test_render_is_independent_of_sessions_rendered_before(tmp_path, hashing_embedder):
    s1 = _task_session("Fix the kernel compiler segfault.", ContextGraph(tmp_path / "a.sqlite"))
    s2 = _task_session("Harvest apples in the fruit orchard.", ContextGraph(tmp_path / "b.sqlite"))
    shared = ContextRender(embedder=hashing_embedder)
    shared.select(s1, 400)
    after = shared.select(s2, 400)
    fresh = ContextRender(embedder=hashing_embedder).select(s2, 400)
    assert [r.relevance for r in after.scores] == [r.relevance for r in fresh.scores]
    # Usage legitimately differs: the first render stored s2's result embeddings in the graph.
    assert (after.rendered.messages, after.rendered.tokens, after.rendered.visible) == (
        fresh.rendered.messages, fresh.rendered.tokens, fresh.rendered.visible)
