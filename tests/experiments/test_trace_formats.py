"""Reading other harnesses' result files as replay traces (experiments/evaluation/traces.py).

The fixtures are real files: ``tests/data/tau2/`` was written by ``tau2 run``
itself and ``tests/data/bfcl/`` by bfcl-eval's own handler and writer (both
with scripted models; see ``tests/data/make_tau2_fixture.py`` and
``make_bfcl_fixture.py``); ``tests/data/taubench/`` is hand-built after the
published τ-bench v1 format (``make_taubench_fixture.py``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from contextrender.experiments.evaluation.recall import reuse_events
from contextrender.experiments.evaluation.traces import (
    TraceError,
    open_traces,
    read_traces,
    shown_path,
    sniff,
)
from contextrender.graph import ContextGraph

DATA = Path(__file__).resolve().parents[1] / "data"
TAU2_RETAIL = DATA / "tau2" / "scripted_retail.json"
TAU2_TELECOM = DATA / "tau2" / "scripted_telecom.json"
BFCL = DATA / "bfcl" / "scripted-model-FC" / "multi_turn" / "BFCL_v4_multi_turn_base_result.json"
TAUBENCH = next((DATA / "taubench").glob("*.json"))
OURS = DATA / "react_traces.jsonl"
FIXTURES = {"tau2": TAU2_RETAIL, "bfcl": BFCL, "taubench": TAUBENCH, "contextrender": OURS}


def raw(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


# -- the fixtures are the real formats ------------------------------------------------------

def test_tau2_fixture_validates_with_tau2s_own_model():
    simulation = pytest.importorskip("tau2.data_model.simulation")
    for path in (TAU2_RETAIL, TAU2_TELECOM):
        results = simulation.Results.load(path)  # tau2's own loader and pydantic models
        assert results.info.agent_info.implementation == "llm_agent"
        assert all(s.reward_info.reward == 1.0 for s in results.simulations)  # tau2's evaluator passed them
    assert [s.trial for s in simulation.Results.load(TAU2_RETAIL).simulations] == [0, 1]
    requestors = {tc.requestor for m in simulation.Results.load(TAU2_TELECOM).simulations[0].messages
                  if m.role == "user" for tc in (m.tool_calls or [])}
    assert requestors == {"user"}  # telecom's user simulator acted on its own phone tools


def test_bfcl_fixture_has_the_keys_bfcl_writes():
    lines = [json.loads(line) for line in BFCL.read_text().splitlines()]
    assert [r["id"] for r in lines] == ["multi_turn_base_0", "multi_turn_base_41"]
    for r in lines:  # _llm_response_generation.multi_threaded_inference: {"id", "result", **metadata}
        assert list(r) == ["id", "result", "input_token_count", "output_token_count", "latency", "inference_log"]
        kinds = {type(e).__name__ for e in r["inference_log"]}
        assert kinds == {"list", "dict"}  # state_info snapshots and turns


# -- detection ------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", sorted(FIXTURES))
def test_format_is_recognised_by_content_not_name(tmp_path, fmt):
    misnamed = tmp_path / ("traces.jsonl" if fmt != "contextrender" else "results.json")
    shutil.copy(FIXTURES[fmt], misnamed)
    assert sniff(misnamed).format == fmt
    reader = read_traces(misnamed)
    assert len(list(reader)) >= 1 and reader.format == fmt


def test_files_of_no_trace_format_are_named():
    summary = DATA / "tau2" / "scripted_retail_results.json"  # tau2 run's summary beside its results
    s = sniff(summary)
    assert s.format is None and "num_simulations" in s.reason and not s.broken
    with pytest.raises(TraceError, match=r"scripted_retail_results\.json: not a trace file of a known format"):
        list(read_traces(summary))


def test_a_forced_format_is_used_and_checked(tmp_path):
    reader = read_traces(TAU2_RETAIL, format="tau2")
    assert len(list(reader)) == 2
    with pytest.raises(TraceError, match=r"react_traces\.jsonl:2: invalid JSON at column 1: Extra data; the file "
                                         r"holds several JSON values \(JSONL\?\), not the one document a tau2 file is"):
        list(read_traces(OURS, format="tau2"))
    with pytest.raises(TraceError, match=r"v1\.json: not a τ² Results file \(expected an object with a "
                                         r"'simulations' list, got list\)"):
        list(read_traces(shutil.copy(TAUBENCH, tmp_path / "v1.json"), format="tau2"))
    with pytest.raises(ValueError, match="unknown trace format 'xml'"):
        open_traces(OURS, format="xml")


# -- τ²: the agent's view -------------------------------------------------------------------

def test_tau2_retail_is_read_as_the_agent_saw_it():
    tau2_llm_utils = pytest.importorskip("tau2.utils.llm_utils")
    from tau2.agent.base import is_valid_agent_history_message
    from tau2.agent.llm_agent import LLMAgent
    from tau2.data_model.simulation import Results

    reader = read_traces(TAU2_RETAIL)
    eps = list(reader)
    assert [e.task_id for e in eps] == ["0/trial-0", "0/trial-1"]  # task id + trial: one episode per trial
    assert {e.benchmark for e in eps} == {"tau2_retail"}
    assert eps[1].where == f"{TAU2_RETAIL}: simulations[1]"
    results = Results.load(TAU2_RETAIL)
    policy = results.info.environment_info.policy
    assert eps[0].messages[0] == {"role": "system", "content": LLMAgent(tools=[], domain_policy=policy).system_prompt}
    assert reader.summary()["system_prompt"] == "tau2 LLMAgent.system_prompt with the file's policy"
    # The rest is exactly what tau2 sends the agent's model (to_litellm_messages of the agent's history).
    sent = tau2_llm_utils.to_litellm_messages(
        [m for m in results.simulations[0].messages if is_valid_agent_history_message(m)])
    for ours, theirs in zip(eps[0].messages[1:], sent, strict=True):
        assert ours["role"] == theirs["role"] and ours["content"] == theirs["content"]
        if theirs["role"] == "tool":
            assert ours["tool_call_id"] == theirs["tool_call_id"]
        if theirs.get("tool_calls"):
            assert ours["tool_calls"] == [{"id": c["id"], "type": "function", "function": c["function"]}
                                          for c in theirs["tool_calls"]]


def test_reading_tau2_results_keeps_tau2s_import_logs_out_and_its_logging_on():
    """A fresh interpreter (tau2 not imported yet): the reader imports tau2 to rebuild the system prompt;
    tau2's import-time loguru lines (a missing .env, litellm's cache) do not reach stderr, and tau2's
    logging is enabled again afterwards (nothing else of the caller's loguru setup changes)."""
    pytest.importorskip("tau2.agent.llm_agent")
    code = ("import sys\n"
            "from loguru import logger\n"
            "from contextrender.experiments.evaluation.traces import read_traces\n"
            f"eps = list(read_traces({str(TAU2_RETAIL)!r}))\n"
            "assert 'tau2.agent.llm_agent' in sys.modules and eps[0].messages[0]['role'] == 'system'\n"
            "logger.remove(); logger.add(sys.stdout, format='{name}|{message}')\n"
            # loguru decides by the calling module's __name__: a call made as a tau2 module would
            "exec(\"logger.warning('after-read')\", {'__name__': 'tau2.probe', 'logger': logger})\n")
    import subprocess
    import sys

    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # tau2 imports litellm: no network cost map
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "No .env file found" not in done.stderr and "tau2." not in done.stderr, done.stderr
    assert "tau2.probe|after-read" in done.stdout  # tau2's messages pass again after the read


def test_reading_tau2_results_leaves_a_callers_disabled_tau2_logging_disabled():
    """The caller silenced tau2 (or every library) before the reader first imported it: it stays so."""
    pytest.importorskip("tau2.agent.llm_agent")
    import subprocess
    import sys

    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    for silence in ("logger.disable('tau2')", "logger.disable('')"):
        code = ("import sys\n"
                "from loguru import logger\n"
                f"{silence}\n"
                "from contextrender.experiments.evaluation.traces import read_traces\n"
                f"eps = list(read_traces({str(TAU2_RETAIL)!r}))\n"
                "assert 'tau2.agent.llm_agent' in sys.modules\n"
                "logger.remove(); logger.add(sys.stdout, format='{name}|{message}')\n"
                "exec(\"logger.warning('after-read')\", {'__name__': 'tau2.probe', 'logger': logger})\n"
                "exec(\"logger.warning('other')\", {'__name__': 'mine.probe', 'logger': logger})\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        assert "after-read" not in done.stdout, (silence, done.stdout)  # still silenced after the read
        # ... and the rest of the caller's setup is as it was: everything off, or only tau2 off
        assert ("mine.probe|other" in done.stdout) == (silence == "logger.disable('tau2')"), done.stdout


def test_tau2_arguments_become_the_string_tau2_sends_back():
    [first_call] = [m for m in next(iter(read_traces(TAU2_RETAIL))).messages if m.get("tool_calls")][:1]
    stored = raw(TAU2_RETAIL)["simulations"][0]["messages"][4]["tool_calls"][0]["arguments"]
    assert stored == {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}  # tau2 keeps the dict
    # The model emitted '{"first_name":"Yusuf",...}' (compact); tau2 kept only the dict and re-sends
    # json.dumps(dict): keys in order, ", " and ": " separators. The recall turn text uses that string.
    assert first_call["tool_calls"][0]["function"]["arguments"] == \
        '{"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}'


def test_tau2_telecom_drops_the_user_simulators_own_tool_calls():
    pytest.importorskip("tau2")
    [ep] = list(read_traces(TAU2_TELECOM))
    sim = raw(TAU2_TELECOM)["simulations"][0]["messages"]
    user_calls = [m for m in sim if m["role"] == "user" and m.get("tool_calls") is not None]
    user_results = [m for m in sim if m["role"] == "tool" and m["requestor"] == "user"]
    assert len(user_calls) == len(user_results) == 3
    assert len(ep.messages) == 1 + len(sim) - 6  # the system prompt, minus the user side's 3 calls and 3 results
    assert not any(m["role"] == "user" and m.get("tool_calls") for m in ep.messages)
    ours_ids = {m["tool_call_id"] for m in ep.messages if m["role"] == "tool"}
    assert ours_ids == {c["id"] for m in ep.messages if m["role"] == "assistant" for c in m.get("tool_calls") or []}
    assert not ({m["id"] for m in user_results} & ours_ids)
    assert not any("Status Bar:" in (m.get("content") or "") for m in ep.messages if m["role"] == "tool")
    assert ep.benchmark == "tau2_telecom"
    # Values the agent looked up (C1001, L1002) are reused later: the replay has events to score.
    assert len(reuse_events(list(ep.messages))) >= 3


def test_tau2_without_an_llm_agent_has_no_system_prompt(tmp_path):
    doc = raw(TAU2_RETAIL)
    doc["info"]["agent_info"]["implementation"] = "llm_agent_gt"
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(doc))
    reader = read_traces(path)
    eps = list(reader)
    assert eps[0].messages[0]["role"] == "assistant"  # the greeting; no system message invented
    assert reader.summary()["system_prompt"].startswith("none (agent 'llm_agent_gt'")


def test_tau2_skipped_simulations_are_excluded_not_errors(tmp_path):
    doc = raw(TAU2_RETAIL)
    doc["simulations"].append({**doc["simulations"][0], "id": "0_2_failed", "trial": 2, "messages": [],
                               "skipped": True, "termination_reason": "agent_error"})
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    reader = read_traces(path)  # strict
    assert len(list(reader)) == 2
    assert reader.summary()["excluded"] == {"skipped by tau2 (agent_error)": 1}


# -- τ-bench v1 -----------------------------------------------------------------------------

def test_taubench_trajectory_is_kept_whole():
    reader = read_traces(TAUBENCH)
    [ep] = list(reader)
    record = raw(TAUBENCH)[0]
    assert ep.task_id == "0/trial-0" and ep.where == f"{TAUBENCH}: [0]" and ep.benchmark is None
    assert list(ep.messages) == record["traj"]
    assert reader.summary()["excluded"] == {"the task raised (tau_bench/run.py records traj=[] and the error)": 1}


def test_taubench_reused_call_id_pairs_each_result_with_the_latest_call(tmp_path):
    [ep] = list(read_traces(TAUBENCH))
    session = ContextGraph(tmp_path / "g.sqlite").session("s")
    session.extend(list(ep.messages))
    names = [session.result(s).tool_name for s in range(len(ep.messages)) if session.is_result(s)]
    assert names == ["find_user_id_by_name_zip", "get_user_details", "get_order_details",
                     "return_delivered_order_items"]  # the reused id answers get_order_details second


# -- BFCL -----------------------------------------------------------------------------------

def test_bfcl_inference_log_becomes_chat_messages():
    eps = list(read_traces(BFCL))
    assert [e.task_id for e in eps] == ["multi_turn_base_0", "multi_turn_base_41"]
    assert {e.benchmark for e in eps} == {"bfcl_multi_turn_base"} and eps[1].where == f"{BFCL}:2"
    rec = json.loads(BFCL.read_text().splitlines()[0])
    turns = [t for t in rec["inference_log"] if isinstance(t, dict)]
    # Expected messages, counted from the file: per turn its query, per step one assistant message, its outputs.
    n_user = sum(len(t["begin_of_turn_query"]) for t in turns)
    steps = [s for t in turns for k, s in t.items() if k.startswith("step_")]
    n_tool = sum(1 for s in steps for e in s if e["role"] == "tool")
    msgs = eps[0].messages
    assert [m["role"] for m in msgs].count("user") == n_user
    assert [m["role"] for m in msgs].count("assistant") == len(steps)
    assert [m["role"] for m in msgs].count("tool") == n_tool
    assert len(msgs) == n_user + len(steps) + n_tool  # state_info and handler_log are dropped
    first = msgs[1]
    assert first["tool_calls"] == [  # one step, two parallel calls; arguments exactly as the model emitted them
        {"id": "bfcl-0-0-0", "type": "function", "function": {"name": "cd", "arguments": '{"folder":"document"}'}},
        {"id": "bfcl-0-0-1", "type": "function", "function": {"name": "mkdir", "arguments": '{"dir_name":"temp"}'}}]
    assert [m["tool_call_id"] for m in msgs[2:4]] == ["bfcl-0-0-0", "bfcl-0-0-1"]
    assert msgs[2]["content"] == turns[0]["step_0"][2]["content"]
    assert any(m["role"] == "assistant" and m["content"] == "Done: cd, mkdir, mv." for m in msgs)
    assert len(reuse_events(list(eps[1].messages))) == 4  # USR002 from get_user_id, reused two turns on


def _bfcl_line(**change):
    rec = json.loads(BFCL.read_text().splitlines()[0])
    rec.update(change)
    return rec


def test_bfcl_prompting_mode_and_single_turn_files_are_refused(tmp_path):
    rec = _bfcl_line()
    turn = next(t for t in rec["inference_log"] if isinstance(t, dict))
    turn["step_0"][0]["content"] = "[cd(folder='document'), mkdir(dir_name='temp')]"  # calls as text
    path = tmp_path / "BFCL_v4_multi_turn_base_result.json"
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(TraceError, match=r"_result\.json:1: inference_log\[1\]\.step_0: tool outputs after a text "
                                         r"response: a prompting-mode result"):
        list(read_traces(path))
    path.write_text(json.dumps({"id": "simple_python_3", "result": [{"f": "{}"}], "input_token_count": 1}) + "\n")
    with pytest.raises(TraceError, match=r":1: no 'inference_log' \(a single-turn category"):
        list(read_traces(path, format="bfcl"))


def test_bfcl_inference_errors_are_excluded(tmp_path):
    path = tmp_path / "r_result.json"
    err = {"id": "multi_turn_base_7", "result": "Error during inference: timed out", "traceback": "..."}
    path.write_text(BFCL.read_text() + json.dumps(err) + "\n")
    reader = read_traces(path)
    assert len(list(reader)) == 2 and reader.summary()["excluded"] == {"inference error recorded by BFCL": 1}


# -- malformed records: file:line or file: record index, strict and lenient -----------------

def _tau2_with_bad_second_simulation(tmp_path) -> Path:
    doc = raw(TAU2_RETAIL)
    del doc["simulations"][1]["messages"]
    path = tmp_path / "tau2.json"
    path.write_text(json.dumps(doc, indent=2))
    return path


def test_tau2_bad_record_is_named_by_index(tmp_path):
    path = _tau2_with_bad_second_simulation(tmp_path)
    with pytest.raises(TraceError, match=r"tau2\.json: simulations\[1\]: missing key 'messages'"):
        list(read_traces(path))
    reader = read_traces(path, strict=False)
    assert [e.task_id for e in reader] == ["0/trial-0"] and reader.skipped == 1
    assert reader.errors == [f"{path}: simulations[1]: missing key 'messages'"]


def test_tau2_unknown_tool_result_is_named_with_its_message(tmp_path):
    doc = raw(TAU2_RETAIL)
    doc["simulations"][0]["messages"][5]["id"] = "call_nobody_made"
    path = tmp_path / "tau2.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match=r"tau2\.json: simulations\[0\]: message \d+: tool result for call id "
                                         r"'call_nobody_made'"):
        list(read_traces(path))


def test_a_truncated_json_document_names_the_line(tmp_path):
    text = TAU2_RETAIL.read_text()
    path = tmp_path / "tau2.json"
    path.write_text(text[: len(text) // 2])  # a run killed while writing
    with pytest.raises(TraceError, match=r"tau2\.json:\d+: invalid JSON"):
        list(read_traces(path, format="tau2"))
    with pytest.raises(TraceError, match=r"tau2\.json: invalid JSON at line \d+, column \d+: .* \(a file cut off"):
        list(read_traces(path))  # by content: recognisably broken, and where
    reader = read_traces(path, strict=False)
    assert list(reader) == [] and reader.skipped == 1


def test_replay_of_a_truncated_file_offers_lenient_which_warns_once(tmp_path, capsys, caplog):
    from contextrender.cli import main

    text = TAU2_RETAIL.read_text()
    path = tmp_path / "tau2.json"
    path.write_text(text[: len(text) // 2])
    args = ["replay", str(path), "--budget", "1000", "--methods", "contextrender", "--embedding", "hashing"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "invalid JSON at line" in err and "column" in err and "--lenient replays what can be read" in err
    with caplog.at_level(logging.WARNING):
        assert main([*args, "--lenient"]) == 2  # nothing readable: still no result, but said once
    skips = [r for r in caplog.records if r.getMessage().startswith("skipping ")]
    assert len(skips) == 1, [r.getMessage() for r in skips]


def test_taubench_bad_record_is_named_by_index(tmp_path):
    doc = raw(TAUBENCH)
    doc.insert(0, {"task_id": 5, "reward": 0.0, "info": {}, "traj": [
        {"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "x", "content": "?"}], "trial": 0})
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(doc, indent=2))
    with pytest.raises(TraceError, match=r"v1\.json: \[0\]: message 1: tool result for call id 'x'"):
        list(read_traces(path))
    reader = read_traces(path, strict=False)
    assert [e.task_id for e in reader] == ["0/trial-0"] and reader.skipped == 1


def test_bfcl_bad_line_is_named_by_line(tmp_path):
    lines = BFCL.read_text().splitlines()
    path = tmp_path / "x_result.json"
    path.write_text(lines[0] + "\n{\"id\": \"multi_turn_base_9\", \"inference_log\": [\n" + lines[1] + "\n")
    with pytest.raises(TraceError, match=r"x_result\.json:2: invalid JSON"):
        list(read_traces(path))
    reader = read_traces(path, strict=False)
    assert [e.task_id for e in reader] == ["multi_turn_base_0", "multi_turn_base_41"] and reader.skipped == 1


def test_our_trace_lines_carry_the_recorded_benchmark(tmp_path):
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"task_id": "t", "key": "oracle|moqa8_offline|t|full|2000|abc", "messages": msgs})
                    + "\n" + json.dumps({"task_id": "u", "messages": msgs}) + "\n")
    assert [e.benchmark for e in read_traces(path)] == ["moqa8_offline", None]


# -- files, directories, globs --------------------------------------------------------------

def test_a_directory_reads_every_trace_file_and_lists_the_others(tmp_path):
    shutil.copytree(DATA / "tau2", tmp_path / "tau2")
    shutil.copytree(DATA / "bfcl", tmp_path / "bfcl")
    shutil.copy(TAUBENCH, tmp_path / "v1.json")
    shutil.copy(OURS, tmp_path / "ours.jsonl")
    (tmp_path / "notes.txt").write_text("not a trace")
    (tmp_path / ".hidden.jsonl").write_text("{broken")
    found = open_traces(tmp_path)
    eps = list(found)
    summary = found.summary()
    assert [(Path(f["path"]).relative_to(tmp_path.resolve()).as_posix(), f["format"], f["episodes"])
            for f in summary["files"]] == [
        ("bfcl/scripted-model-FC/multi_turn/BFCL_v4_multi_turn_base_result.json", "bfcl", 2),
        ("ours.jsonl", "contextrender", 2),
        ("tau2/scripted_retail.json", "tau2", 2),
        ("tau2/scripted_telecom.json", "tau2", 1),
        ("tau2/scripted_telecom_solo.json", "tau2", 1),
        ("v1.json", "taubench", 1)]
    assert len(eps) == 9
    ignored = {Path(i["path"]).name: i["reason"] for i in summary["ignored"]}
    assert set(ignored) == {"notes.txt", "scripted_retail_results.json", "scripted_retail_termination_summary.json",
                            "scripted_telecom_results.json", "scripted_telecom_termination_summary.json",
                            "scripted_telecom_solo_results.json", "scripted_telecom_solo_termination_summary.json"}
    assert ignored["notes.txt"] == "not JSON"


def test_files_under_the_working_directory_are_named_relative_to_it(tmp_path, monkeypatch):
    """A replay output names a file under the working directory by its relative path (results written
    from a checkout carry no home directory), and any other file by its absolute path."""
    (tmp_path / "work").mkdir()
    shutil.copy(OURS, tmp_path / "work" / "ours.jsonl")
    shutil.copy(TAUBENCH, tmp_path / "v1.json")
    monkeypatch.chdir(tmp_path / "work")
    found = open_traces(["ours.jsonl", str(tmp_path / "v1.json")])
    list(found)
    assert [f["path"] for f in found.summary()["files"]] == ["ours.jsonl", str((tmp_path / "v1.json").resolve())]
    monkeypatch.chdir("/")  # from the root every path stays absolute
    assert shown_path(tmp_path / "v1.json") == str((tmp_path / "v1.json").resolve())


def test_globs_and_lists(tmp_path):
    found = open_traces(str(DATA / "tau2" / "scripted_*.json"))
    assert [Path(r.path).name for r in found.readers] == ["scripted_retail.json", "scripted_telecom.json",
                                                          "scripted_telecom_solo.json"]
    assert len(found.ignored) == 6
    found = open_traces([TAU2_RETAIL, BFCL, TAU2_RETAIL])  # a file named twice is read once
    assert [r.format for r in found.readers if r.resolve_format()] == ["tau2", "bfcl"]


def test_nothing_to_read_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such trace file or directory"):
        open_traces(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no file matches this pattern"):
        open_traces(str(tmp_path / "*.json"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"empty\.jsonl: the trace file is empty"):
        open_traces(tmp_path / "empty.jsonl")
    with pytest.raises(ValueError, match="no trace file"):
        open_traces(tmp_path)  # only an empty file inside
    shutil.copy(DATA / "tau2" / "scripted_retail_results.json", tmp_path / "summary.json")
    with pytest.raises(ValueError, match=r"no trace file \(.*summary\.json: JSON of no trace format"):
        open_traces(tmp_path)


def test_a_broken_file_in_a_directory_is_an_error_not_ignored(tmp_path):
    shutil.copy(TAU2_RETAIL, tmp_path / "a.json")
    (tmp_path / "b.json").write_text(TAU2_RETAIL.read_text()[:5000])
    with pytest.raises(TraceError, match=r"b\.json: invalid JSON"):
        list(open_traces(tmp_path))
    found = open_traces(tmp_path, strict=False)
    assert len(list(found)) == 2 and found.skipped == 1
