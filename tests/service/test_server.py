"""The session API over real loopback HTTP."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

from contextrender import HashingEmbedder
from contextrender.service.server import create_app
from contextrender.service.sessions import ContextService

from .conftest import SYSTEM, history_tokens, serve

B = 600


def transcript(turns: int, tag: str = "t") -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                  {"role": "user", "content": f"Find the owner of ORD_{tag}_0."}]
    for t in range(turns):
        cid = f"c_{tag}_{t}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "lookup", "arguments": json.dumps(
                {"order": f"ORD_{tag}_{t}"})}}]})
        msgs.append({"role": "tool", "tool_call_id": cid,
                     "content": f"order ORD_{tag}_{t + 1} owner cust_{tag}_{t}x " + "filler text " * 60})
    return msgs


@pytest.fixture
def server(service):
    with serve(create_app(service=service, max_body_bytes=256 * 1024)) as url:
        yield httpx.Client(base_url=url, timeout=30), service


def test_create_resume_append_render(server):
    c, service = server
    r = c.put("/sessions/a1", json={"meta": {"agent": "test"}})
    assert r.status_code == 201 and r.json()["created"] is True
    r = c.put("/sessions/a1")
    assert r.status_code == 200 and r.json()["created"] is False
    assert c.post("/sessions/a1").status_code == 200
    msgs = transcript(8)
    r = c.post("/sessions/a1/messages", json=msgs[:4])
    assert r.json()["added"] == 4 and r.json()["seqs"] == [0, 1, 2, 3]
    r = c.post("/sessions/a1/messages", json={"messages": msgs, "mode": "sync"})
    assert r.json()["added"] == len(msgs) - 4
    assert c.get("/sessions/a1").json()["messages"] == len(msgs)

    r = c.post("/sessions/a1/render", json={"budget": B})
    out = r.json()
    assert r.status_code == 200 and out["method"] == "contextrender"
    assert out["tokens"] <= B and history_tokens(out["messages"]) == out["tokens"]
    assert out["full_tokens"] > B and out["shortcut"] is False
    # layout points each rendered message at its stored source; bodies change only for omitted results
    stored = c.get("/sessions/a1/messages").json()["messages"]
    for m, seq in zip(out["messages"], out["layout"], strict=True):
        assert seq is not None and stored[seq]["role"] == m["role"]
        if m["content"] != stored[seq]["content"]:
            assert m["role"] == "tool" and "omitted" in m["content"]
        elif m["role"] == "tool":
            assert seq in out["visible"]
    assert set(out["usage"]) >= {"embedding", "input", "output"}
    # The default budget of the service applies when none is given.
    assert c.post("/sessions/a1/render", json={}).json()["budget"] == service.default_budget


def test_sync_conflict_and_fork(server):
    c, _ = server
    msgs = transcript(3, "f")
    assert c.post("/sessions/f1/messages", json={"messages": msgs, "mode": "sync"}).status_code == 200
    assert c.post("/sessions/f1/messages", json={"messages": msgs, "mode": "sync"}).json()["added"] == 0
    edited = json.loads(json.dumps(msgs))
    edited[3]["content"] = "edited result"
    r = c.post("/sessions/f1/messages", json={"messages": edited, "mode": "sync"})
    assert r.status_code == 409 and "message 3 differs" in r.json()["detail"]
    r = c.post("/sessions/f1/messages", json={"messages": msgs[:2], "mode": "sync"})
    assert r.status_code == 409
    r = c.post("/sessions/f1/render", json={"messages": edited, "on_conflict": "fork", "budget": B})
    assert r.status_code == 200 and r.json()["session"] == "f1~1" and r.json()["forked"] is True
    # Growing either history continues the matching variant.
    r = c.post("/sessions/f1/render", json={"messages": msgs + [{"role": "user", "content": "go on"}],
                                             "on_conflict": "fork"})
    assert r.json()["session"] == "f1" and r.json()["added"] == 1
    r = c.post("/sessions/f1/render", json={"messages": edited + [{"role": "user", "content": "go"}],
                                             "on_conflict": "fork"})
    assert r.json()["session"] == "f1~1"
    assert set(c.get("/sessions").json()["sessions"]) >= {"f1", "f1~1"}


def test_errors_are_clear_4xx(server):
    c, _ = server
    c.post("/sessions/e1/messages", json=transcript(2, "e"))
    r = c.post("/sessions/e1/messages", json=[{"role": "user", "content": "ok"}, {"role": "wizard"}])
    assert r.status_code == 400 and "messages[1]: 'role' must be one of" in r.json()["detail"]
    assert c.get("/sessions/e1").json()["messages"] == 6  # nothing of a bad batch was added
    r = c.post("/sessions/e1/messages", json={"messages": [{"role": "tool", "content": "x"}], "mode": "sync"})
    assert r.status_code == 400 and "tool_call_id" in r.json()["detail"]
    r = c.post("/sessions/e1/render", json={"method": "no_such_method"})
    assert r.status_code == 422 and "unknown method" in r.json()["detail"] and "contextrender" in r.json()["detail"]
    r = c.post("/sessions/e1/render", json={"method": "../compactor/gpt41"})
    assert r.status_code == 422
    r = c.post("/sessions/e1/render", json={"overrides": {"_target_": "os.system"}})
    assert r.status_code == 422 and "'_target_' is not a tunable key" in r.json()["detail"]
    r = c.post("/sessions/e1/render", json={"overrides": {"weights": {"_target_": "os.system"}}})
    assert r.status_code == 422
    r = c.post("/sessions/e1/render", json={"overrides": {"no_such_param": 1}})
    assert r.status_code == 422 and "no_such_param" in r.json()["detail"]
    assert c.post("/sessions/e1/render", json={"budget": 0}).status_code == 422
    assert c.post("/sessions/nope/render", json={}).status_code == 404
    assert c.get("/sessions/nope/scores").status_code == 404
    assert c.get("/sessions/nope/export").status_code == 404
    assert c.put("/sessions/bad%20id").status_code == 422
    r = c.post("/sessions/e1/messages", content=b"x" * 300_000, headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_scores_edges_and_overrides(server):
    c, service = server
    c.post("/sessions/s1/messages", json=transcript(8, "s"))
    r = c.get("/sessions/s1/scores", params={"budget": B})
    out = r.json()
    assert r.status_code == 200 and out["shortcut"] is False and out["tokens"] <= B
    rows = out["scores"]
    assert len(rows) == 8 and {"seq", "age", "reuse_count", "relevance", "usefulness", "pick", "gain"} <= set(rows[0])
    assert any(row["pick"] is not None for row in rows) and any(row["pick"] is None for row in rows)
    # Each call used the order id the previous result returned -> reuse edges, c_t(r) > 0.
    edges = c.get("/sessions/s1/edges").json()
    assert edges["edges"] and all(float(v) > 0 for v in edges["reuse"].values())
    assert any(row["reuse_count"] > 0 for row in rows)
    # Weight overrides change the scores; policies are cached per (method, overrides).
    no_reuse = c.get("/sessions/s1/scores", params={"budget": B, "overrides": json.dumps({"weights.reuse": 0})})
    base = {row["seq"]: row["usefulness"] for row in rows}
    changed = {row["seq"]: row["usefulness"] for row in no_reuse.json()["scores"]}
    assert any(changed[s] < base[s] for s in base)
    n = len(service._policies)
    c.post("/sessions/s1/render", json={"budget": B, "overrides": {"weights.reuse": 0}})
    c.post("/sessions/s1/render", json={"budget": B, "method": "cr_recency"})
    c.post("/sessions/s1/render", json={"budget": B, "method": "cr_recency"})
    assert len(service._policies) == n + 1
    # Scores exist only for ContextRender-family methods.
    r = c.get("/sessions/s1/scores", params={"budget": B, "method": "prune"})
    assert r.status_code == 422 and "ContextRender-family" in r.json()["detail"]
    r = c.post("/sessions/s1/render", json={"budget": B, "method": "prune"})
    assert r.status_code == 200 and r.json()["tokens"] <= B


def test_export_is_a_trace_line(server, tmp_path):
    c, _ = server
    msgs = transcript(3, "x")
    c.post("/sessions/x1/messages", json=msgs)
    ep = c.get("/sessions/x1/export").json()
    assert ep == {"task_id": "x1", "messages": msgs}
    line = c.get("/sessions/x1/export", params={"format": "jsonl"}).text
    path = tmp_path / "t.jsonl"
    path.write_text(line)
    traces = pytest.importorskip("contextrender.experiments.evaluation.traces")
    (episode,) = list(traces.read_traces(path))
    assert episode.task_id == "x1" and list(episode.messages) == msgs


def test_concurrent_sessions_are_consistent(tmp_path):
    svc = ContextService(str(tmp_path / "g.sqlite"), embedder=HashingEmbedder(dim=64), default_budget=B)
    errors: list[BaseException] = []
    with serve(create_app(service=svc)) as url:
        def worker(k: int) -> None:
            try:
                with httpx.Client(base_url=url, timeout=30) as c:
                    msgs = transcript(10, f"w{k}")
                    for i in range(2, len(msgs) + 1, 2):  # grow like an agent: sync + render each turn
                        r = c.post(f"/sessions/w{k}/render", json={"messages": msgs[:i], "budget": B})
                        assert r.status_code == 200, r.text
                        assert r.json()["tokens"] <= B
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors
    for k in range(8):
        assert list(svc.transcript(f"w{k}").messages) == transcript(10, f"w{k}")
    svc.close()
    # Reopened from the file: the same sessions and messages.
    again = ContextService(str(tmp_path / "g.sqlite"), embedder=HashingEmbedder(dim=64))
    assert {f"w{k}" for k in range(8)} <= set(again.sessions())
    assert list(again.transcript("w3").messages) == transcript(10, "w3")
    again.close()


def test_reserialised_tool_arguments_are_the_same_message(server):
    c, _ = server
    msgs = transcript(2, "j")
    c.post("/sessions/j1/messages", json=msgs)
    resent = json.loads(json.dumps(msgs))
    args = json.loads(resent[2]["tool_calls"][0]["function"]["arguments"])
    resent[2]["tool_calls"][0]["function"]["arguments"] = json.dumps(args, indent=1)  # other formatting
    r = c.post("/sessions/j1/render", json={"messages": resent + [{"role": "user", "content": "next"}]})
    assert r.status_code == 200 and r.json()["session"] == "j1" and r.json()["added"] == 1
    resent[2]["tool_calls"][0]["function"]["arguments"] = json.dumps({**args, "order": "other"})
    r = c.post("/sessions/j1/messages", json={"messages": resent, "mode": "sync"})
    assert r.status_code == 409
