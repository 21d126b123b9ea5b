"""Replay over other harnesses' files: directories, globs, formats, the recorded sources, ACON's benchmark."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from contextrender import ExtractiveCompactor, HashingEmbedder
from contextrender.cli import main as cli_main
from contextrender.experiments.evaluation.recall import count_events, reuse_events
from contextrender.experiments.evaluation.replay import build_policies, replay_traces
from contextrender.experiments.evaluation.traces import TraceError, open_traces, read_traces

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
TAU2 = DATA / "tau2"
BFCL = DATA / "bfcl" / "scripted-model-FC" / "multi_turn" / "BFCL_v4_multi_turn_base_result.json"
TAUBENCH = next((DATA / "taubench").glob("*.json"))
OURS = DATA / "react_traces.jsonl"
PER_FORMAT = {"tau2": TAU2 / "scripted_retail.json", "tau2_telecom": TAU2 / "scripted_telecom.json", "bfcl": BFCL,
              "taubench": TAUBENCH, "contextrender": OURS}


def replay(traces, methods, budget, **kw):
    return replay_traces(traces, budget, methods, embedder=HashingEmbedder(dim=256), compactor=ExtractiveCompactor(),
                         **kw)


@pytest.fixture
def mixed(tmp_path) -> Path:
    """A results folder holding every format, with tau2's summaries beside its results."""
    d = tmp_path / "runs"
    shutil.copytree(TAU2, d / "tau2")
    shutil.copytree(DATA / "bfcl", d / "bfcl")
    shutil.copy(TAUBENCH, d / "taubench.json")
    shutil.copy(OURS, d / "ours.jsonl")
    return d


@pytest.mark.parametrize("name", sorted(PER_FORMAT))
def test_each_format_replays_within_budget(name):
    path = PER_FORMAT[name]
    eps = list(read_traces(path))
    res = replay(path, ["contextrender", "prune"], 400)
    turns = sum(len(e.assistant_indices) for e in eps)
    for tally in res.methods.values():
        s = tally.summary()
        assert s["renders"] == turns and s["over_budget_renders"] == 0 and s["max_rendered_tokens"] <= 400
    assert res.events.events == sum(len(reuse_events(list(e.messages))) for e in eps)
    assert res.to_json()["sources"]["files"][0]["format"] == name.split("_")[0]


def test_a_folder_of_every_format_replays_and_records_its_sources(mixed, caplog):
    with caplog.at_level("WARNING"):
        res = replay(mixed, ["full", "contextrender", "acon"], 10**6)
    assert any("record several benchmarks" in r.getMessage() and "pools their events" in r.getMessage()
               for r in caplog.records)  # said, not only written into the JSON
    eps = list(open_traces(mixed))
    out = res.to_json()
    assert out["traces"] == len(eps) == 9
    expected = sum((count_events(reuse_events(list(e.messages))) for e in eps), count_events([]))
    assert out["events"] == expected.events > 0
    assert out["methods"]["full"]["recall"] == 100.0 and out["methods"]["contextrender"]["recall"] == 100.0
    files = [(Path(f["path"]).relative_to(mixed.resolve()).as_posix(), f["format"], f["episodes"])
             for f in out["sources"]["files"]]
    assert files == [("bfcl/scripted-model-FC/multi_turn/BFCL_v4_multi_turn_base_result.json", "bfcl", 2),
                     ("ours.jsonl", "contextrender", 2), ("tau2/scripted_retail.json", "tau2", 2),
                     ("tau2/scripted_telecom.json", "tau2", 1), ("tau2/scripted_telecom_solo.json", "tau2", 1),
                     ("taubench.json", "taubench", 1)]
    assert out["sources"]["files"][5]["excluded"] == {
        "the task raised (tau_bench/run.py records traj=[] and the error)": 1}
    assert len(out["sources"]["ignored"]) == 6  # tau2's *_results.json and *_termination_summary.json
    # The files record different benchmarks (and some none): ACON keeps its default thresholds.
    assert out["benchmark"]["name"] is None and out["benchmark"]["from"].startswith("traces record several")
    assert out["method_settings"] == {"acon": {"history_threshold": 4096, "observation_threshold": 1024,
                                               "thresholds_from": "ACON's AppWorld values (no benchmark known)"}}


def _keyed_trace(tmp_path: Path, benchmark: str) -> Path:
    """Our runner's trace lines (with their record key) from a benchmark."""
    path = tmp_path / "traces.jsonl"
    lines = []
    for ep in read_traces(OURS):
        key = f"oracle|{benchmark}|{ep.task_id}|full|2000|0123456789abcdef"
        lines.append(json.dumps({"task_id": ep.task_id, "key": key, "messages": list(ep.messages)}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_acon_thresholds_follow_the_traces_recorded_benchmark(tmp_path):
    qa = replay(_keyed_trace(tmp_path, "moqa8_offline"), ["acon"], 3000).to_json()
    assert qa["benchmark"] == {"name": "moqa8_offline", "from": "traces"}
    assert qa["method_settings"]["acon"] == {"history_threshold": 2048, "observation_threshold": 400,
                                             "thresholds_from": "ACON's QA values (moqa8* benchmark moqa8_offline)"}
    bfcl = replay(_keyed_trace(tmp_path, "bfcl_multi_turn_long_context"), ["acon"], 3000).to_json()
    assert (bfcl["method_settings"]["acon"]["history_threshold"], bfcl["method_settings"]["acon"]
            ["observation_threshold"]) == (4096, 1024)
    # An explicit benchmark wins over the recorded one; an explicit threshold wins over both.
    hinted = replay(OURS, ["acon"], 3000, benchmark="moqa8").to_json()
    assert hinted["benchmark"] == {"name": "moqa8", "from": "argument"}
    assert hinted["method_settings"]["acon"]["history_threshold"] == 2048
    explicit = replay(OURS, ["acon"], 3000, benchmark="moqa8", overrides={"acon": {"history_threshold": 3000}})
    assert explicit.method_settings["acon"] == {
        "history_threshold": 3000, "observation_threshold": 400,
        "thresholds_from": "observation_threshold: ACON's QA values (moqa8* benchmark moqa8); the other set explicitly"}


def test_the_qa_thresholds_change_what_acon_renders(tmp_path):
    policies, _ = build_policies(["acon"], compactor=ExtractiveCompactor(), benchmark="moqa8")
    assert (policies["acon"].history_threshold, policies["acon"].observation_threshold) == (2048, 400)
    # τ² retail: history ≈ 3.2K tokens (over 2048, under 4096), results of 514 and 543 tokens (over 400,
    # under 1024) and one of 1104: AppWorld's setting compresses only that one, QA's also the others and
    # the history.
    retail = TAU2 / "scripted_retail.json"
    qa = replay(retail, ["acon"], 10**6, benchmark="moqa8").methods["acon"].summary()
    appworld = replay(retail, ["acon"], 10**6).methods["acon"].summary()
    assert qa["recall"] < appworld["recall"]
    assert qa["max_rendered_tokens"] < 2048 < appworld["max_rendered_tokens"]


def test_cli_reads_directories_globs_and_forced_formats(mixed, capsys):
    out = mixed / "r.json"
    code = cli_main(["replay", str(mixed / "tau2"), str(BFCL), "--budget", "500", "--methods", "prune",
                     "--embedding", "hashing", "--format", "json", "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    res = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == res
    assert [f["format"] for f in res["sources"]["files"]] == ["tau2", "tau2", "tau2", "bfcl"] and res["traces"] == 6
    code = cli_main(["replay", str(mixed / "tau2" / "scripted_*.json"), "--trace-format", "tau2", "--budget", "500",
                     "--methods", "prune", "--embedding", "hashing"])
    printed = capsys.readouterr().out
    assert code == 0 and "scripted_telecom.json: τ²-bench results, 1 episodes" in printed and "6 files ignored" in printed


def test_cli_expand_offers_the_tool_to_the_plus_only(mixed, capsys):
    """``--expand`` reaches the replay: the plus (markers with handles) is offered the tool, prune is not, and the
    table of values one expansion away is printed; without it there is no such table."""
    args = ["replay", str(BFCL), "--budget", "300", "--methods", "prune,contextrender_plus", "--embedding", "hashing",
            "--no-ceiling"]
    out = mixed / "e.json"
    assert cli_main([*args, "--expand", "--output", str(out)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert json.loads(out.read_text())["expand"] == ["contextrender_plus"]
    assert "One expansion away (the expand tool offered to contextrender_plus" in printed
    assert "| prune |" in printed.split("One expansion away")[1]
    assert cli_main(args) == 0 and "One expansion away" not in capsys.readouterr().out


def test_cli_names_the_bad_record_and_lenient_skips_it(tmp_path, capsys):
    doc = json.loads((TAU2 / "scripted_retail.json").read_text())
    doc["simulations"][1]["messages"][3]["role"] = "robot"
    bad = tmp_path / "tau2.json"
    bad.write_text(json.dumps(doc, indent=2))
    args = ["replay", str(bad), "--budget", "500", "--methods", "prune", "--embedding", "hashing", "--format", "json"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert f"{bad}: simulations[1]: messages[3]: 'role' must be assistant, user, tool or system, got 'robot'" in err
    assert cli_main([*args, "--lenient"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["traces"], res["skipped_lines"], res["sources"]["files"][0]["skipped"]) == (1, 1, 1)
    with pytest.raises(TraceError):
        replay(bad, ["prune"], 500)


def test_cli_refuses_a_folder_without_traces(tmp_path, capsys):
    shutil.copy(TAU2 / "scripted_retail_results.json", tmp_path / "summary.json")
    assert cli_main(["replay", str(tmp_path), "--budget", "500", "--methods", "prune", "--embedding", "hashing"]) == 2
    assert "no trace file" in capsys.readouterr().err


@pytest.mark.slow
def test_hydra_entry_takes_a_glob_a_format_and_a_benchmark(tmp_path, mixed):
    out = tmp_path / "recall.json"
    proc = subprocess.run(
        [sys.executable, "-m", "contextrender.experiments.evaluation.replay", "embedding=hashing", "progress=false",
         f"hydra.run.dir={tmp_path / 'hydra'}", f"traces={mixed}/tau2/*.json", "trace_format=tau2",
         "benchmark_name=moqa8", "methods=[acon,prune]", "budget=800", f"output={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "CONTEXTRENDER_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    assert [Path(f["path"]).name for f in res["sources"]["files"]] == ["scripted_retail.json", "scripted_telecom.json",
                                                                       "scripted_telecom_solo.json"]
    assert res["benchmark"] == {"name": "moqa8", "from": "argument"}
    assert res["method_settings"]["acon"]["history_threshold"] == 2048


def test_cli_says_once_what_it_left_out(caplog, capsys):
    """The CLI validates the files once and replays what it read: what a file's records leave out is warned
    about once."""
    import logging

    with caplog.at_level(logging.WARNING):
        code = cli_main(["replay", str(DATA / "taubench"), "--budget", "300", "--methods", "prune",
                         "--embedding", "hashing"])
    assert code == 0, capsys.readouterr().err
    said = [r.getMessage() for r in caplog.records if "not replayed" in r.getMessage()]
    assert len(said) == 1 and "1 record(s) not replayed" in said[0], said
