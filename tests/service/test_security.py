"""Security: nothing a request carries is interpreted; other sites cannot use the services.

Every test talks to a real uvicorn server on 127.0.0.1 (or runs the real CLI
as a subprocess) and attacks it the way a web page or a hostile local client
would.
"""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import httpx
import pytest

from contextrender import HashingEmbedder
from contextrender.graph import ContextGraph
from contextrender.redact import redact
from contextrender.registry import OverrideError, tunable_keys, validate_overrides
from contextrender.service.guard import AccessPolicy
from contextrender.service.proxy import create_proxy_app
from contextrender.service.server import create_app
from contextrender.service.sessions import ContextService

from .conftest import SYSTEM, serve
from .test_cli import free_port, wait_health

REPO = Path(__file__).resolve().parents[2]
SECRET_ENV = "CR_TEST_SECRET_VALUE"
SECRET = "sk-test-SECRET-0123456789abcdef"


def _transcript(tag: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"task {tag}"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": f"c_{tag}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c_{tag}", "content": f"record REC_{tag}_1 " + "pad " * 400}]


def _injections(tmp_path: Path) -> list[tuple[str, dict]]:
    made = tmp_path / "made_by_request"
    return [
        ("env", {"weights.reuse": f"${{oc.env:{SECRET_ENV}}}"}),
        ("env-nested", {"weights": {"reuse": f"${{oc.env:{SECRET_ENV}}}"}}),
        ("create", {"weights": f"${{oc.create:{{_target_: os.makedirs, name: {made}}}}}"}),
        ("create-scalar", {"lam": f"${{oc.create:{{_target_: os.makedirs, name: {made}}}}}"}),
        ("target", {"_target_": "os.getcwd"}),
        ("dict-for-scalar", {"lam": {"_target_": "os.getcwd"}}),
        ("nan", {"lam": math.nan}),
        ("string-number", {"lam": "abc"}),
    ]


@pytest.fixture
def secret_env(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)


@pytest.fixture
def svc(tmp_path):
    s = ContextService(str(tmp_path / "g.sqlite"), embedder=HashingEmbedder(dim=64), default_budget=300)
    s.sync("sess1", _transcript("a"))
    yield s
    s.close()


def _check_refused(r: httpx.Response, tmp_path: Path) -> None:
    assert r.status_code in (400, 422), (r.status_code, r.text)
    assert SECRET not in r.text
    assert not (tmp_path / "made_by_request").exists()


def _attack_session_api(url: str, tmp_path: Path) -> None:
    for label, ov in _injections(tmp_path):
        # json.dumps writes NaN as the bare token NaN, which Python's JSON parser (the server's) accepts.
        r = httpx.post(f"{url}/sessions/sess1/render", content=json.dumps({"budget": 300, "overrides": ov}),
                       headers={"content-type": "application/json"})
        _check_refused(r, tmp_path)
        assert r.status_code == 422, label
        q = urllib.parse.quote(json.dumps(ov))
        for sid in ("sess1", "no-such-session"):  # the policy is never built for a bad override
            r = httpx.get(f"{url}/sessions/{sid}/scores?budget=300&overrides={q}")
            _check_refused(r, tmp_path)
            assert r.status_code == 422, (label, sid, r.text)
    # The key is named in the error.
    r = httpx.post(f"{url}/sessions/sess1/render", json={"overrides": {"weights.reuse": f"${{oc.env:{SECRET_ENV}}}"}})
    assert "weights.reuse" in r.json()["detail"] and "interpolation" in r.json()["detail"]


def test_override_injection_refused_by_server(svc, tmp_path, secret_env):
    with serve(create_app(service=svc)) as url:
        _attack_session_api(url, tmp_path)
        # Plain values of the right type still work.
        r = httpx.post(f"{url}/sessions/sess1/render", json={"budget": 300, "overrides": {"weights.reuse": 0}})
        assert r.status_code == 200


def test_override_injection_refused_by_proxy(svc, tmp_path, secret_env, fake_upstream):
    _fake, up = fake_upstream
    with serve(create_proxy_app(f"{up}/v1", service=svc, budget=300)) as url:
        _attack_session_api(url, tmp_path)


def test_validate_overrides_accepts_plain_values_only():
    keys = tunable_keys("contextrender")
    assert keys["weights.reuse"] is float and keys["task_chars"] is int and "name" not in keys
    assert "_target_" not in keys
    assert validate_overrides("contextrender", {"weights": {"reuse": 0}, "lam": 1}) == {"weights.reuse": 0.0,
                                                                                      "lam": 1.0}
    assert validate_overrides("contextrender_plus", {"packing": False}) == {"packing": False}
    bad = [{"lam": "0.5"}, {"lam": math.inf}, {"lam": -0.1}, {"lam": [1]}, {"lam": True}, {"packing": 1},
           {"task_chars": 1.5}, {"weights": 1.0}, {"weights": {}}, {"nope": 1}, {"name": "x"}, "lam=1"]
    for ov in bad:
        method = "contextrender_plus" if "packing" in ov else "contextrender"
        with pytest.raises(OverrideError):
            validate_overrides(method, ov)


def test_override_out_of_range_is_422_not_500(svc):
    with serve(create_app(service=svc)) as url:
        r = httpx.post(f"{url}/sessions/sess1/render", json={"overrides": {"oversized_share": 7}})
        assert r.status_code == 422 and "oversized_share" in r.json()["detail"]
        r = httpx.post(f"{url}/sessions/sess1/render", json={"overrides": {"lam": "abc"}})
        assert r.status_code == 422 and "lam" in r.json()["detail"]


def test_proxy_cli_refuses_interpolated_override(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "contextrender.cli", "proxy", "--upstream", "http://127.0.0.1:9/v1",
                           "--graph", str(tmp_path / "g.sqlite"), "--embedding", "hashing",
                           "--override", "weights.reuse=${oc.env:HOME}"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "weights.reuse" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "contextrender.cli", "proxy", "--upstream", "http://127.0.0.1:9/v1",
                           "--graph", str(tmp_path / "g.sqlite"), "--embedding", "hashing",
                           "--override", '_target_="os.getcwd"'],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "not a tunable key" in proc.stderr


# -- cross-site use of the proxy and the session API ------------------------------------------------------


def _chat_body() -> dict:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


def test_proxy_refuses_browser_style_requests(svc, fake_upstream, monkeypatch):
    monkeypatch.setenv("CONTEXTRENDER_UPSTREAM_API_KEY", "sk-operator-key-0123456789")
    fake, up = fake_upstream
    with serve(create_proxy_app(f"{up}/v1", service=svc, budget=300)) as url:
        post = f"{url}/v1/chat/completions"
        raw = json.dumps(_chat_body())
        # A page's form or fetch without preflight: text/plain, form encodings.
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            r = httpx.post(post, content=raw, headers={"content-type": ctype})
            assert r.status_code == 415, (ctype, r.text)
        # A browser Origin that nobody allowed.
        r = httpx.post(post, json=_chat_body(), headers={"origin": "https://evil.example"})
        assert r.status_code == 403
        # An <img> tag (no Origin, but the browser says cross-site) on a transcript endpoint.
        r = httpx.get(f"{url}/sessions/sess1/messages", headers={"sec-fetch-site": "cross-site"})
        assert r.status_code == 403
        # DNS rebinding: the right socket, somebody else's Host.
        for path in ("/sessions/sess1/messages", "/sessions"):
            r = httpx.get(url + path, headers={"host": "evil.example"})
            assert r.status_code == 403 and "Host" in r.json()["detail"]
        r = httpx.post(post, json=_chat_body(), headers={"host": "evil.example:80"})
        assert r.status_code == 403
        assert fake.requests == []  # the operator's key was never spent
        # The operator's own client still works, and localhost is an accepted Host.
        r = httpx.post(post, json=_chat_body(), headers={"host": "localhost"})
        assert r.status_code == 200
        assert fake.requests[-1]["headers"]["authorization"] == "Bearer sk-operator-key-0123456789"


def test_allowed_origin_gets_cors_and_others_do_not(svc, fake_upstream):
    _fake, up = fake_upstream
    access = AccessPolicy.for_bind("127.0.0.1", allowed_origins=["http://localhost:3000"])
    with serve(create_proxy_app(f"{up}/v1", service=svc, budget=300, access=access)) as url:
        r = httpx.get(f"{url}/sessions", headers={"origin": "http://localhost:3000"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        pre = httpx.options(f"{url}/v1/chat/completions", headers={
            "origin": "http://localhost:3000", "access-control-request-method": "POST"})
        assert pre.status_code == 204 and "POST" in pre.headers["access-control-allow-methods"]
        assert httpx.get(f"{url}/sessions", headers={"origin": "http://localhost:3001"}).status_code == 403
    with pytest.raises(ValueError):
        AccessPolicy.for_bind("127.0.0.1", allowed_origins=["*"])


def test_token_required_and_never_forwarded(svc, fake_upstream, monkeypatch):
    monkeypatch.setenv("CONTEXTRENDER_UPSTREAM_API_KEY", "sk-operator-key-0123456789")
    fake, up = fake_upstream
    token = "tok-" + "a1b2c3d4" * 4
    access = AccessPolicy.for_bind("127.0.0.1", token=token)
    with serve(create_proxy_app(f"{up}/v1", service=svc, budget=300, access=access)) as url:
        post = f"{url}/v1/chat/completions"
        assert httpx.post(post, json=_chat_body()).status_code == 401
        assert httpx.post(post, json=_chat_body(), headers={"authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{url}/sessions/sess1/messages").status_code == 401
        assert httpx.get(f"{url}/health").status_code == 200  # liveness stays open
        # The token as the SDK's api_key: the operator's key goes upstream in its place.
        r = httpx.post(post, json=_chat_body(), headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 200
        sent = fake.requests[-1]["headers"]
        assert sent["authorization"] == "Bearer sk-operator-key-0123456789" and token not in json.dumps(sent)
        # The token in its own header: the client's own upstream key is forwarded, the token is not.
        r = httpx.post(post, json=_chat_body(), headers={"x-contextrender-token": token,
                                                         "authorization": "Bearer sk-client-own"})
        assert r.status_code == 200
        sent = fake.requests[-1]["headers"]
        assert sent["authorization"] == "Bearer sk-client-own" and token not in json.dumps(sent)
        assert httpx.get(f"{url}/sessions/sess1/messages", headers={"x-contextrender-token": token}).status_code == 200
    with pytest.raises(ValueError):
        AccessPolicy.for_bind("127.0.0.1", token="short")


def test_server_guard_and_no_session_api(svc, fake_upstream):
    with serve(create_app(service=svc)) as url:
        r = httpx.post(f"{url}/sessions/x/messages", content=json.dumps([{"role": "user", "content": "a"}]),
                       headers={"content-type": "text/plain"})
        assert r.status_code == 415 and not svc.exists("x")
        assert httpx.get(f"{url}/sessions", headers={"host": "attacker.test"}).status_code == 403
        assert httpx.put(f"{url}/sessions/empty-body").status_code == 201  # no body, no content type needed
    _fake, up = fake_upstream
    with serve(create_proxy_app(f"{up}/v1", service=svc, budget=300, session_api=False)) as url:
        assert httpx.get(f"{url}/sessions").status_code == 404
        assert httpx.get(f"{url}/sessions/sess1/messages").status_code == 404


# -- credentials in logs, private files -------------------------------------------------------------------


def test_proxy_logs_never_show_upstream_credentials(tmp_path, fake_upstream):
    _fake, up = fake_upstream
    host_port = up.split("://", 1)[1]
    upstream = f"http://bob:hunter2-pass@{host_port}/v1?api_key=qs-secret-value"
    port = free_port()
    env = {**os.environ, "CONTEXTRENDER_UPSTREAM_API_KEY": "sk-env-0123456789abcdefgh"}
    proc = subprocess.Popen([sys.executable, "-m", "contextrender.cli", "proxy", "--upstream", upstream,
                             "--graph", str(tmp_path / "g.sqlite"), "--embedding", "hashing", "--port", str(port),
                             "--log-level", "debug"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_health(url, proc)
        r = httpx.post(f"{url}/v1/chat/completions", json=_chat_body(), timeout=30)
        assert r.status_code in (200, 404)  # the fake upstream has no '?api_key' route quirks; either way it logged
        httpx.get(f"{url}/v1/models?token=tok-in-query-123", timeout=30)
        time.sleep(0.5)
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
    assert "HTTP Request" in err  # httpx did log the upstream request ...
    for secret in ("hunter2-pass", "qs-secret-value", "sk-env-0123456789abcdefgh", "tok-in-query-123"):
        assert secret not in err, secret  # ... with the credentials redacted
    assert "api_key=***" in err  # the --upstream query still goes upstream, masked in the log


def test_redact_masks_credentials():
    line = redact('POST https://u:p4ss@h.example/v1?key=abc123&x=1 Authorization: Bearer sk-live-abcdefghijklmnop')
    assert "p4ss" not in line and "abc123" not in line and "sk-live-abcdefghijklmnop" not in line
    assert "h.example/v1" in line and "x=1" in line


def test_graph_and_export_files_are_owner_only(tmp_path):
    folder = tmp_path / "new" / "dir"
    path = folder / "g.sqlite"
    with ContextGraph(path) as g:
        g.session("s").sync(_transcript("p"))
        wal = Path(str(path) + "-wal")
        for f in (path, wal):
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    from contextrender.cli import main

    out = tmp_path / "exports" / "t.jsonl"
    assert main(["export", "s", "--graph", str(path), "--out", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


# -- hardening found by the independent attack review -------------------------------------------------------


def _raw_get(url: str, target: str, headers: dict[str, str] | None = None) -> int:
    """GET ``target`` byte for byte (no client-side dot-segment normalisation); return the status."""
    import socket

    host, port = url.split("://", 1)[1].split(":")
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
             *(f"{k}: {v}" for k, v in (headers or {}).items()), "", ""]
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall("\r\n".join(lines).encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_passthrough_stays_below_the_upstream_base(svc, fake_upstream, monkeypatch):
    monkeypatch.setenv("CONTEXTRENDER_UPSTREAM_API_KEY", "sk-operator-key-0123456789")
    fake, up = fake_upstream
    with serve(create_proxy_app(f"{up}/v1", service=svc, budget=300)) as url:
        for target in ("/v1/../../steal", "/v1/..%2F..%2Fadmin%2Fsecret", "/v1/a/%2e%2e/%2e%2e/x",
                       "/v1/x/..%252F..%252Fy", "/v1/a//b", "/v1/a\\..\\b"):
            assert _raw_get(url, target) in (400, 404), target
        assert all(r["path"].startswith("/v1/") for r in fake.other), fake.other
        assert _raw_get(url, "/v1/files/file-abc/content") == 200
        assert fake.other[-1]["path"] == "/v1/files/file-abc/content"
        assert fake.other[-1]["headers"]["authorization"] == "Bearer sk-operator-key-0123456789"


def test_access_token_is_never_forwarded_in_any_header(svc, fake_upstream):
    fake, up = fake_upstream
    token = "tok-" + "z9y8x7w6" * 4
    access = AccessPolicy.for_bind("127.0.0.1", token=token)
    with serve(create_proxy_app(f"{up}/v1", service=svc, budget=300, access=access)) as url:
        for extra in ({"authorization": f"Bearer {token}"}, {"authorization": token}, {"api-key": token},
                      {"x-api-key": f"bearer {token}"}):
            r = httpx.post(f"{url}/v1/chat/completions", json=_chat_body(),
                           headers={"x-contextrender-token": token, **extra})
            assert r.status_code == 200
            assert token not in json.dumps(fake.requests[-1]["headers"]), extra


def test_upstream_url_credentials_do_not_replace_keys(svc, fake_upstream, monkeypatch):
    fake, up = fake_upstream
    host_port = up.split("://", 1)[1]
    app = create_proxy_app(f"http://gw-user:gw-pass@{host_port}/v1", service=svc, budget=300)
    with serve(app) as url:
        httpx.post(f"{url}/v1/chat/completions", json=_chat_body(), headers={"authorization": "Bearer sk-own-key"})
        assert fake.requests[-1]["headers"]["authorization"] == "Bearer sk-own-key"
        httpx.post(f"{url}/v1/chat/completions", json=_chat_body())  # nothing else: the URL's credentials
        assert fake.requests[-1]["headers"]["authorization"].startswith("Basic ")


def test_bodies_the_proxy_cannot_forward_are_refused_before_storing(svc, fake_upstream):
    fake, up = fake_upstream
    with serve(create_proxy_app(f"{up}/v1", service=svc, budget=300)) as url:
        post = f"{url}/v1/chat/completions"
        h = {"content-type": "application/json", "x-contextrender-session": "hard1"}
        raw = json.dumps({"model": "\ud800", "messages": [{"role": "user", "content": "hello"}]})
        assert httpx.post(post, content=raw, headers=h).status_code == 400
        raw = '{"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "hello"}]}'
        assert httpx.post(post, content=raw, headers=h).status_code == 400
        deep = '{"model": "m", "x": ' + "[" * 5000 + "]" * 5000 + ', "messages": [{"role": "user", "content": "x"}]}'
        assert httpx.post(post, content=deep, headers=h).status_code == 400
        assert httpx.post(post, json=_chat_body(), headers={"x-contextrender-budget": "1_000"}).status_code == 400
        assert not svc.exists("hard1") and fake.requests == []


def test_hostile_numbers_nesting_and_encodings_are_4xx(svc):
    with serve(create_app(service=svc)) as url:
        big = '{"overrides": {"task_chars": ' + "9" * 401 + "}}"
        r = httpx.post(f"{url}/sessions/sess1/render", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 422 and "out of range" in r.json()["detail"]
        nested = urllib.parse.quote("{\"a\": " * 3000 + "1" + "}" * 3000)
        assert httpx.get(f"{url}/sessions/sess1/scores?overrides={nested}").status_code == 422
        t0 = time.monotonic()
        r = httpx.put(f"{url}/sessions/enc1", json={"encoding": "gpt2"})
        assert r.status_code == 422 and "o200k_base" in r.json()["detail"] and time.monotonic() - t0 < 5
        assert httpx.put(f"{url}/sessions/enc2", json={"encoding": "cl100k_base"}).status_code == 201
        assert httpx.get(f"{url}/docs").status_code == 404 and httpx.get(f"{url}/openapi.json").status_code == 404
        assert httpx.put(f"{url}/sessions/..").status_code in (404, 422)
        long_key = "k" * 195
        r = httpx.post(f"{url}/sessions/{long_key}/messages",
                       json={"messages": [{"role": "user", "content": "x"}], "mode": "sync", "on_conflict": "fork"})
        assert r.status_code == 422 and "at most 192" in r.json()["detail"]


def test_symlinked_graph_cannot_take_a_second_lock(tmp_path):
    from contextrender.files import LockedError

    real = tmp_path / "g.sqlite"
    svc = ContextService(str(real), embedder=HashingEmbedder(dim=8))
    try:
        link = tmp_path / "link.sqlite"
        link.symlink_to(real)
        with pytest.raises(LockedError):
            ContextService(str(link), embedder=HashingEmbedder(dim=8))
    finally:
        svc.close()
