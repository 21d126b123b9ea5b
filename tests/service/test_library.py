"""The session library without HTTP: typed results whose ``to_json()`` is the API's body, error kinds
mapped by each front end, the forwarding rule and stream assembly as public names."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from contextrender import ContextGraph, HashingEmbedder
from contextrender.graph import OMISSION_MARKER
from contextrender.service import proxy, server
from contextrender.service.errors import (
    BadRequest,
    Conflict,
    ErrorKind,
    InternalError,
    InvalidMessages,
    NotFound,
    ServiceError,
)
from contextrender.service.results import (
    AppendResult,
    CreateResult,
    EdgesResult,
    ExportResult,
    ReadinessReport,
    RenderResult,
    ScoresResult,
    SessionInfo,
    SyncResult,
    Transcript,
)
from contextrender.service.server import create_app
from contextrender.service.sessions import ContextService
from contextrender.service.streams import StreamAssembler, forwarded_messages

from .conftest import serve
from .test_server import transcript

REPO = Path(__file__).resolve().parents[2]
B = 600


def _service(tmp_path: Path, name: str) -> ContextService:
    return ContextService(str(tmp_path / f"{name}.sqlite"), embedder=HashingEmbedder(dim=64), default_budget=B)


def test_every_result_is_typed_and_its_json_is_the_http_body(tmp_path):
    """The same calls on two fresh services, one in process and one over HTTP, give the same bodies."""
    lib, web = _service(tmp_path, "lib"), _service(tmp_path, "web")
    msgs = transcript(8)
    try:
        with serve(create_app(service=web)) as url, httpx.Client(base_url=url, timeout=30) as c:
            pairs: list[tuple[Any, httpx.Response]] = [
                (lib.create("s", meta={"a": 1}), c.put("/sessions/s", json={"meta": {"a": 1}})),
                (lib.append("s", msgs[:4]), c.post("/sessions/s/messages", json=msgs[:4])),
                (lib.sync("s", msgs), c.post("/sessions/s/messages", json={"messages": msgs, "mode": "sync"})),
                (lib.sync("s", msgs[:3] + [{"role": "user", "content": "x"}], "fork"),
                 c.post("/sessions/s/messages", json={"messages": msgs[:3] + [{"role": "user", "content": "x"}],
                                                      "mode": "sync", "on_conflict": "fork"})),
                (lib.render("s", budget=B), c.post("/sessions/s/render", json={"budget": B})),
                (lib.render("r", messages=msgs, budget=B), c.post("/sessions/r/render",
                                                                   json={"messages": msgs, "budget": B})),
                (lib.info("s"), c.get("/sessions/s")),
                (lib.transcript("s"), c.get("/sessions/s/messages")),
                (lib.scores("s", budget=B), c.get("/sessions/s/scores", params={"budget": B})),
                (lib.edges("s"), c.get("/sessions/s/edges")),
                (lib.readiness("s"), c.get("/sessions/s/readiness")),
                (lib.export("s"), c.get("/sessions/s/export")),
            ]
        types = [CreateResult, AppendResult, SyncResult, SyncResult, RenderResult, RenderResult, SessionInfo,
                 Transcript, ScoresResult, EdgesResult, ReadinessReport, ExportResult]
        for (res, r), want in zip(pairs, types, strict=True):
            assert isinstance(res, want) and r.status_code in (200, 201)
            # Key order too: saved answers are diffed as text.
            assert json.dumps(res.to_json()) == json.dumps(r.json()), want.__name__
            with pytest.raises(dataclasses.FrozenInstanceError):
                res.session = "other"  # type: ignore[misc]
    finally:
        lib.close()
        web.close()


def test_typed_fields_read_like_the_body(service):
    msgs = transcript(10)
    res = service.render("t", messages=msgs, budget=B)
    body = res.to_json()
    assert (res.session, res.created, res.added, res.forked) == ("t", True, len(msgs), False)
    assert list(res.layout) == body["layout"] and res.tokens == body["tokens"] <= B
    assert res.readiness.to_json() == body["readiness"] and res.usage.to_dict() == body["usage"]
    synced = service.sync("t", msgs[:2] + [{"role": "user", "content": "edited"}], on_conflict="fork")
    assert synced.forked and synced.session == "t~1" and synced.added == 3 and synced.messages == 3
    appended = service.append("t", [{"role": "user", "content": "more"}])
    assert appended.seqs == (len(msgs),) and appended.forked is False and appended.messages == len(msgs) + 1


def test_errors_carry_a_kind_and_each_front_end_its_status():
    kinds = {BadRequest: ErrorKind.BAD_REQUEST, InvalidMessages: ErrorKind.INVALID_MESSAGES,
             NotFound: ErrorKind.NOT_FOUND, Conflict: ErrorKind.CONFLICT, InternalError: ErrorKind.INTERNAL}
    session_api = {BadRequest: 422, InvalidMessages: 400, NotFound: 404, Conflict: 409, InternalError: 500}
    openai_api = {BadRequest: 400, InvalidMessages: 400, NotFound: 404, Conflict: 409, InternalError: 500}
    for cls, kind in kinds.items():
        e = cls("why")
        assert isinstance(e, ServiceError) and e.kind is kind and e.message == "why"
        assert not hasattr(e, "status")  # the library knows no HTTP
        assert server.http_status(e) == session_api[cls] and proxy.STATUS_OF_KIND[kind] == openai_api[cls]
    assert set(server.STATUS_OF_KIND) == set(ErrorKind) == set(proxy.STATUS_OF_KIND)


def test_the_library_raises_its_errors(service):
    with pytest.raises(NotFound, match="unknown session"):
        service.info("nope")
    with pytest.raises(BadRequest, match="invalid method name"):
        service.render("nope", method="no such")
    with pytest.raises(InvalidMessages):
        service.append("s", [{"role": "nobody"}])
    service.append("s", [{"role": "user", "content": "hi"}])
    with pytest.raises(Conflict, match="append-only"):
        service.sync("s", [{"role": "user", "content": "bye"}])


def test_forwarded_messages_keep_the_clients_own_objects(service):
    msgs = transcript(10)
    msgs[3]["x_client_field"] = {"kept": True}  # a field the graph does not store
    res = service.render("f", messages=msgs, budget=B)
    sent = forwarded_messages(msgs, res)
    assert len(sent) == len(res.messages)
    changed = 0
    for out, seq in zip(sent, res.layout, strict=True):
        assert seq is not None
        if out is msgs[seq]:
            continue
        changed += 1
        assert out["content"] == OMISSION_MARKER and out["content"] != msgs[seq]["content"]
        assert {k: v for k, v in out.items() if k != "content"} == {k: v for k, v in msgs[seq].items()
                                                                     if k != "content"}
    assert changed and res.tokens <= B
    # An inserted message (a summary) has no source: it goes as the render made it.
    summary = {"role": "user", "content": "[summary] earlier turns"}
    spliced = dataclasses.replace(res, messages=(res.messages[0], summary), layout=(0, None))
    assert forwarded_messages(msgs, spliced) == [msgs[0], summary]


def test_stream_assembler_takes_bytes_split_anywhere():
    events = [{"choices": [{"index": 0, "delta": {"content": "héllo "}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [
                  {"index": 0, "id": "c1", "function": {"name": "look", "arguments": '{"a"'}}]}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
                            "finish_reason": "tool_calls"}]}]
    raw = b"".join(b"data: " + json.dumps(e, ensure_ascii=False).encode() + b"\n\n" for e in events)
    asm = StreamAssembler()
    for i in range(0, len(raw), 3):  # splits inside lines and inside the two-byte 'é'
        asm.feed(raw[i:i + 3])
    assert asm.complete and not asm.done and asm.bad_events == 0
    assert asm.message() == {"role": "assistant", "content": "héllo ", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"a": 1}'}}]}
    tail = StreamAssembler()
    tail.feed(b"data: [DONE]")  # no newline: only close() sees it
    assert not tail.done
    tail.close()
    assert tail.done and tail.complete


def test_a_service_over_an_open_graph_is_its_writer_but_not_its_owner():
    graph = ContextGraph(":memory:")
    graph.session("pre").sync([{"role": "user", "content": "hi"}])
    svc = ContextService(graph, embedder=HashingEmbedder(dim=64), warm=False)
    assert svc.graph is graph and svc.sessions() == ["pre"] and svc.exists("pre")
    svc.append("pre", [{"role": "assistant", "content": "hello"}])
    svc.close()
    assert len(graph.session("pre")) == 2  # still open: the caller closes it
    graph.close()


def _functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(f"{path.name}:{n.lineno} {n.name}", n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno is not None]


def test_service_and_wrapper_functions_stay_short():
    files = sorted((REPO / "contextrender" / "service").glob("*.py")) + [REPO / "contextrender" / "wrapper.py"]
    long = [(name, n) for f in files for name, n in _functions(f) if n > 80]
    assert long == []


def test_the_wrapper_uses_public_service_names_only():
    tree = ast.parse((REPO / "contextrender" / "wrapper.py").read_text(encoding="utf-8"))
    private = [f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               and (n.module or "").startswith("contextrender.service") for a in n.names if a.name.startswith("_")]
    poked = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("_")
             and isinstance(n.value, ast.Attribute | ast.Name) and ast.unparse(n.value).endswith(("svc", "service"))]
    assert private == [] and poked == []
