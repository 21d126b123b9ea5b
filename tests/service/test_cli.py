"""The ``contextrender`` CLI: serve, proxy and export as real processes on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from contextrender.cli import build_parser, main
from contextrender.graph import ContextGraph

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read() if proc.stderr else "process exited")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError("server did not come up")


def test_parser():
    p = build_parser()
    a = p.parse_args(["proxy", "--upstream", "http://127.0.0.1:1/v1", "--budget", "3000", "--method", "cr_recency",
                      "--port", "9999", "--override", "lam=0.5", "--override", "weights.reuse=0"])
    assert (a.budget, a.method, a.port, a.host) == (3000, "cr_recency", 9999, "127.0.0.1")
    assert dict(a.override) == {"lam": 0.5, "weights.reuse": 0}
    with pytest.raises(SystemExit):
        p.parse_args(["proxy", "--budget", "10"])  # --upstream is required


def test_version_is_the_package_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"contextrender {version('contextrender')}"


def test_export(tmp_path, capsys):
    graph = tmp_path / "g.sqlite"
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with ContextGraph(graph) as g:
        g.session("task-1").sync(msgs)
    out = tmp_path / "traces.jsonl"
    assert main(["export", "task-1", "--graph", str(graph), "--out", str(out)]) == 0
    assert main(["export", "task-1", "--graph", str(graph), "--out", str(out)]) == 0  # appends
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0]) == {"task_id": "task-1", "messages": msgs}
    assert main(["export", "task-1", "--graph", str(graph)]) == 0
    assert json.loads(capsys.readouterr().out)["task_id"] == "task-1"
    assert main(["export", "nope", "--graph", str(graph)]) == 2
    assert main(["export", "task-1", "--graph", str(tmp_path / "missing.sqlite")]) == 2


def test_replay_of_an_exported_session_names_the_file_format_not_a_method(tmp_path, capsys):
    graph = tmp_path / "g.sqlite"
    with ContextGraph(graph) as g:
        g.session("wrap-1").sync([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    out = tmp_path / "my_traces.jsonl"
    assert main(["export", "wrap-1", "--graph", str(graph), "--out", str(out)]) == 0
    assert main(["replay", str(out), "--budget", "500", "--methods", "full,prune", "--embedding", "hashing"]) == 0
    printed = capsys.readouterr().out
    assert f"- {out}: trace lines (export, wrap, the harness), 1 episodes" in printed, printed
    assert ": contextrender," not in printed  # a file's format, never read as the method that rendered it


def test_a_harness_record_key_names_its_latest_session_and_a_wrong_name_lists_some(tmp_path, capsys):
    graph = tmp_path / "g.sqlite"
    key = "oracle|tau2_retail|2|full|2000|38c7d0dd19e281f2"
    with ContextGraph(graph) as g:
        for attempt, text in ((0, "first try"), (1, "second try")):
            g.session(f"{key}#{attempt}").sync([{"role": "user", "content": text}])
    assert main(["export", key, "--graph", str(graph)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["task_id"] == f"{key}#1" and line["messages"][0]["content"] == "second try"
    assert main(["export", f"{key}#0", "--graph", str(graph)]) == 0  # an exact id as before
    assert json.loads(capsys.readouterr().out)["messages"][0]["content"] == "first try"
    assert main(["explain", "0", "--graph", str(graph), "--budget", "100", "--embedding", "hashing"]) == 2
    err = capsys.readouterr().err
    assert "no session '0'" in err and "it holds 2, e.g." in err and f"'{key}#0'" in err
    assert "<record key>#<attempt>" in err


@pytest.mark.slow
def test_serve_and_proxy_processes(tmp_path):
    graph = tmp_path / "g.sqlite"
    port, pport = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    serve = subprocess.Popen([sys.executable, "-m", "contextrender.cli", "serve", "--port", str(port), "--graph",
                              str(graph), "--embedding", "hashing", "--log-level", "warning"],
                             env=env, stderr=subprocess.PIPE, text=True)
    proxy = subprocess.Popen([sys.executable, "-m", "contextrender.cli", "proxy", "--upstream",
                              f"http://127.0.0.1:{port}/v1", "--port", str(pport), "--graph",
                              str(tmp_path / "p.sqlite"), "--embedding", "hashing", "--budget", "500",
                              "--log-level", "warning"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        url, purl = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{pport}"
        wait_health(url, serve)
        wait_health(purl, proxy)
        r = httpx.post(f"{url}/sessions/cli1/render", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200 and r.json()["tokens"] == 0
        assert httpx.get(f"{purl}/health").json()["default_budget"] == 500
        # The "upstream" here has no /v1/models: its 404 passes through the proxy.
        assert httpx.get(f"{purl}/v1/models").status_code == 404
    finally:
        for p in (serve, proxy):
            p.send_signal(signal.SIGINT)
        for p in (serve, proxy):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    with ContextGraph(graph) as g:
        assert "cli1" in g.session_ids()
    # one start-up line: the listen address, each API's upstream URL, B, the method, the embedder, the graph
    started = [ln for ln in proxy.stderr.read().splitlines() if ln.startswith("contextrender proxy: listening")]
    assert started == [f"contextrender proxy: listening on http://127.0.0.1:{pport}; Chat Completions -> "
                       f"http://127.0.0.1:{port}/v1/chat/completions; Responses -> http://127.0.0.1:{port}/v1/responses; "
                       f"Messages -> http://127.0.0.1:{port}/v1/messages; B=500, method=contextrender_plus, "
                       f"embedder=hashing-256, graph={tmp_path / 'p.sqlite'}"], started


def test_a_port_in_use_is_a_clear_error_and_leaves_no_graph_file(tmp_path):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        graph = tmp_path / "p.sqlite"
        proc = subprocess.run([sys.executable, "-m", "contextrender.cli", "proxy", "--upstream",
                               "http://127.0.0.1:9/v1", "--port", str(port), "--graph", str(graph),
                               "--embedding", "hashing"], env={**os.environ, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in proc.stderr and "--port" in proc.stderr
    assert not list(tmp_path.glob("p.sqlite*"))


def test_view_of_a_missing_trace_file_says_the_file_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONTEXTRENDER_GRAPH", raising=False)
    assert main(["view", "runs/nosuch.jsonl", "--budget", "1000", "--embedding", "hashing"]) == 2
    err = capsys.readouterr().err
    assert "no trace file runs/nosuch.jsonl" in err and "--graph FILE" in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_view_of_a_missing_trace_file_beside_a_graph_says_the_file_is_missing_first(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONTEXTRENDER_GRAPH", raising=False)
    with ContextGraph(tmp_path / "contextrender.sqlite") as g:  # the service's default graph, as after a `wrap`
        g.session("s1").sync([{"role": "user", "content": "hi"}])
    assert main(["view", "traces.jsonl", "--budget", "1000", "--embedding", "hashing"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("contextrender view: no trace file traces.jsonl, and no session 'traces.jsonl'"), err
    assert "'s1'" in err
