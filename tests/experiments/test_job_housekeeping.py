"""Runner housekeeping: one writer per job, resume keys,
summaries after a resume, budgets, permissions, empty traces, redacted Hydra logs.

Real Hydra composition, BFCL task data, the oracle, real files and real
subprocesses of ``python -m contextrender.experiments.run``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from contextrender.experiments.evaluation.replay import run as replay_run
from contextrender.experiments.records.schema import config_hash, load_records
from contextrender.experiments.runtime.runner import result_config, run_job
from contextrender.files import LockedError
from contextrender.registry import CONF_DIR

ROOT = Path(__file__).resolve().parents[2]
STEM = "oracle__bfcl_multi_turn_long_context__{}__B{}"


def job(run_dir: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=[f"run_dir={run_dir}", "embedding=hashing", "progress=false",
                                            "model=oracle", *overrides])


def cli(run_dir: Path, *overrides: str, wait: bool = True, first_on_path: tuple[Path, ...] = (), sweep: bool = False):
    cmd = [sys.executable, "-m", "contextrender.experiments.run", *(["-m"] if sweep else []), f"run_dir={run_dir}",
           "embedding=hashing", "progress=false",
           f"hydra.run.dir={run_dir}/hydra", *overrides]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, first_on_path), str(ROOT),
                                                        str(Path(__file__).parent)])}  # + _faults
    if wait:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_a_second_runner_on_the_same_job_refuses_and_names_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    lock = run_dir / "records" / (STEM.format("prune", 1500) + ".lock")
    # all 200 tasks at 50 ms per model call: minutes of work, killed below after a few seconds
    holder = cli(run_dir, "method=prune", "budget=1500", "model._target_=_faults.SlowOracle", "+model.delay_s=0.05",
                 wait=False)
    try:
        deadline = time.time() + 600  # generous: a loaded machine can take a minute to start Hydra
        while time.time() < deadline and holder.poll() is None:
            if lock.exists() and f'"pid": {holder.pid}' in lock.read_text():
                break
            time.sleep(0.05)
        assert holder.poll() is None, "the first runner ended before the test could race it"
        with pytest.raises(LockedError) as err:
            run_job(job(run_dir, "method=prune", "budget=1500", "benchmark.limit=3"))
        msg = str(err.value)
        assert f"pid {holder.pid}" in msg and socket.gethostname() in msg and "since 20" in msg, msg
        # another job of the same sweep, in the same run directory, runs alongside (Hydra's joblib/submitit)
        other = run_job(job(run_dir, "method=full", "budget=1500", "benchmark.limit=2"))
        assert other.done == 2 and holder.poll() is None
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # a killed holder leaves no stale lock: the kernel released it with the process
    after = run_job(job(run_dir, "method=prune", "budget=1500", "benchmark.limit=3"))
    assert after.done == 3
    recs = [r for r in load_records(run_dir) if r["method"] == "prune"]
    assert len(recs) == len({r["key"] for r in recs})  # nothing duplicated


def test_limit_is_not_part_of_the_resume_key_and_the_mean_covers_all_done_episodes(tmp_path):
    # prune at B=100 fails some of the first tasks (scores 1, 0, 1, 0, 0), so means over
    # "this invocation only" and "the whole job" differ
    over = ("method=prune", "budget=100")
    first = run_job(job(tmp_path, *over, "benchmark.limit=2"))
    second = run_job(job(tmp_path, *over, "benchmark.limit=4"))
    assert (second.ran, second.skipped, second.done) == (2, 2, 4)  # today: all 4 rerun
    third = run_job(job(tmp_path, *over, "benchmark.limit=5"))
    assert (third.ran, third.skipped, third.done) == (1, 4, 5)
    recs = load_records(tmp_path)
    assert len(recs) == 5 and len({r["key"] for r in recs}) == 5
    scores = [r["score"]["task_acc"] for r in recs]
    assert first.mean_score == pytest.approx(sum(scores[:2]) / 2)
    assert third.mean_score == pytest.approx(sum(scores) / 5) != pytest.approx(scores[4])
    again = run_job(job(tmp_path, *over, "benchmark.limit=5"))  # nothing left to run
    assert again.ran == 0 and again.mean_score == pytest.approx(third.mean_score)  # today: None


def test_task_selection_is_out_of_the_config_hash_but_results_are_in():
    def h(*o: str) -> str:
        return config_hash(result_config(job(Path("/nonexistent"), "method=prune", "budget=1500", *o)))

    base = h("benchmark.limit=2")
    assert h("benchmark.limit=40") == h("benchmark.limit=null") == base
    assert h("benchmark.ids=[multi_turn_long_context_3]") == base
    assert h("rerun_untraced=true") == h("workers=3") == base  # run control, not results
    # what changes an episode's result stays in the key
    assert h("benchmark.per_turn_step_limit=5") != base
    assert h("limits.max_steps=7") != base
    assert h("benchmark.category=multi_turn_base") != base


def test_a_rerun_with_another_config_is_replayed_once_per_task_the_latest(tmp_path):
    """The runner appends a rerun's traces (another config hash, same job) to the job's trace file; the
    tables count the latest record per task, and so does replay: the earlier traces are excluded, named."""
    from contextrender.experiments.evaluation.traces import SUPERSEDED, read_traces

    over = ("method=prune", "budget=1500")
    run_job(job(tmp_path, *over, "benchmark.limit=2"))
    run_job(job(tmp_path, *over, "benchmark.limit=3", "limits.max_steps=7"))  # in the hash: all 3 run again
    path = tmp_path / "traces" / f"{STEM.format('prune', 1500)}.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 5 and len({x["key"].rsplit("|", 1)[1] for x in lines}) == 2
    reader = read_traces(path)
    eps = list(reader)
    assert [e.line for e in eps] == [3, 4, 5]  # the second run's, one per task
    assert sorted(e.task_id for e in eps) == sorted(x["task_id"] for x in lines[2:])
    assert reader.summary()["excluded"] == {SUPERSEDED: 2}


def test_a_rerun_under_another_config_that_has_not_reached_every_task_is_said_in_tables_and_replay(
        tmp_path, caplog):
    """Until a rerun under a new config has reached every task, the others count (and replay) their
    older config's record and trace: each table's notes and the trace reader say so, with the counts."""
    from contextrender.analysis.tables import build_with_notes
    from contextrender.experiments.evaluation.traces import read_traces

    over = ("method=prune", "budget=1500")
    run_job(job(tmp_path, *over, "benchmark.limit=3"))
    run_job(job(tmp_path, *over, "benchmark.limit=1", "limits.max_steps=7"))  # another config, task 1 only
    new_hash = config_hash(result_config(job(tmp_path, *over, "limits.max_steps=7")))
    *_, notes = build_with_notes([tmp_path])
    mixed = [n for n in notes if "configs" in n]
    assert len(mixed) == 1, notes
    assert f"2 configs — 1 task(s) from the newest ({new_hash[:10]}), 2 from older ones" in mixed[0]
    path = tmp_path / "traces" / f"{STEM.format('prune', 1500)}.jsonl"
    reader = read_traces(path)
    with caplog.at_level("WARNING"):
        assert len(list(reader)) == 3
    (job_name, counts), = reader.summary()["mixed_configs"].items()
    assert job_name == "oracle|bfcl_multi_turn_long_context|prune|1500"
    assert counts[new_hash] == 1 and sum(counts.values()) == 3
    assert any("replays lines of 2 configs: 1 task(s) of the newest" in r.getMessage() for r in caplog.records)
    run_job(job(tmp_path, *over, "benchmark.limit=3", "limits.max_steps=7"))  # the rerun reaches every task
    assert not [n for n in build_with_notes([tmp_path])[-1] if "configs" in n]
    reader = read_traces(path)
    assert len(list(reader)) == 3 and "mixed_configs" not in reader.summary()


def test_only_a_valid_later_trace_supersedes_and_superseded_lines_are_still_validated(tmp_path):
    """A rerun line that is broken hides nothing (lenient: it is skipped, the earlier one replayed); a
    line without a key (``contextrender export``) or of another task id is never superseded; in strict
    mode an earlier malformed line still raises, although a later line would supersede it."""
    from contextrender.experiments.evaluation.traces import SUPERSEDED, TraceError, read_traces

    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    key = "oracle|bfcl|t1|prune|1500|{}"
    good = lambda tid, k: json.dumps({"task_id": tid, "key": k, "messages": msgs})  # noqa: E731
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([
        good("t1", key.format("aaa")),                                       # 1: superseded by 4
        json.dumps({"task_id": "t1", "messages": msgs}),                     # 2: no key: kept
        good("other", key.format("bbb")),                                    # 3: another task id: kept
        good("t1", key.format("ccc")),                                       # 4: the latest valid t1
        json.dumps({"task_id": "t1", "key": key.format("ddd"), "messages": [{"role": "tool"}]}),  # 5: broken
    ]) + "\n")
    reader = read_traces(path, strict=False)
    assert [e.line for e in reader] == [2, 3, 4]
    assert reader.skipped == 1 and reader.summary()["excluded"] == {SUPERSEDED: 1}
    with pytest.raises(TraceError, match=":5:"):
        list(read_traces(path))  # strict: the broken line is an error, as before
    bad_first = tmp_path / "b.jsonl"
    bad_first.write_text(json.dumps({"task_id": "t1", "key": key.format("aaa"), "messages": "x"}) + "\n"
                         + good("t1", key.format("ccc")) + "\n")
    with pytest.raises(TraceError, match=":1:"):
        list(read_traces(bad_first))


@pytest.mark.parametrize("budget", [0, -5])
def test_a_non_positive_budget_is_refused_before_anything_is_created(tmp_path, budget):
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=f"budget.*got {budget}"):
        run_job(job(run_dir, "method=prune", f"budget={budget}", "benchmark.limit=1"))
    assert not run_dir.exists()


def test_run_directories_and_files_are_private(tmp_path):
    run_dir = tmp_path / "new" / "run"
    summary = run_job(job(run_dir, "method=prune", "budget=1500", "benchmark.limit=1"))
    assert summary.done == 1
    for d in (run_dir, run_dir / "records", run_dir / "traces", run_dir / "graphs"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    stem = STEM.format("prune", 1500)
    for f in (run_dir / "records" / f"{stem}.jsonl", run_dir / "records" / f"{stem}.lock",
              run_dir / "traces" / f"{stem}.jsonl"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def _replay_cfg(tmp_path: Path, traces: Path, *extra: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("replay", overrides=[f"traces={traces}", "embedding=hashing", "progress=false",
                                            "methods=[cr_recency]", f"output={tmp_path / 'out.json'}", *extra])


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_an_empty_trace_file_is_an_error_naming_it(tmp_path, content):
    traces = tmp_path / "empty.jsonl"
    traces.write_text(content)
    with pytest.raises(ValueError, match=f"{traces}.*empty"):  # today: recall null
        replay_run(_replay_cfg(tmp_path, traces))
    assert not (tmp_path / "out.json").exists()


def test_a_trace_file_without_one_valid_episode_is_an_error(tmp_path):
    traces = tmp_path / "bad.jsonl"
    traces.write_text('{"task_id": "t"}\nnot json\n')
    with pytest.raises(ValueError, match=f"{traces}: no episode was replayed \\(2 malformed"):
        replay_run(_replay_cfg(tmp_path, traces, "strict=false"))
    assert not (tmp_path / "out.json").exists()


def test_hydra_log_handlers_redact(tmp_path):
    secret = "sk-live0123456789abcdefghij"  # a key shape, here in the run directory's name
    run_dir = tmp_path / secret
    res = cli(run_dir, "method=prune", "budget=1500", "benchmark.limit=1")
    assert res.returncode == 0, res.stderr[-2000:]
    logs = list((run_dir / "hydra").glob("*.log"))
    assert logs, "Hydra wrote no job log"
    for text in (res.stdout + res.stderr, *(p.read_text() for p in logs)):
        assert "episodes done" in text and "0 infrastructure errors to retry" in text
        assert secret not in text and "***" in text
    assert json.loads((run_dir / "records" / (STEM.format("prune", 1500) + ".jsonl")).read_text())["task"]


def test_a_benchmark_whose_package_is_missing_names_the_package_and_how_to_install_it(tmp_path):
    # The real entry point in a process where bfcl_eval cannot be imported (as on a machine that
    # skipped requirements-nodeps.txt). Hydra alone says "Error locating target" and hides why.
    blocked = ("import runpy, sys; sys.modules['bfcl_eval'] = None; "
               "runpy.run_module('contextrender.experiments.run', run_name='__main__')")
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-c", blocked, f"run_dir={run_dir}", "embedding=hashing", "progress=false",
           f"hydra.run.dir={tmp_path}/hydra", "model=oracle", "benchmark=bfcl_multi_turn", "method=prune"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    said = out.stdout + out.stderr  # Hydra's console log goes to stdout
    assert out.returncode == 2
    assert "benchmark (contextrender.experiments.benchmarks.bfcl.BFCLMultiTurn) needs 'bfcl_eval'" in said
    assert "pip install --no-deps bfcl-eval==2026.3.23" in said
    assert "Traceback" not in said  # a refusal says why, once, without a stack
    assert not (run_dir / "records").exists()  # nothing was written for the job


def test_an_unreadable_trace_line_is_written_again_from_the_graph_or_its_episode_rerun(tmp_path, caplog):
    """A done episode whose trace line cannot be read (quarantined when the job starts) would drop out
    of every replay; the job writes the line again from its graph, identical, without rerunning the
    episode; with the graph gone too, the episode runs again. Either way the job ends with every trace."""
    from contextrender.experiments.evaluation.traces import read_traces

    over = ("method=prune", "budget=1500", "benchmark.limit=3")
    run_job(job(tmp_path, *over))
    path = tmp_path / "traces" / f"{STEM.format('prune', 1500)}.jsonl"
    original = {json.loads(x)["task_id"]: json.loads(x) for x in path.read_text().splitlines()}
    lines = path.read_text().splitlines()
    damaged_task = json.loads(lines[1])["task_id"]
    path.write_text("\n".join([lines[0], lines[1][:-40], lines[2]]) + "\n")  # line 2 cut short
    with caplog.at_level("WARNING"):
        again = run_job(job(tmp_path, *over))
    assert again.ran == 0  # nothing rerun: the graph held the transcript
    assert any("written again from the job's graph" in r.getMessage() for r in caplog.records)
    assert path.with_name(path.name + ".quarantine").exists()  # the broken line is kept, not lost
    eps = {e.task_id: e for e in read_traces(path)}
    assert sorted(eps) == sorted(original)
    restored = [json.loads(x) for x in path.read_text().splitlines() if json.loads(x)["task_id"] == damaged_task]
    assert [r.pop("restored") for r in restored] == [True]  # marked as written again
    # otherwise the same line, but for the agent's tool definitions, which the graph does not keep
    assert original[damaged_task].get("tools") and "tools" not in restored[0]
    assert restored == [{k: v for k, v in original[damaged_task].items() if k != "tools"}]

    # the graph gone as well: by default a warning (a paid model would pay again), nothing rerun; with
    # rerun_untraced=true the episode runs again (a second record for its key; the latest counts)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0][:-40], *lines[1:]]) + "\n")
    for f in (tmp_path / "graphs").iterdir():
        f.unlink()
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert run_job(job(tmp_path, *over)).ran == 0
    assert any("1 done episode(s) have no readable trace line" in r.getMessage() for r in caplog.records)
    assert len(list(read_traces(path))) == 2
    caplog.clear()
    with caplog.at_level("WARNING"):
        third = run_job(job(tmp_path, *over, "rerun_untraced=true"))
    assert third.ran == 1
    assert any("no session in the job's graph: run again" in r.getMessage() for r in caplog.records)
    assert sorted(e.task_id for e in read_traces(path)) == sorted(original)
    assert run_job(job(tmp_path, *over)).ran == 0  # and the job is complete


def test_ctrl_c_stops_a_run_with_a_line_not_a_stack_and_the_same_command_resumes(tmp_path):
    run_dir = tmp_path / "run"
    # slow enough that the ten episodes left after the second cannot finish before the signal lands, even on a
    # loaded machine; the deadline only guards against a run that never starts
    args = ["method=prune", "budget=1500", "benchmark.limit=12", "model._target_=_faults.SlowOracle",
            "+model.delay_s=0.3"]
    cmd = [sys.executable, "-m", "contextrender.experiments.run", f"run_dir={run_dir}", "embedding=hashing",
           "progress=false", f"hydra.run.dir={run_dir}/hydra", *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)])}
    # A test runner started in the background by a shell without job control inherits SIGINT ignored, and so
    # would the run: give it the default disposition, as a terminal's Ctrl-C finds it.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    records = run_dir / "records" / (STEM.format("prune", 1500) + ".jsonl")
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if records.exists() and records.read_text().count("\n") >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:]
    assert "interrupted: the episodes that finished are recorded" in out and "Traceback" not in out
    finished = len(load_records(run_dir))
    assert 2 <= finished < 12
    again = cli(run_dir, *args)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    recs = load_records(run_dir)
    assert len({r["key"] for r in recs}) == 12 and len(recs) == 12  # resumed: nothing twice


def test_a_restored_line_of_an_older_config_neither_supersedes_nor_reads_as_the_newest(tmp_path, caplog):
    """Config A runs 3 tasks, config B task 0 only; A's line of task 2 is lost and written again (it is
    task 2's counted trace). The reader still replays B's task 0 and calls B the newest config."""
    from contextrender.experiments.evaluation.traces import read_traces

    over = ("method=prune", "budget=1500")
    run_job(job(tmp_path, *over, "benchmark.limit=3"))
    run_job(job(tmp_path, *over, "benchmark.limit=1", "limits.max_steps=7"))
    new_hash = config_hash(result_config(job(tmp_path, *over, "limits.max_steps=7")))
    path = tmp_path / "traces" / f"{STEM.format('prune', 1500)}.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == 4
    path.write_text("\n".join([*lines[:2], lines[2][:-40], lines[3]]) + "\n")  # A's task 2 cut short
    assert run_job(job(tmp_path, *over, "benchmark.limit=1", "limits.max_steps=7")).ran == 0
    reader = read_traces(path)
    with caplog.at_level("WARNING"):
        eps = {e.task_id: e for e in reader}
    assert len(eps) == 3
    b_lines = [(n, json.loads(x)["task_id"]) for n, x in enumerate(path.read_text().splitlines(), start=1)
               if json.loads(x)["key"].endswith(new_hash)]
    assert len(b_lines) == 1
    (b_line, b_task), = b_lines
    assert eps[b_task].line == b_line  # B's task is replayed from B's line, not from an older one
    assert any(f"1 task(s) of the newest ({new_hash[:10]}), 2 of older" in r.getMessage() for r in caplog.records)


def test_in_a_sweep_a_refused_job_does_not_stop_the_others(tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "contextrender.experiments.run", "-m", f"run_dir={run_dir}",
                          "embedding=hashing", "progress=false", f"hydra.sweep.dir={tmp_path}/sweep", "model=oracle",
                          "method=prune", "benchmark.limit=1", "budget=0,1500"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "budget must be a positive whole number" in said  # the sweep still fails
    assert len(load_records(run_dir)) == 1  # but the B=1500 job after the refused one ran


def test_a_mistyped_target_is_not_reported_as_a_missing_package():
    from hydra.errors import InstantiationException
    from omegaconf import OmegaConf

    from contextrender.experiments.runtime.runner import MissingPackage, build

    for target in ("contextrender.experiments.benchmarks.bfcll.BFCLMultiTurn", "no_such_pkg_xyz.Thing"):
        with pytest.raises(InstantiationException) as err:
            build(OmegaConf.create({"_target_": target}), "benchmark")
        assert not isinstance(err.value, MissingPackage)


def test_a_benchmark_dependency_that_is_missing_names_the_pinned_environment(tmp_path):
    """A `[service]` install has no τ² dependencies (loguru): the run says which package and that the harness runs
    in `make setup`'s environment, in one line and exit status 2, not a traceback."""
    shadow = tmp_path / "shadow" / "loguru"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'loguru'\", name='loguru')\n")
    out = cli(tmp_path / "run", "model=oracle", "method=prune", "benchmark=tau2_retail", "benchmark.limit=1",
              first_on_path=(shadow.parent,))
    said = out.stdout + out.stderr
    assert out.returncode == 2, said
    assert "the harness needs 'loguru', which is not installed" in out.stderr and "make setup" in out.stderr
    assert "Traceback" not in said and "loguru" not in out.stdout  # the reason on stderr, like every error
    # Nothing of the refused run is left: no records, lock or graph file, and not Hydra's output directory.
    assert not [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert not (tmp_path / "run" / "hydra").exists()


def test_a_sweep_stops_at_a_missing_package_in_one_line(tmp_path):
    """The same under ``-m`` (the README's sweep line): one reason and what to do, exit status 2, no Hydra
    traceback, and the sweep's later jobs are not started only to fail the same way."""
    shadow = tmp_path / "shadow" / "loguru"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'loguru'\", name='loguru')\n")
    out = cli(tmp_path / "run", "model=oracle", "method=prune,full", "benchmark=tau2_retail", "benchmark.limit=1",
              f"hydra.sweep.dir={tmp_path}/sweep", first_on_path=(shadow.parent,), sweep=True)
    said = out.stdout + out.stderr
    assert out.returncode == 2, said
    assert "the harness needs 'loguru', which is not installed" in out.stderr and "the sweep stops here" in out.stderr
    assert "Traceback" not in said and "Error executing job" not in said
    assert "#1 : method=full" not in said  # the second job never started
    assert not (tmp_path / "sweep").exists()  # and nothing of the refused sweep is left


def test_tool_definitions_reach_the_trace_with_secrets_masked_and_their_shape_kept():
    from contextrender.redact import redact_data

    key = "sk-" + "A1b2C3d4" * 5
    tools = [{"type": "function", "function": {"name": "fetch", "description": f"call with {key}",
                                               "parameters": {"type": "object", "required": ["url"],
                                                              "properties": {"url": {"type": "string"}}}}}]
    got = redact_data(tools)
    assert key not in json.dumps(got) and "***" in got[0]["function"]["description"]
    assert got[0]["function"]["parameters"] == tools[0]["function"]["parameters"]  # nothing else touched
