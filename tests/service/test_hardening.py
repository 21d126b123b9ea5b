"""Hardening of the services and the CLI: a client that leaves, JSON errors everywhere (a huge budget
header, a '?' smuggled into a passthrough path, a full disk), the graph lock keyed by the file's
identity, transcripts written without following symlinks, strict budgets, damaged graph files, and the
CLI's missing extras, recorded embedder, episode ids and defaults — all against real SQLite files,
real processes and real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import json
import os
import random
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextrender import HashingEmbedder
from contextrender.cli import build_parser, main
from contextrender.graph import ContextGraph
from contextrender.service.proxy import create_proxy_app
from contextrender.service.server import create_app
from contextrender.service.sessions import ContextService

from .conftest import serve

REPO = Path(__file__).resolve().parents[2]


def _is_error_json(r: httpx.Response, status: int) -> dict[str, Any]:
    """The services' error shape: ``{"detail": str, "error": {"message", "type", "code"}}``, as JSON."""
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.headers["content-type"]
    body = r.json()
    assert isinstance(body["detail"], str) and body["error"]["message"] == body["detail"], body
    assert body["error"]["code"] == status
    return body


# -- B: a client that leaves while the upstream hangs ------------------------------------------


class ScriptedUpstream:
    """A raw HTTP/1.1 server on 127.0.0.1: a chat completion whose model is ``hang`` never gets an answer
    (the connection is held open until the proxy closes it: :attr:`closed` is set then); any other model
    gets a one-message completion."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.hanging = threading.Event()  # a hanging request arrived
        self.closed = threading.Event()  # its connection was closed by the proxy
        self.answered = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, body = data.split(b"\r\n\r\n", 1)
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            request = json.loads(body or b"{}")
            if request.get("model") == "hang-error":  # an error whose body never finishes
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                             b"content-length: 100000\r\n\r\n{\"error\": ")
            if request.get("model") in ("hang", "hang-error"):
                self.hanging.set()
                conn.settimeout(120)
                try:
                    while conn.recv(65536):
                        pass
                except OSError:
                    return
                self.closed.set()  # the peer (the proxy) closed the connection
                return
            answer = json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": request.get("model"),
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": "hello"}}]}).encode()
            self.answered += 1
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                         + f"content-length: {len(answer)}\r\n\r\n".encode() + answer)

    def close(self) -> None:
        self.sock.close()


def test_a_client_that_leaves_frees_the_session_and_cancels_the_upstream(tmp_path):
    upstream = ScriptedUpstream()
    svc = ContextService(str(tmp_path / "g.sqlite"), embedder=HashingEmbedder(dim=64), warm=False)
    upstream_timeout = 60.0
    try:
        app = create_proxy_app(upstream.url, service=svc, budget=1500, timeout=upstream_timeout)
        with serve(app) as url:
            body = {"messages": [{"role": "user", "content": "hi"}]}
            headers = {"x-contextrender-session": "leaver"}
            with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
                httpx.post(f"{url}/v1/chat/completions", json={**body, "model": "hang"}, headers=headers, timeout=2)
            assert upstream.hanging.is_set()
            # The proxy closes its upstream request at once, not when the upstream times out.
            assert upstream.closed.wait(15), "the upstream request was not cancelled"
            start = time.monotonic()
            r = httpx.post(f"{url}/v1/chat/completions", json={**body, "model": "ok"}, headers=headers, timeout=30)
            took = time.monotonic() - start
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hello"
            assert took < upstream_timeout / 4, f"the session stayed locked {took:.1f} s"
            assert r.headers["x-contextrender-session"] == "leaver"
    finally:
        upstream.close()
        svc.close()


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"stream": True, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages", {"stream": True, "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"stream": True, "input": "hi"}),
    # passed through unmanaged: the error's body read whole, or (not streamed) read inside the request
    ("/v1/responses", {"stream": True, "previous_response_id": "resp_1", "input": "hi"}),
    ("/v1/responses", {"previous_response_id": "resp_1", "input": "hi"}),
])
def test_a_client_that_leaves_during_an_upstream_error_closes_it(tmp_path, monkeypatch, path, body):
    """An upstream error's body is read whole before it is relayed; a client that leaves meanwhile cancels
    the read at once (the unmanaged passthrough too), and the upstream response is closed (not left to the
    garbage collector)."""
    sent: list[httpx.Response] = []
    real_send = httpx.AsyncClient.send

    async def send(self: httpx.AsyncClient, *args: Any, **kw: Any) -> httpx.Response:
        resp = await real_send(self, *args, **kw)
        sent.append(resp)
        return resp

    monkeypatch.setattr(httpx.AsyncClient, "send", send)
    upstream = ScriptedUpstream()
    svc = ContextService(str(tmp_path / "g.sqlite"), embedder=HashingEmbedder(dim=64), warm=False)
    try:
        app = create_proxy_app(upstream.url, service=svc, budget=1500, timeout=60, stateful_responses="passthrough")
        with serve(app) as url:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url + path, json={**body, "model": "hang-error"}, timeout=2)
            assert upstream.hanging.is_set() and upstream.closed.wait(15)
            deadline = time.monotonic() + 15
            while not all(r.is_closed for r in sent) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert all(r.status_code == 503 and r.is_closed for r in sent)
            assert len(sent) == (1 if body.get("stream") else 0)  # else the read was inside send: httpx closed it
    finally:
        upstream.close()
        svc.close()


# -- C and F: every error in the JSON shape; budgets strict ---------------------------------------


@pytest.fixture
def server(tmp_path):
    svc = ContextService(str(tmp_path / "g.sqlite"), embedder=HashingEmbedder(dim=64), default_budget=1500,
                         warm=False)
    try:
        with serve(create_app(service=svc)) as url:
            yield url, svc
    finally:
        svc.close()


def test_budgets_are_json_integers_everywhere_in_the_session_api(server):
    url, _ = server
    assert httpx.put(f"{url}/sessions/b1").status_code == 201
    for bad in (True, "2000", 2.0, -1, 0, [2000]):
        body = _is_error_json(httpx.post(f"{url}/sessions/b1/render", json={"budget": bad}), 422)
        assert "'budget' must be a positive integer" in body["detail"], (bad, body)
    assert httpx.post(f"{url}/sessions/b1/render", json={"budget": 2000}).json()["budget"] == 2000
    # A 5,000-digit number in a JSON body, or in a query: a JSON error, not a crash.
    huge = b'{"budget": ' + b"9" * 5000 + b"}"
    _is_error_json(httpx.post(f"{url}/sessions/b1/render", content=huge,
                              headers={"content-type": "application/json"}), 400)
    body = _is_error_json(httpx.get(f"{url}/sessions/b1/scores", params={"budget": "9" * 5000}), 422)
    assert "'budget'" in body["detail"] and "9999" not in body["detail"]  # never echoed
    assert "'budget'" in _is_error_json(httpx.get(f"{url}/sessions/b1/view?budget=true"), 422)["detail"]
    _is_error_json(httpx.get(f"{url}/no/such/route"), 404)


def test_a_body_that_is_not_json_is_400_in_the_session_api(server):
    """docs/service.md, "Errors": a body that is not JSON is 400 (not 422 naming a body index), never echoed."""
    url, svc = server
    for raw in (b'{"meta": {"secret-token": ', b"not json at all", b'{"budget": 1,}'):
        for method, path in (("PUT", "/sessions/x"), ("POST", "/sessions/x/render")):
            r = httpx.request(method, url + path, content=raw, headers={"content-type": "application/json"})
            body = _is_error_json(r, 400)
            assert body["detail"] == "request body is not valid JSON", (method, path, body)
            assert "secret" not in r.text and "at all" not in r.text
    assert svc.sessions() == []
    # a well-formed body with a bad parameter is still 422, naming it
    assert httpx.put(f"{url}/sessions/x", json={}).status_code == 201
    assert "'budget'" in _is_error_json(httpx.post(f"{url}/sessions/x/render", json={"budget": "1"}), 422)["detail"]


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


def test_stream_assemblers_never_size_anything_by_an_upstream_index():
    """An index the upstream picks (a content part's, an output item's, a block's, a tool call's) is bounded:
    beyond the next part, or above MAX_STREAM_INDEX, the event is counted in bad_events and skipped."""
    from contextrender.service.streams import (
        MAX_STREAM_INDEX,
        AnthropicStreamAssembler,
        ResponsesStreamAssembler,
        StreamAssembler,
    )

    item = {"type": "message", "id": "m1", "role": "assistant", "content": []}
    for j in (100_000, 10**18):  # the first would have padded 100,000 parts, the second never returned
        asm = ResponsesStreamAssembler()
        asm.feed(_sse({"type": "response.output_item.added", "output_index": 0, "item": item},
                      {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "ok"},
                      {"type": "response.output_text.delta", "output_index": 0, "content_index": j, "delta": "x"},
                      {"type": "response.content_part.added", "output_index": 0, "content_index": 2,
                       "part": {"type": "output_text", "text": ""}},
                      {"type": "response.output_item.added", "output_index": 10**18, "item": item}))
        assert asm.bad_events == 3
        assert asm.output() == [{**item, "content": [{"type": "output_text", "text": "ok"}]}]
    chat = StreamAssembler()
    chat.feed(_sse({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": MAX_STREAM_INDEX + 1, "id": "c9", "function": {"name": "f", "arguments": "{}"}},
        {"index": 10**18, "id": "c8", "function": {"name": "g", "arguments": "{}"}},
        {"index": 1, "id": "c1", "function": {"name": "h", "arguments": "{}"}}]}, "finish_reason": "tool_calls"}]}))
    assert chat.bad_events == 2 and [c["id"] for c in chat.message()["tool_calls"]] == ["c1"]
    ant = AnthropicStreamAssembler()
    ant.feed(_sse({"type": "content_block_start", "index": 10**18, "content_block": {"type": "text", "text": "x"}},
                  {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                  {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
                  {"type": "content_block_delta", "index": 10**18, "delta": {"type": "text_delta", "text": "y"}},
                  {"type": "message_stop"}))
    assert ant.bad_events == 2 and ant.content() == [{"type": "text", "text": "hi"}]


def test_wrap_refuses_a_budget_that_is_not_an_int():
    import contextrender

    class Client:
        class chat:  # noqa: N801 - the OpenAI client's attribute name
            completions = object()

    for bad in (True, "2000", 2000.0):
        with pytest.raises(TypeError, match="budget must be an int"):
            contextrender.wrap(Client(), budget=bad, embedder=HashingEmbedder(dim=8))


@pytest.fixture
def proxy(tmp_path):
    upstream = ScriptedUpstream()
    svc = ContextService(str(tmp_path / "p.sqlite"), embedder=HashingEmbedder(dim=64), warm=False)
    try:
        with serve(create_proxy_app(upstream.url, service=svc, budget=1500, timeout=30)) as url:
            yield url
    finally:
        upstream.close()
        svc.close()


def test_proxy_budget_header_and_passthrough_path_errors_are_json(proxy):
    url = proxy
    body = {"model": "ok", "messages": [{"role": "user", "content": "hi"}]}
    ok = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"x-contextrender-budget": "2000"})
    assert ok.status_code == 200 and ok.headers["x-contextrender-budget"] == "2000"  # decimal text, as before
    for bad in ("9" * 5000, "1" * 10, "true", "2e3", "-5"):
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"x-contextrender-budget": bad})
        err = _is_error_json(r, 400)
        assert "x-contextrender-budget" in err["detail"] and "9 digits" in err["detail"]
    for absurd in ("0", "000", "99999999"):  # digits, but no budget: the error says what a budget is
        err = _is_error_json(httpx.post(f"{url}/v1/chat/completions", json=body,
                                        headers={"x-contextrender-budget": absurd}), 400)
        assert "is not a history budget" in err["detail"] and "between 1 and 10,000,000" in err["detail"]
        assert "default (1500)" in err["detail"]
    # '%3F' decodes to '?': refused as a path that leaves the upstream base, in the JSON shape.
    for path in ("/v1/models%3Fapi_key=x", "/v1/files/a%3Fb", "/v1/files/a%23b"):
        r = httpx.get(url + path)
        assert "below the upstream base URL" in _is_error_json(r, 400)["detail"], path


def _pages(svc: ContextService) -> int:
    with svc.graph._lock:
        return int(svc.graph._db.execute("PRAGMA page_count").fetchone()[0])


def test_a_full_disk_is_a_json_error_and_loses_nothing_acknowledged(server, tmp_path):
    """SQLite's own 'database or disk is full' (SQLITE_FULL), from a real file capped at its current size."""
    url, svc = server
    first = [{"role": "user", "content": f"first {i} " + "x" * 500} for i in range(5)]
    assert httpx.post(f"{url}/sessions/d1/messages", json=first).status_code == 200  # acknowledged
    with svc.graph._lock:  # the file cannot grow any more: what a full disk does to SQLite
        svc.graph._db.execute(f"PRAGMA max_page_count = {_pages(svc)}")
    big = [{"role": "assistant", "content": f"second {i} " + "y" * 4000} for i in range(40)]
    body = _is_error_json(httpx.post(f"{url}/sessions/d1/messages", json=big), 507)
    assert "disk is full" in body["detail"] and "nothing of this operation was stored" in body["detail"]
    assert len(httpx.get(f"{url}/sessions/d1/messages").json()["messages"]) == 5
    with svc.graph._lock:  # space again
        svc.graph._db.execute("PRAGMA max_page_count = 1073741823")
    third = [{"role": "assistant", "content": "third"}]
    r = httpx.post(f"{url}/sessions/d1/messages", json=third)
    assert r.status_code == 200 and r.json()["seqs"] == [5]  # no gap, no half-stored batch
    svc.close()
    with ContextGraph(tmp_path / "g.sqlite") as g:  # what the file holds: every acknowledged message
        assert g.session("d1").openai_messages() == first + third


# -- D: the graph lock follows the file, not its name ----------------------------------------------

_OPEN = textwrap.dedent("""
    import sys
    from contextrender.files import LockedError
    from contextrender.graph import ContextGraph
    try:
        ContextGraph(sys.argv[1], exclusive=True).close()
        print("opened")
    except LockedError as e:
        print("locked:", e)
""")


def test_a_hard_link_or_symlink_to_a_held_graph_is_refused_by_another_process(tmp_path):
    real = tmp_path / "g.sqlite"
    svc = ContextService(str(real), embedder=HashingEmbedder(dim=8), warm=False)
    try:
        svc.append("s", [{"role": "user", "content": "hi"}])
        elsewhere = tmp_path / "other"
        elsewhere.mkdir()
        hard = elsewhere / "hard.sqlite"
        os.link(real, hard)
        soft = elsewhere / "soft.sqlite"
        soft.symlink_to(real)
        for name in (hard, soft, real):
            out = subprocess.run([sys.executable, "-c", _OPEN, str(name)], capture_output=True, text=True,
                                 cwd=REPO, timeout=120)
            assert out.stdout.startswith("locked:"), (name, out.stdout, out.stderr)
            assert f"in use by pid {os.getpid()}" in out.stdout, out.stdout
        with pytest.raises(Exception, match="in use by pid"):  # and in this process, without a second descriptor
            ContextService(str(hard), embedder=HashingEmbedder(dim=8), warm=False)
        assert svc.append("s", [{"role": "assistant", "content": "still mine"}]).messages == 2
    finally:
        svc.close()
    out = subprocess.run([sys.executable, "-c", _OPEN, str(hard)], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert out.stdout.strip() == "opened"  # released with the holder


# -- E: transcripts never written through a symlink ------------------------------------------------


def _graph_with(tmp_path: Path, sid: str = "task-1", n_turns: int = 3) -> Path:
    graph = tmp_path / "g.sqlite"
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "audit"}]
    for i in range(n_turns):
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": json.dumps({"i": i})}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"REC_{i} " + "pad " * 50}]
    with ContextGraph(graph) as g:
        g.session(sid).sync(msgs)
    return graph


@pytest.mark.parametrize("command", ["export", "view"])
def test_out_refuses_symlinks_and_creates_owner_only_files(tmp_path, capsys, command):
    graph = _graph_with(tmp_path)
    extra = ["--budget", "300", "--embedding", "hashing"] if command == "view" else []
    target = tmp_path / "victim.txt"
    target.write_text("keep me\n")
    link = tmp_path / "out.link"
    link.symlink_to(target)
    dangling = tmp_path / "dangling.link"
    dangling.symlink_to(tmp_path / "would-be-created.txt")
    for out in (link, dangling):
        assert main([command, "task-1", "--graph", str(graph), "--out", str(out), *extra]) == 2
        assert "symlink" in capsys.readouterr().err
    assert target.read_text() == "keep me\n" and not (tmp_path / "would-be-created.txt").exists()
    assert link.is_symlink() and dangling.is_symlink()
    old = tmp_path / "old.out"
    old.write_text("")
    old.chmod(0o644)
    for out in (tmp_path / "new.out", old):
        assert main([command, "task-1", "--graph", str(graph), "--out", str(out), *extra]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o600, out
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary left behind


def test_export_out_appends_atomically(tmp_path):
    graph = _graph_with(tmp_path)
    out = tmp_path / "t.jsonl"
    for _ in range(2):
        assert main(["export", "task-1", "--graph", str(graph), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and lines[0] == lines[1] and json.loads(lines[0])["task_id"] == "task-1"


# -- G: a damaged graph file at start-up ----------------------------------------------------------


def _damage(path: Path) -> None:
    size = path.stat().st_size
    assert size >= 6 * 4096, size
    rnd = random.Random(7)
    with open(path, "r+b") as f:
        f.seek(3 * 4096)
        f.write(bytes(rnd.randrange(256) for _ in range(2 * 4096)))


def test_a_damaged_graph_is_refused_at_start_by_every_command(tmp_path):
    graph = _graph_with(tmp_path, n_turns=60)
    _damage(graph)
    port = lambda: str(socket.create_server(("127.0.0.1", 0)).getsockname()[1])  # noqa: E731
    commands = {
        "serve": ["serve", "--graph", str(graph), "--embedding", "hashing", "--port", port()],
        "proxy": ["proxy", "--graph", str(graph), "--embedding", "hashing", "--port", port(), "--upstream",
                  "http://127.0.0.1:9/v1"],
        "explain": ["explain", "task-1", "--graph", str(graph), "--budget", "300", "--embedding", "hashing"],
        "view": ["view", "task-1", "--graph", str(graph), "--budget", "300", "--embedding", "hashing"],
        "export": ["export", "task-1", "--graph", str(graph)],
    }
    procs = {name: subprocess.Popen([sys.executable, "-m", "contextrender.cli", *argv], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, cwd=tmp_path)
             for name, argv in commands.items()}
    try:
        for name, proc in procs.items():
            try:
                _out, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} started on a damaged graph")
            assert proc.returncode == 2, (name, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in err, (name, err)
            assert str(graph) in lines[0] and "quick_check" in lines[0], (name, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# -- H: the CLI and wrap name missing extras; recorded embedder; episode ids; defaults -------------

_NO_SERVICE = textwrap.dedent("""
    import json, sys
    for m in ("fastapi", "hydra", "omegaconf", "uvicorn"):
        sys.modules[m] = None  # as if the [service] extra were not installed
    from contextrender.cli import main
    graph, trace = sys.argv[1], sys.argv[2]
    out = {}
    for argv in (["serve", "--graph", graph, "--embedding", "hashing"],
                 ["proxy", "--graph", graph, "--upstream", "http://127.0.0.1:9/v1", "--embedding", "hashing"],
                 ["explain", "task-1", "--graph", graph, "--budget", "300", "--embedding", "hashing"],
                 ["view", "task-1", "--graph", graph, "--budget", "300", "--embedding", "hashing"],
                 ["replay", trace, "--budget", "300", "--methods", "prune", "--embedding", "hashing"]):
        try:
            code = main(argv)
        except BaseException as e:  # what the old code did: a traceback
            code = f"{type(e).__name__}: {e}"
        out[argv[0]] = code
    import contextrender
    try:
        contextrender.wrap(object(), budget=100)
        out["wrap"] = "no error"
    except ImportError as e:
        out["wrap"] = str(e)
    print(json.dumps(out))
""")


def test_every_command_and_wrap_name_a_missing_extra(tmp_path):
    graph = _graph_with(tmp_path)
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"task_id": "x", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    proc = subprocess.run([sys.executable, "-c", _NO_SERVICE, str(graph), str(trace)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {k: v for k, v in codes.items() if k != "wrap"} == dict.fromkeys(
        ("serve", "proxy", "explain", "view", "replay"), 2), codes  # no UnboundLocalError, no traceback
    err = [line for line in proc.stderr.splitlines() if line.startswith("contextrender ")]
    assert len(err) == 5, proc.stderr
    for line in [*err, codes["wrap"]]:
        assert "[service] extra" in line and "pip install 'contextrender[service]'" in line, line
        assert "pip install -e '.[service]'" in line, line


def test_explain_and_view_use_the_embedder_the_session_was_rendered_with(tmp_path, capsys):
    path = tmp_path / "g.sqlite"
    _rendered_graph(path, HashingEmbedder(dim=48))  # over budget: the results are embedded and stored
    assert main(["explain", "s1", "--graph", str(path), "--budget", "400"]) == 0
    assert "embedder hashing-48" in capsys.readouterr().err
    with ContextGraph.snapshot(path) as g:
        assert g.embedders("s1") == ["hashing-48"]
    out = tmp_path / "v.html"
    assert main(["view", "s1", "--graph", str(path), "--budget", "400", "--out", str(out)]) == 0
    assert out.exists()
    # A session nothing of which was embedded: said so, and the local default is used.
    with ContextGraph(path) as g:
        g.session("short").sync([{"role": "user", "content": "hi"}])
        assert g.embedders("short") == []


class _Named(HashingEmbedder):
    """A lexical embedder that records itself under another name (what a graph from elsewhere may say)."""

    def __init__(self, name: str) -> None:
        super().__init__(dim=32)
        self.name = name


def _rendered_graph(path: Path, embedder: Any) -> None:
    svc = ContextService(str(path), embedder=embedder, warm=False)
    try:
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "audit"}]
        for i in range(8):
            msgs += [{"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": f"c{i}", "content": f"SECRET_{i} " + "pad " * 80}]
        svc.render("s1", messages=msgs, budget=400)
    finally:
        svc.close()


@pytest.mark.parametrize("recorded,said", [
    ("openai/text-embedding-3-small", "--embedding litellm"),  # a remote model: every tool result would go there
    ("hashing-" + "9" * 30, "1..65536"),                        # a dimension no machine holds
])
def test_explain_and_view_build_only_local_embedders_from_what_a_graph_says(tmp_path, capsys, monkeypatch,
                                                                             recorded, said):
    import litellm

    calls: list[Any] = []
    monkeypatch.setattr(litellm, "embedding", lambda **kw: calls.append(kw) or (_ for _ in ()).throw(
        RuntimeError("no network in tests")))
    path = tmp_path / "g.sqlite"
    _rendered_graph(path, _Named(recorded))
    with ContextGraph.snapshot(path) as g:
        assert g.embedders("s1") == [recorded]
    for argv in (["explain", "s1", "--graph", str(path), "--budget", "400"],
                 ["view", "s1", "--graph", str(path), "--budget", "400", "--out", str(tmp_path / "v.html")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and recorded[:20] in err and "s1" in err and "Traceback" not in err, err
        assert err.count("\n") == 1  # one line
    assert calls == [] and not (tmp_path / "v.html").exists()
    # Another embedder asked for by name works on the same file, offline.
    assert main(["explain", "s1", "--graph", str(path), "--budget", "400", "--embedding", "hashing"]) == 0
    assert "embedder hashing-256" in capsys.readouterr().err


def test_a_recorded_remote_model_is_used_only_when_asked_for(tmp_path):
    from contextrender.cli import _recorded_embedder

    path = tmp_path / "g.sqlite"
    _rendered_graph(path, _Named("openai/text-embedding-3-small"))
    with ContextGraph.snapshot(path) as g:
        with pytest.raises(ValueError, match="--embedding litellm"):
            _recorded_embedder("recorded", g, "s1", "explain")
        assert _recorded_embedder("litellm", g, "s1", "explain").name == "openai/text-embedding-3-small"
        assert _recorded_embedder("local", g, "s1", "explain").name == "all-MiniLM-L6-v2"
    odd = tmp_path / "odd.sqlite"
    _rendered_graph(odd, _Named("model\x1b[31m with spaces"))
    with ContextGraph.snapshot(odd) as g:
        with pytest.raises(ValueError, match="not a model name"):
            _recorded_embedder("litellm", g, "s1", "explain")
    hashed = tmp_path / "h.sqlite"
    _rendered_graph(hashed, _Named("hashing-65536"))
    with ContextGraph.snapshot(hashed) as g:
        assert _recorded_embedder("recorded", g, "s1", "explain").dim == 65536


def test_view_episode_takes_the_files_own_task_ids(tmp_path, capsys):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"task_id": f"{t}/trial-0", "messages": msgs}) + "\n" for t in (7, 12)))
    out = tmp_path / "v.html"
    argv = ["view", str(trace), "--budget", "300", "--methods", "prune", "--embedding", "hashing", "--out", str(out)]
    assert main([*argv, "--episode", "12"]) == 0
    assert '"session":"12/trial-0"' in out.read_text()
    assert main([*argv, "--episode", "7/trial-0"]) == 0
    assert main([*argv, "--episode", "99"]) == 2
    err = capsys.readouterr().err
    assert "no episode '99'" in err and "7, 12" in err


def test_help_shows_defaults():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "serve" in a.choices).choices
    serve_help = " ".join(sub["serve"].format_help().split())
    assert "(default: 8765)" in serve_help and "(default: 6000)" in serve_help and "(default: contextrender_plus)" in serve_help
    view_help = " ".join(sub["view"].format_help().split())
    assert "--last N" in view_help and "latest 30 invocations" in view_help
    assert "(default: 600.0)" in " ".join(sub["proxy"].format_help().split())


def test_docs_name_the_session_header():
    text = (REPO / "docs" / "service.md").read_text(encoding="utf-8")
    section = text.split("### The session header", 1)
    assert len(section) == 2 and "X-ContextRender-Session" in section[1].split("\n## ", 1)[0]


def test_the_proxy_serves_bounded_views_too(proxy):
    url = proxy
    history: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    for _ in range(3):  # three recorded turns through the proxy
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": "ok", "messages": history},
                       headers={"x-contextrender-session": "pv"})
        assert r.status_code == 200
        history += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
    r = httpx.get(f"{url}/sessions/pv/view?budget=500&methods=prune&last=2")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    window = json.loads(r.text.split('"window":', 1)[1].split("}", 1)[0] + "}")
    assert window["to"] - window["from"] == 1 and window["to"] == window["invocations"] - 1 == 3
    body = _is_error_json(httpx.get(f"{url}/sessions/pv/view?from=50"), 422)
    assert "'from' is 50" in body["detail"] and "0..3" in body["detail"]
    assert "'last'" in _is_error_json(httpx.get(f"{url}/sessions/pv/view?last=0"), 422)["detail"]
