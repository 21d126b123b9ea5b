"""ResultScore explanations: the similarity penalty D(r,S) and the reason behind every decision (docs/method.md §5)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from contextrender import ContextGraph, ContextRender, HashingEmbedder
from contextrender.render import Scope, fit_verbatim
from contextrender.selector import Profile

from ._helpers import Transcript, filler, result_seq

REPO = Path(__file__).resolve().parents[2]


def _lost_to_similarity():
    """A reused result that nearly duplicates an already picked one loses to unrelated filler."""
    t = Transcript(task="Pay the invoices.", system=None)
    twin = "invoice ledger entry alpha bravo charlie delta echo foxtrot golf hotel " * 6
    reused = t.call("read", {"p": 1}, twin + " INV_REF_7741")
    t.call("note", {"x": 2}, filler("other_filler", 60))
    t.call("read", {"p": 3}, twin + " INV_REF_9999")  # the newest: picked first on recency
    t.call("pay", {"ref": "INV_REF_7741"}, "ok")  # reuses the first result's value
    return t.into(), reused


def test_reused_result_lost_to_filler_through_the_similarity_penalty():
    s, reused_call = _lost_to_similarity()
    cr = ContextRender(embedder=HashingEmbedder(dim=256))
    r1, _, r3, r4 = (r.seq for r in s.results)
    d = {r.seq: r.ntok - r.marker_ntok for r in s.results}
    # Room for the two newest and one of the others: the reused one and the filler compete at step 2.
    budget = fit_verbatim(s, Scope.of(s), 10 ** 6).base_tokens + d[r3] + d[r4] + d[r1]
    sel = cr.select(s, budget)
    assert not sel.shortcut
    by_seq = {sc.seq: sc for sc in sel.scores}
    reused = by_seq[result_seq(s, reused_call)]
    assert reused.reuse_count > 0 and reused.pick is None
    assert reused.reason.startswith("outscored by ") and reused.lost_to is not None
    winner = by_seq[reused.lost_to]
    assert winner.pick is not None and winner.usefulness < reused.usefulness  # lower U, yet it won ...
    assert reused.similarity is not None and reused.similarity > 0.5  # ... because of 0.5·D(r,S)
    assert reused.usefulness - 0.5 * reused.similarity <= winner.gain + 1e-12
    assert reused.form == "omitted"


def test_every_score_is_consistent_with_the_greedy():
    t = Transcript(task="Audit the system.")
    for i in range(14):
        t.call("read", {"i": i}, f"REC_{i:03d}_X " + filler(f"part{i}", 30 + 7 * (i % 5)))
        if i % 4 == 3:
            t.say(" ".join(["long", "thinking"] * 80))  # verbatim prose that the trim will drop
    t.call("dump", {"all": True}, "BIG_DUMP_1 " + filler("big", 900))  # larger than any room left
    small, _ = _lost_to_similarity()
    seen: set[str] = set()
    for s, budget in [(t.into(), b) for b in (300, 700, 1500, 2500)] + [(small, 290)]:
        sel = ContextRender(embedder=HashingEmbedder(dim=64)).select(s, budget)
        picks = sorted((sc.pick, sc) for sc in sel.scores if sc.pick is not None)
        for k, (pick, sc) in enumerate(picks):
            assert pick == k and sc.reason == "picked" and sc.form in ("full", "compacted")
            assert abs(sc.gain - (sc.usefulness - 0.5 * sc.similarity)) < 1e-9  # R = U − 0.5·D
        if picks:
            assert picks[0][1].similarity == 0.0  # D(r, ∅) = 0
        for sc in sel.scores:
            if not sc.candidate:
                assert (sc.reason, sc.form, sc.similarity) == ("not a candidate", "not rendered", None)
            elif sc.pick is None and sc.reason == "did not fit":
                assert sc.similarity is None and sc.lost_to is None
            elif sc.pick is None:
                w = next(x for x in sel.scores if x.seq == sc.lost_to)
                r = sc.usefulness - 0.5 * sc.similarity
                assert r < w.gain or (r == w.gain and w.seq < sc.seq)  # ties go to the older result
        seen |= {sc.reason.split(" ")[0] for sc in sel.scores}
    assert seen == {"picked", "not", "did", "outscored"}  # every kind of reason occurred


def test_profile_hook_times_phases_without_changing_the_render():
    s, _ = _lost_to_similarity()
    cr = ContextRender(embedder=HashingEmbedder(dim=64))
    cr.select(s, 290)  # embeds the results once (docs/method.md §2); both timed calls below then cost the same
    prof = Profile()
    a = cr.select(s, 290, explain=False, profile=prof)
    b = cr.select(s, 290, explain=False)
    assert not a.shortcut
    assert a.rendered == b.rendered
    assert {"score", "trim", "usefulness", "choose", "bodies", "finish", "assemble"} <= set(prof.spans)
    assert all(v >= 0 for v in prof.spans.values())
    assert prof.spans["trim"] <= prof.spans["score"] and prof.spans["assemble"] <= prof.spans["finish"]


def test_explain_cli_reads_a_copy_of_a_locked_graph(tmp_path):
    from contextrender.service.server import ContextService

    path = tmp_path / "g.sqlite"
    s, _ = _lost_to_similarity()
    svc = ContextService(str(path), embedder=HashingEmbedder(dim=64))  # a running service holds the file
    try:
        svc.sync("inv", s.openai_messages())
        before = hashlib.sha256(path.read_bytes()).hexdigest()
        proc = subprocess.run([sys.executable, "-m", "contextrender.cli", "explain", "inv", "--graph", str(path),
                               "--budget", "290", "--embedding", "hashing", "--method", "contextrender",
                               "--compare", "prune"],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        assert "outscored by" in out and "picked" in out and "prune" in out.lower()
        rows = [ln for ln in out.splitlines() if ln[:4].strip().isdigit()]
        assert len(rows) == len(s.results)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # nothing written to the live file
        bad = subprocess.run([sys.executable, "-m", "contextrender.cli", "explain", "nope", "--graph", str(path),
                              "--budget", "400", "--embedding", "hashing"], capture_output=True, text=True,
                             cwd=REPO, timeout=120)
        assert bad.returncode == 2 and "no session 'nope'" in bad.stderr
    finally:
        svc.close()


def test_snapshot_is_an_independent_copy(tmp_path):
    path = tmp_path / "g.sqlite"
    with ContextGraph(path) as g:
        g.session("a").sync([{"role": "user", "content": "hi"}])
    snap = ContextGraph.snapshot(path)
    snap.session("a").add({"role": "assistant", "content": "written to the copy only"})
    snap.close()
    with ContextGraph(path) as g:
        assert len(g.session("a")) == 1


def test_explain_cli_reports_call_readiness_beside_the_table(tmp_path, capsys):
    """explain replays the session's recorded calls under the method and each compared one: the dinner bill's
    Venmo login needs a password only an early tool result held; Prune's render hid it, ContextRender's did not."""
    from contextrender.cli import main
    from contextrender.experiments.fixtures.scenarios import DINNER_BILL_BUDGET, dinner_bill

    path = tmp_path / "g.sqlite"
    with ContextGraph(path) as g:
        g.session("dinner").sync(dinner_bill())
    assert main(["explain", "dinner", "--graph", str(path), "--budget", str(DINNER_BILL_BUDGET),
                 "--embedding", "hashing", "--method", "contextrender", "--compare", "prune"]) == 0
    out = capsys.readouterr().out
    cr = next(ln for ln in out.splitlines() if ln.startswith("call readiness under contextrender "))
    pr = next(ln for ln in out.splitlines() if ln.startswith("call readiness under prune "))
    assert "100.0 %" in cr and "100.0 %" not in pr
    assert "venmo__login: hidden Jf1#vS6kDm" in out.split(pr, 1)[1]


def test_explain_names_each_form_whole_and_needs_no_embedder_without_tool_results(tmp_path, capsys):
    """A compared selector's ids form is labelled with its values kept (not "omitted"), a peer's placeholder as
    omitted; tool names are not cut; a session without tool results loads and names no embedder."""
    from contextrender.cli import main
    from contextrender.experiments.fixtures.scenarios import DINNER_BILL_BUDGET, dinner_bill

    path = tmp_path / "g.sqlite"
    with ContextGraph(path) as g:
        g.session("dinner").sync(dinner_bill())
        g.session("chat").sync([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}])
    assert main(["explain", "dinner", "--graph", str(path), "--budget", str(DINNER_BILL_BUDGET // 2),
                 "--embedding", "hashing", "--compare", "contextrender_plus,prune"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln[:4].strip().isdigit()]
    head = next(ln for ln in out.splitlines() if ln.lstrip().startswith("seq "))
    assert "contextrender_plus" in head  # the method's name whole
    plus_col = head.index("contextrender_plus")
    plus_forms = {ln[plus_col:].split("  ")[0].strip() for ln in rows}
    assert plus_forms <= {"full", "omitted", "compacted", "stub", "ids (values)", "table (values)", "not rendered"}
    assert "kept" not in plus_forms and len(plus_forms) > 1, plus_forms
    with ContextGraph(path) as g:
        names = {r.tool_name for r in g.session("dinner").results}
    assert all(any(n in ln for ln in rows) for n in names)
    assert main(["explain", "chat", "--graph", str(path), "--budget", "100"]) == 0
    captured = capsys.readouterr()
    assert "embedder none needed (the session has no tool results)" in captured.err
    assert "all-MiniLM" not in captured.err


def test_form_in_reads_a_peer_render():
    from contextrender.explain import form_in
    from contextrender.render import Rendered

    msgs = ({"role": "user", "content": "q"}, {"role": "tool", "content": "[omitted]"},
            {"role": "tool", "content": "rows: id=7 total=12"}, {"role": "tool", "content": "(Tool result removed)"})
    r = Rendered(msgs, 10, frozenset({9}), sources=(0, 1, 2, 3))
    assert [form_in(r, s) for s in (1, 2, 3, 9, 5)] == ["omitted", "shortened", "omitted", "full", "not rendered"]


def test_a_result_shown_as_ids_is_said_to_be_left_out_whole_not_dropped(tmp_path, capsys):
    """Under the plus, a result shown by its ids was not dropped: its reason says it was left out *whole*."""
    from contextrender.cli import main
    from contextrender.experiments.fixtures.scenarios import DINNER_BILL_BUDGET, dinner_bill

    path = tmp_path / "g.sqlite"
    with ContextGraph(path) as g:
        g.session("dinner").sync(dinner_bill())
    assert main(["explain", "dinner", "--graph", str(path), "--budget", str(DINNER_BILL_BUDGET // 2),
                 "--embedding", "hashing", "--method", "contextrender_plus"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln[:4].strip().isdigit()]
    shown_by_values = [ln for ln in rows if "(values)" in ln]
    assert shown_by_values, rows
    assert all(("did not fit whole" in ln or "outscored whole by" in ln) for ln in shown_by_values), shown_by_values
    assert not any("whole" in ln for ln in rows if "(values)" not in ln)  # an omitted result: the plain reason
