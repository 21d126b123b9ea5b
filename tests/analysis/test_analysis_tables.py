"""contextrender.analysis.tables on hand-made records: ρ, T, mean cost over T, ratio of means, Table 1, files, notes.

The numbers below are worked by hand. Group (gpt-4.1, appworld_test_normal, B=6000), tasks a, b, c:

    method         task  input  cached  exceeded  status      tgc
    full           a     2M     2M      yes       ok          1
    full           b     4M     0       yes       error       0
    full           c     2M     2M      no        ok          1
    contextrender  a     2M     2M      -         ok          1
    contextrender  b     1M     1M      -         ok          1
    contextrender  c     0.4M   0.4M    -         ok          1
    prune          a     1M     0       -         ok          1
    prune          b     3M     0       -         step_limit  0
    prune          c     1M     0       -         ok          0

ρ = cached/input over Full agent calls only = 4M/8M = 0.5 (ContextRender's
100 % cache hits must not count) → 2·0.5 + 0.5·0.5 = 1.25 USD per M input.
T = {a, b}. Mean cost over T: Full (2.5 + 5.0)/2 = 3.75; ContextRender
(2.5 + 1.25)/2 = 1.875; Prune (1.25 + 3.75)/2 = 2.5 (the step_limit failure
counts). Normalised: CR 1.875/3.75 = 0.5 (a mean of ratios would give
(1 + 0.25)/2 = 0.625); Prune 2.5/3.75 = 0.667. Performance: Full 66.7,
CR 100, Prune 33.3. Table 1: CR vs Full +50 % perf, −50 % cost; CR vs Prune
+200 % perf, −25 % cost.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contextrender.analysis import tables
from contextrender.experiments.paper import paper_value

M = 1_000_000
MODEL, BENCH, B = "gpt-4.1", "appworld_test_normal", 6000


def rec(method: str, task: str, inp: int, cached: int = 0, *, exceeded: bool = False, status: str = "ok",
        score: float = 1.0, model: str = MODEL, bench: str = BENCH, budget: int = B, metric: str = "tgc",
        out: int = 0, emb: int = 0, synthetic: bool = False) -> dict:
    zero = {"input": 0, "output": 0, "cached": 0, "embedding": 0, "calls": 0}
    return {
        "key": f"{model}|{bench}|{task}|{method}|{budget}|h", "model": model, "benchmark": bench, "task": task,
        "method": method, "budget": budget, "status": status, "score": {metric: score, "sgc": 0.5},
        "usage": {"agent": {"input": inp, "output": out, "cached": cached, "embedding": 0, "calls": 3},
                  "compactor": dict(zero), "embeddings": {**zero, "embedding": emb}},
        "cost_upper_usd": 0.0, "exceeded_budget": exceeded, "invocations": 3, "renders": [],
        "synthetic": synthetic,
    }


def main_records() -> list[dict]:
    return [
        rec("full", "a", 2 * M, 2 * M, exceeded=True),
        rec("full", "b", 4 * M, 0, exceeded=True, status="error", score=0.0),
        rec("full", "c", 2 * M, 2 * M, exceeded=False),
        rec("contextrender", "a", 2 * M, 2 * M),
        rec("contextrender", "b", 1 * M, 1 * M),
        rec("contextrender", "c", 400_000, 400_000),
        rec("prune", "a", 1 * M),
        rec("prune", "b", 3 * M, status="step_limit", score=0.0),
        rec("prune", "c", 1 * M, score=0.0),
    ]


def write_runs(root: Path, records: list[dict]) -> Path:
    """records/<model>__<benchmark>__<method>__B<budget>.jsonl, as the runner lays them out."""
    by_file: dict[str, list[dict]] = {}
    for r in records:
        by_file.setdefault(f"{r['model']}__{r['benchmark']}__{r['method']}__B{r['budget']}.jsonl", []).append(r)
    (root / "records").mkdir(parents=True, exist_ok=True)
    for name, recs in by_file.items():
        (root / "records" / name).write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return root


def row(summary, method, model=MODEL, bench=BENCH, budget=B):
    r = summary[(summary["model"] == model) & (summary["benchmark"] == bench) & (summary["budget"] == budget)
                & (summary["method"] == method)]
    assert len(r) == 1, (method, model, bench, budget)
    return r.iloc[0]


@pytest.fixture
def built(tmp_path):
    write_runs(tmp_path / "runs", main_records())
    return tables.build([tmp_path / "runs"])


def test_rho_from_full_records_only(built):
    df, summary, groups, _ = built
    info = groups[(MODEL, BENCH, B)]
    assert info.rho == pytest.approx(0.5)  # ContextRender's cached tokens would push it to 0.6
    assert df["rho"].tolist() == pytest.approx([0.5] * len(df))
    # every method is priced with the Full ρ: CR task a = 2M input at 1.25 USD/M
    cr_a = df[(df["method"] == "contextrender") & (df["task"] == "a")].iloc[0]
    assert cr_a["cost_usd"] == pytest.approx(2.5)


def test_T_is_tasks_whose_full_run_exceeded_B(built):
    df, summary, groups, _ = built
    assert groups[(MODEL, BENCH, B)].T == {"a", "b"}
    assert row(summary, "full")["T"] == 2
    assert row(summary, "full")["exceed_share_pct"] == pytest.approx(200 / 3)
    assert set(df[df["in_T"]]["task"]) == {"a", "b"}


def test_T_per_budget_from_full_records_at_that_budget():
    recs = main_records() + [rec("full", t, 2 * M, 0, exceeded=True, budget=2000) for t in "abc"] \
        + [rec("contextrender", t, M, budget=2000) for t in "abc"]
    groups = tables.group_info(recs)
    assert groups[(MODEL, BENCH, B)].T == {"a", "b"}
    assert groups[(MODEL, BENCH, 2000)].T == {"a", "b", "c"}
    assert groups[(MODEL, BENCH, 2000)].rho == pytest.approx(0.0)  # its own Full records, no cache hits


def test_mean_cost_over_T_includes_failures(built):
    _, summary, _, _ = built
    assert row(summary, "full")["mean_cost_usd"] == pytest.approx(3.75)  # Full b is an error, still counted
    prune = row(summary, "prune")
    assert prune["mean_cost_usd"] == pytest.approx(2.5)  # (1.25 + 3.75)/2; without the failure it would be 1.25
    assert (prune["ok"], prune["step_limit"], prune["error"], prune["cost_limit"]) == (2, 1, 0, 0)
    assert prune["n"] == 3 and prune["n_T_covered"] == 2


def test_normalised_cost_is_ratio_of_means(built):
    df, summary, _, _ = built
    cr = row(summary, "contextrender")
    assert cr["mean_cost_usd"] == pytest.approx(1.875)
    assert cr["normalised_cost"] == pytest.approx(0.5)
    # the mean of per-task ratios differs on these records: make sure we are not computing it
    t = df[df["in_T"]]
    full = t[t["method"] == "full"].set_index("task")["cost_usd"]
    crc = t[t["method"] == "contextrender"].set_index("task")["cost_usd"]
    assert (crc / full).mean() == pytest.approx(0.625)
    assert row(summary, "full")["normalised_cost"] == pytest.approx(1.0)
    assert row(summary, "prune")["normalised_cost"] == pytest.approx(2 / 3)


def test_performance_is_primary_metric_times_100(built):
    _, summary, _, _ = built
    assert row(summary, "full")["perf"] == pytest.approx(200 / 3)
    assert row(summary, "contextrender")["perf"] == pytest.approx(100.0)
    assert row(summary, "prune")["perf"] == pytest.approx(100 / 3)
    assert set(summary["metric"]) == {"tgc"}


def test_table1_relative_change_ours_and_paper(built):
    _, summary, _, _ = built
    t1 = tables.table1(summary).data.set_index("method")
    assert set(t1.index) == {"full", "prune"}
    assert t1.loc["full", "rel_perf_pct"] == pytest.approx(50.0)
    assert t1.loc["full", "rel_cost_pct"] == pytest.approx(-50.0)
    assert t1.loc["prune", "rel_perf_pct"] == pytest.approx(200.0)
    assert t1.loc["prune", "rel_cost_pct"] == pytest.approx(-25.0)
    # the paper's Δ comes from its Tables 6–8 cells of the same (model, benchmark, method, B)
    for m in ("full", "prune"):
        cr_p = paper_value("table6", MODEL, BENCH, "contextrender", "tgc", budget=B)
        m_p = paper_value("table6", MODEL, BENCH, m, "tgc", budget=B)
        cr_c = paper_value("table6", MODEL, BENCH, "contextrender", "mean_cost_usd", budget=B)
        m_c = paper_value("table6", MODEL, BENCH, m, "mean_cost_usd", budget=B)
        assert t1.loc[m, "paper_rel_perf_pct"] == pytest.approx(100 * (cr_p - m_p) / m_p)
        assert t1.loc[m, "paper_rel_cost_pct"] == pytest.approx(100 * (cr_c - m_c) / m_c)


def test_main_table_has_paper_values_beside_ours(built):
    _, summary, _, _ = built
    full = row(summary, "full")
    assert full["paper_perf"] == paper_value("table6", MODEL, BENCH, "full", "tgc", budget=B)
    assert full["paper_mean_cost_usd"] == paper_value("table6", MODEL, BENCH, "full", "mean_cost_usd", budget=B)
    # a benchmark the paper does not have gets no paper value
    other = tables.summarise(*_frame([rec(m, "a", M, exceeded=True, bench="bfcl_multi_turn_long_context",
                                          metric="task_acc") for m in ("full", "contextrender")]))
    assert other["paper_perf"].isna().all() and set(other["metric"]) == {"task_acc"}


def _frame(recs):
    groups = tables.group_info(recs)
    return tables.records_frame(recs, groups), groups


def test_files_written_and_markdown_has_the_numbers(tmp_path):
    runs = write_runs(tmp_path / "runs", main_records())
    out = tmp_path / "out"
    paths = tables.make_tables([runs], out, "all")
    names = {p.name for p in paths}
    for stem in ("table1", "table_main"):
        assert {f"{stem}.md", f"{stem}.csv", f"{stem}.tex"} <= names
        for ext in ("md", "csv", "tex"):
            assert (out / f"{stem}.{ext}").stat().st_size > 0
    t1 = (out / "table1.md").read_text(encoding="utf-8")
    assert "| gpt-4.1 | appworld_test_normal | 6000 | full | 100.0 | 66.7 | +50.0% |" in t1
    assert "| prune | 100.0 | 33.3 | +200.0% |" in t1 and "-25.0%" in t1 and "-50.0%" in t1
    main = (out / "table_main.md").read_text(encoding="utf-8")
    assert "| gpt-4.1 | appworld_test_normal | 6000 | contextrender | 3 | 100.0 |" in main
    assert "1.8750" in main and "0.500" in main and "0.667" in main and "3.7500" in main
    tex = (out / "table1.tex").read_text(encoding="utf-8")
    assert r"\begin{tabular}" in tex and r"appworld\_test\_normal" in tex and r"\%" in tex
    csv = (out / "table_main.csv").read_text(encoding="utf-8")
    assert csv.splitlines()[0].startswith("model,benchmark,budget,method,metric,n,perf,mean_cost_usd")
    # single budget, no ablation methods: no sweep or ablation table by default
    assert not (out / "table_sweep.md").exists() and not (out / "table_ablation.md").exists()


def test_missing_full_group_is_noted_and_not_normalised(tmp_path):
    recs = main_records() + [rec("contextrender", t, M, bench="moqa8", metric="f1", score=0.5) for t in "xy"] \
        + [rec("prune", t, 2 * M, bench="moqa8", metric="f1", score=0.25) for t in "xy"]
    runs = write_runs(tmp_path / "runs", recs)
    _, summary, groups, _ = tables.build([runs])
    assert not groups[(MODEL, "moqa8", B)].has_full
    cr = row(summary, "contextrender", bench="moqa8")
    assert cr["perf"] == pytest.approx(50.0)
    assert cr["mean_cost_usd"] is None or cr["mean_cost_usd"] != cr["mean_cost_usd"]  # None/NaN
    assert cr["normalised_cost"] is None or cr["normalised_cost"] != cr["normalised_cost"]
    assert "no Full-history records" in cr["note"]
    tables.make_tables([runs], tmp_path / "out", "table1")
    tables.make_tables([runs], tmp_path / "out", "main")
    t1 = (tmp_path / "out" / "table1.md").read_text(encoding="utf-8")
    assert "no Full-history records for gpt-4.1 × moqa8 at B=6000" in t1
    assert "| gpt-4.1 | moqa8 | 6000 | prune | 50.0 | 25.0 | +100.0% | " in t1  # perf Δ still computed
    main = (tmp_path / "out" / "table_main.md").read_text(encoding="utf-8")
    assert "no Full-history records for gpt-4.1 × moqa8 at B=6000" in main
    # the group with Full is unaffected
    assert row(summary, "contextrender")["normalised_cost"] == pytest.approx(0.5)


def test_offline_oracle_and_synthetic_records_are_labelled(tmp_path):
    recs = [rec(m, "t1", M, exceeded=True, model="oracle", bench="bfcl_multi_turn_long_context",
                metric="task_acc", budget=2000, synthetic=True) for m in ("full", "contextrender")]
    runs = write_runs(tmp_path / "runs", recs)
    tables.make_tables([runs], tmp_path / "out", "main")
    md = (tmp_path / "out" / "table_main.md").read_text(encoding="utf-8")
    title = md.splitlines()[0]
    assert "offline oracle" in title and "not comparable to paper numbers" in title
    assert "OFFLINE: model 'oracle'" in md and "SYNTHETIC" in md
    assert "| oracle†‡ |" in md


def test_sweep_and_ablation_with_recall(tmp_path):
    recs = main_records() + [rec(m, t, M, exceeded=True, budget=3000, score=s)
                             for m, s in (("full", 1.0), ("contextrender", 0.0)) for t in "ab"] \
        + [rec("cr_recency", t, M) for t in "abc"]
    runs = write_runs(tmp_path / "runs", recs)
    recall = {"budget": B, "traces": 3, "events": 40, "events_by_age": {"le3": 20, "4_10": 10, "11_25": 6, "gt25": 4},
              "methods": {"contextrender": {"recall": 90.0, "recall_by_age": {"le3": 100.0, "4_10": 90.0,
                                                                               "11_25": 66.7, "gt25": 50.0}},
                          "cr_recency": {"recall": 55.0, "recall_by_age": {"le3": 100.0, "4_10": 40.0,
                                                                            "11_25": 0.0, "gt25": None}}}}
    rpath = tmp_path / "recall.json"
    rpath.write_text(json.dumps(recall), encoding="utf-8")
    paths = tables.make_tables([runs], tmp_path / "out", "all", recall=rpath)
    names = {p.name for p in paths}
    assert {"table_sweep.md", "table_ablation.md", "table_ablation.tex", "table_ablation.csv"} <= names
    sweep = (tmp_path / "out" / "table_sweep.md").read_text(encoding="utf-8")
    assert "perf B=3000" in sweep and "perf B=6000" in sweep
    assert "| gpt-4.1 | appworld_test_normal | contextrender | 0.0 | 1.000 | 100.0 |" in sweep
    abl = (tmp_path / "out" / "table_ablation.md").read_text(encoding="utf-8")
    p_cr = paper_value("table2", MODEL, BENCH, "contextrender", "later_used_recall", budget=B)
    p_rec = paper_value("table2", MODEL, BENCH, "cr_recency", "tgc", budget=B)
    assert f"| contextrender | 3 | 100.0 | {paper_value('table6', MODEL, BENCH, 'contextrender', 'tgc', budget=B):.1f}" \
           f" | – | – | 90.0 | {p_cr:.1f} |" in abl  # readiness: this hand-made replay output has none
    assert f"| cr_recency | 3 | 100.0 | {p_rec:.1f} | – | – | 55.0 |" in abl
    assert "40 events" in abl


def test_recorded_metric_wins_over_the_benchmark_name():
    # A benchmark whose name says nothing (schema 3 records name their primary metric).
    assert tables.primary_metric("tau2_retail", {"reward", "pass", "db"}, {"pass"}) == "pass"
    assert tables.primary_metric("bfcl_multi_turn_long_context", {"task_acc", "turn_acc"}, {""}) == "task_acc"
    with pytest.raises(ValueError, match="several primary metrics"):
        tables.primary_metric("x", {"a", "b"}, {"a", "b"})


def test_ablation_takes_one_recall_file_per_benchmark(tmp_path):
    # Two benchmarks at one budget (the offline main job runs τ²-retail and BFCL): each replay's recall
    # goes to its own benchmark's rows, never to the other's.
    recs = [rec(m, t, M, exceeded=True, bench=bench, budget=B) for bench in ("bench_a", "bench_b")
            for m in ("full", "contextrender", "cr_recency") for t in "ab"]
    runs = write_runs(tmp_path / "runs", recs)
    files = []
    for bench, value in (("bench_a", 11.0), ("bench_b", 22.0)):
        # as a replay of files writes it: the benchmark named with where the name came from
        r = {"budget": B, "benchmark": {"name": bench, "from": "traces"}, "traces": 2, "events": 5, "events_by_age": {},
             "methods": {"contextrender": {"recall": value, "recall_by_age": {}}}}
        files.append(tmp_path / f"recall_{bench}.json")
        files[-1].write_text(json.dumps(r), encoding="utf-8")
    tables.make_tables([runs], tmp_path / "out", "ablation", recall=files)
    csv = (tmp_path / "out" / "table_ablation.csv").read_text(encoding="utf-8").splitlines()
    header = csv[0].split(",")
    rows = [dict(zip(header, line.split(","), strict=False)) for line in csv[1:]]
    got = {(r["benchmark"], r["method"]): r["recall"] for r in rows if r["method"] == "contextrender"}
    assert got == {("bench_a", "contextrender"): "11.0", ("bench_b", "contextrender"): "22.0"}


def test_the_hindsight_ceiling_sits_beside_the_recall_rows(tmp_path):
    recs = [rec(m, t, M, exceeded=True, budget=B) for m in ("full", "contextrender", "cr_recency") for t in "ab"]
    runs = write_runs(tmp_path / "runs", recs)
    r = {"budget": B, "traces": 2, "events": 5, "events_by_age": {"le3": 5},
         "methods": {"contextrender": {"recall": 60.0, "recall_by_age": {"le3": 60.0}}},
         "ceiling": {"recall": 80.0, "recall_by_age": {"le3": 80.0}, "over_budget_renders": 0}}
    path = tmp_path / "recall.json"
    path.write_text(json.dumps(r), encoding="utf-8")
    tables.make_tables([runs], tmp_path / "out", "ablation", recall=path)
    md = (tmp_path / "out" / "table_ablation.md").read_text(encoding="utf-8")
    rows = [line for line in md.splitlines() if line.startswith("|")]
    ceiling = next(line for line in rows if f"| {tables.CEILING} |" in line)
    cr = next(line for line in rows if "| contextrender |" in line)
    assert "| 80.0 |" in ceiling and "| 60.0 |" in cr
    assert rows.index(ceiling) > rows.index(cr)  # after every policy
    assert "not a policy" in md
    # without a ceiling in the replay there is no such row (older replay files)
    del r["ceiling"]
    path.write_text(json.dumps(r), encoding="utf-8")
    tables.make_tables([runs], tmp_path / "out2", "ablation", recall=path)
    assert tables.CEILING not in (tmp_path / "out2" / "table_ablation.md").read_text(encoding="utf-8")


def billed_rec(method: str, task: str, renders: list[tuple[int, tuple[int, int], tuple[int, int]]],
               exceeded: bool = True) -> dict:
    """A schema-5 record: per request (prompt tokens, anthropic (read, write), openai (read, write))."""
    r = rec(method, task, sum(p for p, _, _ in renders), exceeded=exceeded)
    r["renders"] = [{"prompt": p, "output": 0, "cache": {"anthropic": list(a), "openai": list(o)}}
                    for p, a, o in renders]
    return r


def test_billed_cost_is_each_request_from_its_own_cached_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Hand-worked, at $1/M input (read 0.1, write 1.25) for anthropic and $2/M (read 0.5) for openai:

        full a: 1000 written; 2000 = 1000 read + 1000 written   anthropic 1250 + 100 + 1250 = 2600 µ$
                                                               openai    2000 + 500 + 2000 = 4500 µ$
        cr   a: 800 written; 800 written again (prefix changed) anthropic 2000 µ$, openai 3200 µ$
        ×Full: anthropic 2000/2600 = 0.769, openai 0.711, none (gpt-4.1, nothing cached) 3200/6000 = 0.533;
        cache hits (anthropic, over all the cell's records): Full 1000/3500 = 29 %, CR 0 %. Task b is not in T.
    """
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({
        "claude-sonnet-4-5": {"input_cost_per_token": 1e-6, "cache_read_input_token_cost": 1e-7,
                              "cache_creation_input_token_cost": 1.25e-6, "litellm_provider": "anthropic"},
        "gpt-4.1": {"input_cost_per_token": 2e-6, "cache_read_input_token_cost": 5e-7, "litellm_provider": "openai"}}))
    monkeypatch.setenv("CONTEXTRENDER_COST_MAP", str(costs))
    records = [billed_rec("full", "a", [(1000, (0, 1000), (0, 0)), (2000, (1000, 1000), (1000, 0))]),
               billed_rec("full", "b", [(500, (0, 0), (0, 0))], exceeded=False),
               billed_rec("contextrender", "a", [(800, (0, 800), (0, 0)), (800, (0, 800), (0, 0))]),
               billed_rec("contextrender", "b", [(9000, (0, 0), (0, 0))])]
    groups = tables.group_info(records)
    summary = tables.summarise(tables.records_frame(records, groups), groups)
    full, cr = row(summary, "full"), row(summary, "contextrender")
    assert full["billed_usd_anthropic"] == pytest.approx(2600e-6)
    assert cr["billed_usd_anthropic"] == pytest.approx(2000e-6)
    assert cr["billed_usd_openai"] == pytest.approx(3200e-6)
    assert cr["billed_anthropic"] == pytest.approx(2000 / 2600)
    assert cr["billed_openai"] == pytest.approx(3200 / 4500)
    assert cr["billed_none"] == pytest.approx(3200 / 6000)
    assert full["hit_anthropic"] == pytest.approx(100 * 1000 / 3500)  # hits over all the cell's records
    assert cr["hit_anthropic"] == 0.0
    t1 = tables.table1(summary)
    assert t1.data.iloc[0]["rel_billed_anthropic_pct"] == pytest.approx(100 * (2000 - 2600) / 2600)
    md = tables.to_markdown(tables.main_table(summary))
    assert "billed ×Full anthropic" in md and "cache hits % anthropic" in md and "Eq. 3" in md


def test_records_before_billing_get_no_billed_columns():
    groups = tables.group_info(main_records())
    summary = tables.summarise(tables.records_frame(main_records(), groups), groups)
    assert summary["billed_anthropic"].isna().all()
    assert "billed ×Full" not in tables.to_markdown(tables.main_table(summary))
