"""contextrender.analysis.peers builds the peer table and figure from hand-made records and replay outputs.

Group (oracle, bfcl_multi_turn_long_context, B=2000), tasks a, b, every Full run above B:

    method             task  input  cached  task_acc  measures
    full               a,b   1M     0.5M    1, 1      -
    contextrender      a     0.5M   0       1         10 calls, 1 re-read, prefix 3.0/4 inv., 300/400 tok, ids 1/2
    contextrender      b     0.5M   0       0         10 calls, 0 re-reads, prefix 2.0/4 inv., 100/400 tok
    openhands_masking  a     0.8M   0       0         4 calls, 2 re-reads
    openhands_masking  b     0.8M   0       0         (schema 3: no measures)

ρ = 0.5 (Full's) → 1.25 USD per M input for every method: Full 1.25 per task; CR 0.5·1.25 = 0.625,
normalised 0.5; masking 0.8·1.25 = 1.0, normalised 0.8. Run measures pooled: CR re-reads 1 of 20 calls →
5 per 100, 0.5 per episode; prefix retention 100·5/8 = 62.5 %, token-weighted 100·400/800 = 50 %;
id survival 50 %. Masking's old record carries no measures: pooled over the one that does (2 of 4
calls → 50 per 100), never counted as zero.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from contextrender.analysis import peers
from contextrender.experiments.evaluation.measures import MeasureStats

M = 1_000_000
BFCL, TAU = "bfcl_multi_turn_long_context", "tau2_retail"


def rec(method: str, task: str, inp: int, cached: int = 0, *, score: float = 1.0, bench: str = BFCL,
        metric: str = "task_acc", measures: MeasureStats | None = None) -> dict:
    zero = {"input": 0, "output": 0, "cached": 0, "embedding": 0, "calls": 0}
    r = {"key": f"oracle|{bench}|{task}|{method}|2000|h", "model": "oracle", "benchmark": bench, "task": task,
         "method": method, "budget": 2000, "status": "ok", "score": {metric: score}, "metric": metric,
         "usage": {"agent": {"input": inp, "output": 0, "cached": cached, "embedding": 0, "calls": 3},
                   "compactor": dict(zero), "embeddings": dict(zero)},
         "cost_upper_usd": 0.0, "exceeded_budget": method == "full", "invocations": 5, "renders": [],
         "schema_version": 4 if measures is not None else 3}
    if measures is not None:
        r["measures"] = measures.to_dict()
    return r


def records() -> list[dict]:
    cr_a = MeasureStats(episodes=1, renders=5, id_uses_by_age={"le3": 2, "4_10": 0, "11_25": 0, "gt25": 0},
                        id_survived_by_age={"le3": 1, "4_10": 0, "11_25": 0, "gt25": 0}, tool_calls=10,
                        repeat_calls=1, rereads=1, prefix_invocations=4, prefix_share_sum=3.0, prefix_tokens=300,
                        prefix_input_tokens=400)
    cr_b = MeasureStats(episodes=1, renders=5, tool_calls=10, prefix_invocations=4, prefix_share_sum=2.0,
                        prefix_tokens=100, prefix_input_tokens=400)
    return [rec("full", "a", M, M // 2), rec("full", "b", M, M // 2),
            rec("contextrender", "a", M // 2, measures=cr_a), rec("contextrender", "b", M // 2, score=0.0, measures=cr_b),
            rec("openhands_masking", "a", 8 * M // 10, score=0.0,
                measures=MeasureStats(episodes=1, renders=5, tool_calls=4, repeat_calls=2, rereads=2)),
            rec("openhands_masking", "b", 8 * M // 10, score=0.0),  # written before schema 4
            rec("full", "x", M, 0, bench=TAU, metric="pass"), rec("contextrender", "x", M, 0, bench=TAU, metric="pass")]


def replay_output(bench: str | None, methods: dict[str, tuple[float, MeasureStats]]) -> dict:
    """What the replay writes (recall, recall by age, measures per method), naming its benchmark."""
    out = {"budget": 2000, "traces": 2, "events": 4, "events_by_age": {"le3": 3, "4_10": 1, "11_25": 0, "gt25": 0},
           "skipped_lines": 0,
           "methods": {m: {"recall": r, "recall_by_age": {"le3": r, "4_10": 0.0, "11_25": None, "gt25": None},
                           "measures": s.summary()} for m, (r, s) in methods.items()}}
    if bench is not None:
        out["benchmark"] = {"name": bench, "from": "argument"}
    return out


def write(root: Path, recs: list[dict], replays: list[dict]) -> tuple[Path, list[Path]]:
    (root / "runs" / "records").mkdir(parents=True)
    for r in recs:
        with open(root / "runs" / "records" / f"oracle__{r['benchmark']}__{r['method']}__B2000.jsonl", "a") as f:
            f.write(json.dumps(r) + "\n")
    paths = []
    for i, rep in enumerate(replays):
        paths.append(root / f"replay{i}.json")
        paths[-1].write_text(json.dumps(rep))
    return root / "runs", paths


def replays() -> list[dict]:
    surv = MeasureStats(episodes=2, id_uses_by_age={"le3": 4, "4_10": 0, "11_25": 0, "gt25": 0},
                        id_survived_by_age={"le3": 3, "4_10": 0, "11_25": 0, "gt25": 0}, tool_calls=8, rereads=2,
                        repeat_calls=2, prefix_invocations=2, prefix_share_sum=1.5)
    full = MeasureStats(episodes=2, id_uses_by_age={"le3": 4, "4_10": 0, "11_25": 0, "gt25": 0},
                        id_survived_by_age={"le3": 4, "4_10": 0, "11_25": 0, "gt25": 0}, tool_calls=8,
                        repeat_calls=2, prefix_invocations=2, prefix_share_sum=2.0)
    return [replay_output(BFCL, {"full": (100.0, full), "contextrender": (75.0, surv), "openhands_masking": (50.0, surv)}),
            replay_output(TAU, {"full": (100.0, full), "contextrender": (100.0, full)})]


def test_the_peer_table_and_figure_from_hand_made_records(tmp_path):
    runs, reps = write(tmp_path, records(), replays())
    paths, frame = peers.make_peers([runs], tmp_path / "out", reps)
    assert {p.name for p in paths} == {"table_peers.md", "table_peers.csv", "table_peers.tex", "fig_peers.png",
                                       "fig_peers.pdf"}
    for p in paths:
        assert p.stat().st_size > 500
    assert (tmp_path / "out" / "fig_peers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "out" / "fig_peers.pdf").read_bytes()[:5] == b"%PDF-"

    csv = pd.read_csv(tmp_path / "out" / "table_peers.csv")
    assert list(zip(csv["benchmark"], csv["method"], strict=True)) == [
        (BFCL, "full"), (BFCL, "contextrender"), (BFCL, "openhands_masking"), (TAU, "full"), (TAU, "contextrender")]
    by = {(r.benchmark, r.method): r for r in csv.itertuples()}
    cr, mask, full = by[(BFCL, "contextrender")], by[(BFCL, "openhands_masking")], by[(BFCL, "full")]
    assert (cr.label, cr.kind, mask.label, mask.kind, full.kind) == (
        "ContextRender (ours)", "ours", "OpenHands masking", "peer", "baseline")
    assert (cr.perf, cr.normalised_cost, mask.perf, mask.normalised_cost) == pytest.approx((50.0, 0.5, 0.0, 0.8))
    # recall and the replay measures come from the replay of this benchmark
    assert (cr.recall, cr.recall_le3, cr.replay_identifier_survival, cr.replay_rereads_per_100_calls,
            cr.replay_prefix_retention) == pytest.approx((75.0, 75.0, 75.0, 25.0, 75.0))
    assert pd.isna(cr.recall_11_25)
    assert (full.replay_identifier_survival, full.replay_rereads) == (100.0, 0)
    # the run measures pool the records' counts
    assert (cr.run_rereads, cr.run_rereads_per_episode, cr.run_rereads_per_100_calls, cr.run_prefix_retention,
            cr.run_prefix_retention_tokens, cr.run_identifier_survival, cr.run_measured) == pytest.approx(
        (1, 0.5, 5.0, 62.5, 50.0, 50.0, 2))
    # an old record has no measures: unknown, not zero
    assert (mask.run_measured, mask.run_tool_calls, mask.run_rereads_per_100_calls) == (1, 4, 50.0)
    assert pd.isna(full.run_rereads_per_100_calls)  # Full records without measures at all
    tau = by[(TAU, "contextrender")]
    assert (tau.recall, tau.replay_identifier_survival) == (100.0, 100.0)

    md = (tmp_path / "out" / "table_peers.md").read_text()
    assert "| oracle† | bfcl_multi_turn_long_context | 2000 | ContextRender (ours) | 2 | 50.0 | 0.500 | – | – | 75.0 |" in md
    assert "OpenHands masking" in md and "id survival" in md and "prefix ret. (run)" in md
    assert "tau2_retail: pass" in md and "a value only a summary kept counts here and not for recall" in md
    tex = (tmp_path / "out" / "table_peers.tex").read_text()
    assert r"\begin{tabular}" in tex and "ContextRender (ours)" in tex


def test_replays_are_matched_to_their_benchmark():
    groups = [("oracle", BFCL, 2000), ("oracle", TAU, 2000)]
    tau, bfcl = replay_output(TAU, {}), replay_output(BFCL, {})
    assert peers.match_replays([tau, bfcl], groups) == {groups[0]: bfcl, groups[1]: tau}
    # a replay naming no benchmark goes to the only group at its budget; with two it is ambiguous
    nameless = replay_output(None, {})
    assert peers.match_replays([nameless], groups[:1]) == {groups[0]: nameless}
    with pytest.raises(SystemExit, match="names no benchmark"):
        peers.match_replays([nameless], groups)
    with pytest.raises(SystemExit, match="two replay outputs"):
        peers.match_replays([bfcl, bfcl], groups)


def test_replay_methods_without_runs_still_get_a_row(tmp_path):
    runs, reps = write(tmp_path, [r for r in records() if r["benchmark"] == BFCL and r["method"] == "full"],
                       replays()[:1])
    _, frame = peers.make_peers([runs], tmp_path / "out", reps)
    assert list(frame["method"]) == ["full", "contextrender", "openhands_masking"]
    assert frame.loc[1, "recall"] == 75.0 and pd.isna(frame.loc[1, "perf"])
