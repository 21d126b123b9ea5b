"""One owner each: the trace line, the record key and its session ids, the replay's one read of a file,
and the runner's job object."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from contextrender import HashingEmbedder
from contextrender.cli import main as cli_main
from contextrender.experiments.evaluation import replay as replay_mod
from contextrender.experiments.evaluation import traces as traces_mod
from contextrender.experiments.evaluation.replay import check_replay_args, replay_traces
from contextrender.experiments.evaluation.traces import TraceReader, parse_episode, write_trace
from contextrender.experiments.records.schema import (
    KeyParts,
    episode_key,
    parse_key,
    record_config,
)
from contextrender.experiments.runtime import runner
from contextrender.experiments.runtime.runner import Job, TraceFile, run_job
from contextrender.graph import ContextGraph, attempt_of, session_of
from contextrender.registry import CONF_DIR
from contextrender.trace_line import trace_line, trace_line_text

DATA = Path(__file__).resolve().parents[1] / "data"
MESSAGES = [{"role": "user", "content": "ünï"}, {"role": "assistant", "content": "ok"}]


def _transcript(n: int) -> list[dict]:
    """A user turn, ``n`` tool calls each answered, and a final answer: a valid replay transcript."""
    msgs: list[dict] = [{"role": "user", "content": "find the order"}]
    for i in range(n):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"q": i})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"order W{1000 + i} status shipped"})
    msgs.append({"role": "assistant", "content": "W1000"})
    return msgs


# -- the trace line -------------------------------------------------------------------

def test_the_trace_line_has_one_shape_and_field_order():
    assert list(trace_line("t", MESSAGES)) == ["task_id", "messages"]
    assert list(trace_line("t", MESSAGES, key="k")) == ["task_id", "key", "messages"]
    assert trace_line("t", MESSAGES, key="k", restored=True) == {"task_id": "t", "key": "k", "messages": MESSAGES,
                                                                 "restored": True}
    assert trace_line_text("t", MESSAGES) == json.dumps({"task_id": "t", "messages": MESSAGES}, ensure_ascii=False)
    with pytest.raises(ValueError):
        trace_line_text("t", [{"role": "user", "content": "x", "score": float("nan")}], allow_nan=False)


def test_every_writer_writes_the_owners_line(tmp_path):
    tf = TraceFile(tmp_path / "traces" / "t.jsonl")
    tf.append("k1", "task-1", MESSAGES)
    tf.append("k2", "task-2", MESSAGES, restored=True)
    assert tf.path.read_text(encoding="utf-8").splitlines() == [
        trace_line_text("task-1", MESSAGES, key="k1"), trace_line_text("task-2", MESSAGES, key="k2", restored=True)]
    exported = tmp_path / "e.jsonl"
    write_trace(exported, "task-e", MESSAGES)
    assert exported.read_text(encoding="utf-8") == trace_line_text("task-e", MESSAGES) + "\n"
    # what the readers parse back
    ep = parse_episode(json.loads(trace_line_text("t", MESSAGES, key=episode_key("m", "b", "t", "x", 1, "h"))), "w")
    assert (ep.task_id, ep.benchmark, list(ep.messages)) == ("t", "b", MESSAGES)


def test_cli_export_writes_the_owners_line(tmp_path, capsys):
    path = tmp_path / "g.sqlite"
    with ContextGraph(path) as g:
        g.session(session_of("k", 0)).sync(MESSAGES)
    assert cli_main(["export", "k", "--graph", str(path)]) == 0
    assert capsys.readouterr().out == trace_line_text("k#0", MESSAGES) + "\n"


# -- the record key and its session ids -----------------------------------------------

def test_a_key_is_built_and_parsed_by_the_records_schema():
    key = episode_key("gpt", "tau2_retail", "task|with|bars", "prune", 1500, "abc123")
    parts = parse_key(key)
    assert parts == KeyParts("gpt", "tau2_retail", "task|with|bars", "prune", "1500", "abc123")
    assert parts.job == "gpt|tau2_retail|prune|1500"
    assert parts.job_task == "gpt|tau2_retail|task|with|bars|prune|1500" == key.rsplit("|", 1)[0]
    assert record_config({"key": key}) == "abc123" and record_config({"key": "a|b|c"}) == ""
    assert parse_key("a|b|c|d|e") is None and parse_key(None) is None


def test_session_ids_are_built_and_parsed_in_one_place():
    key = episode_key("m", "b", "task#7", "prune", 900, "h")  # a task id may hold '#'
    assert session_of(key, 3) == f"{key}#3"
    assert attempt_of(session_of(key, 3)) == (key, 3)
    assert attempt_of(key) is None  # a record key is no session id


# -- replay reads each file once ------------------------------------------------------

def _runner_file(path: Path) -> Path:
    """A runner trace file: task a run under two configs (the first line superseded), task b under the old one."""
    lines = [trace_line_text("a", _transcript(2), key=episode_key("m", "bfcl_x", "a", "prune", 900, "old")),
             trace_line_text("b", _transcript(3), key=episode_key("m", "bfcl_x", "b", "prune", 900, "old")),
             trace_line_text("a", _transcript(2), key=episode_key("m", "bfcl_x", "a", "prune", 900, "new"))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def counted_reads(monkeypatch):
    """How often each file's records were read, and how often the replay opened its trace files."""
    reads: dict[str, int] = {}
    opens: list[object] = []
    real_read, real_open = TraceReader._read, traces_mod.open_traces

    def read(self):
        reads[self.path.name] = reads.get(self.path.name, 0) + 1
        return real_read(self)

    def open_(*a, **k):
        opens.append(a[0])
        return real_open(*a, **k)

    monkeypatch.setattr(TraceReader, "_read", read)
    monkeypatch.setattr(replay_mod, "open_traces", open_)
    return reads, opens


def test_the_cli_replay_reads_each_file_once_and_warns_once(tmp_path, counted_reads, caplog, capsys):
    reads, opens = counted_reads
    _runner_file(tmp_path / "runner.jsonl")
    (tmp_path / "plain.jsonl").write_text(trace_line_text("c", _transcript(2)) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        code = cli_main(["replay", str(tmp_path), "--budget", "300", "--methods", "prune", "--embedding", "hashing",
                         "--format", "json"])
    assert code == 0, capsys.readouterr().err
    assert reads == {"runner.jsonl": 1, "plain.jsonl": 1} and len(opens) == 1
    said = [r.getMessage() for r in caplog.records]
    assert sum("not replayed" in m for m in said) == 1 and sum("replays lines of 2 configs" in m for m in said) == 1
    res = json.loads(capsys.readouterr().out)
    assert res["traces"] == 3 and res["benchmark"]["name"] is None


def test_a_loaded_trace_set_replays_without_its_files_as_the_paths_do(tmp_path):
    path = _runner_file(tmp_path / "runner.jsonl")
    plain = replay_traces(path, 300, ["prune"], embedder=HashingEmbedder(dim=64), ceiling=False).to_json()
    found = check_replay_args(path, 300, ["prune"])
    found.load()
    path.rename(tmp_path / "moved.jsonl")  # nothing the replay does may read the file again
    again = replay_traces(found, 300, ["prune"], embedder=HashingEmbedder(dim=64), ceiling=False).to_json()
    assert again == plain and again["benchmark"] == {"name": "bfcl_x", "from": "traces"}
    assert found.total_hint() == 3


def test_the_hydra_replay_opens_its_files_once(tmp_path, counted_reads):
    reads, opens = counted_reads
    path = _runner_file(tmp_path / "runner.jsonl")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("replay", overrides=[f"traces={path}", "embedding=hashing", "progress=false",
                                           "methods=[prune]", "benchmark_name=bfcl_x", f"output={tmp_path / 'out.json'}"])
    out = replay_mod.run(cfg)
    # benchmark_name given: no probe of the files' first records for the benchmark they record
    assert out["traces"] == 2 and len(opens) == 1 and reads == {"runner.jsonl": 1}


def test_replay_traces_still_checks_the_budget_and_methods_of_a_trace_set(tmp_path):
    found = check_replay_args(_runner_file(tmp_path / "r.jsonl"), 300, ["prune"])
    with pytest.raises(ValueError, match="budget must be positive, got 0"):
        replay_traces(found, 0, ["prune"])
    with pytest.raises(ValueError, match="methods is empty"):
        replay_traces(found, 300, [])


# -- the runner's job object ----------------------------------------------------------

def test_run_job_runs_a_job_object(tmp_path, monkeypatch):
    built: list[Job] = []
    real_run = Job.run

    def run(self):
        built.append(self)
        return real_run(self)

    monkeypatch.setattr(runner.Job, "run", run)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"run_dir={tmp_path}", "embedding=hashing", "progress=false",
                                           "model=oracle", "method=prune", "budget=1500", "benchmark.limit=2"])
    summary = run_job(cfg)
    [job] = built
    assert (job.budget, job.method_name) == (1500, "prune")
    assert job.stem == f"{job.model.name}__{job.benchmark.name}__prune__B1500"
    assert (summary.done, summary.ran, summary.errors) == (2, 2, 0) and job.tally.ran == 2
    keys = sorted(job.keys.values())
    with ContextGraph(tmp_path / "graphs" / f"{job.stem}.sqlite") as g:
        assert sorted(g.session_ids()) == [session_of(k, 0) for k in keys]
    lines = [json.loads(x) for x in (tmp_path / "traces" / f"{job.stem}.jsonl").read_text().splitlines()]
    assert sorted(x["key"] for x in lines) == keys and all(list(x) == ["task_id", "key", "messages", "tools"] for x in lines)
