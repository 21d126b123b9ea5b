"""A small client for the ContextRender server API (:mod:`contextrender.service.server`), used by the adapters.

    from contextrender.adapters.http_client import ContextRenderClient

    cr = ContextRenderClient("http://127.0.0.1:8765")
    out = cr.render("task-42", messages=agent_messages, budget=6000)   # sync + render
    send_to_model(out.messages)

:class:`InProcessClient` has the same methods over a
:class:`~contextrender.service.sessions.ContextService` in this process (no HTTP), for
tests and single-process runs. Only ``httpx`` is needed at import time, so the
adapters also work inside another project's environment (e.g. AppWorld's).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8765"


class ContextRenderError(RuntimeError):
    """The server answered with an error status."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"ContextRender server error {status}: {detail}")
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class RenderResult:
    """A render as the server returns it.

    ``layout[i]``: seq (transcript index) of the stored message that rendered
    message i shows, or None for inserted messages (summaries) — the render's
    own record (``Rendered.sources`` on the server), so the adapters map
    rendered messages back to their agent's objects without guessing.
    """

    session: str
    messages: list[dict[str, Any]]
    layout: list[int | None]
    tokens: int
    budget: int
    method: str | None
    visible: list[int] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    forked: bool = False
    added: int = 0
    full_tokens: int = 0
    shortcut: bool | None = None

    @staticmethod
    def from_json(d: dict[str, Any]) -> RenderResult:
        return RenderResult(session=d["session"], messages=d["messages"], layout=d["layout"], tokens=d["tokens"],
                            budget=d["budget"], method=d.get("method"), visible=d.get("visible", []),
                            usage=d.get("usage", {}), forked=d.get("forked", False), added=d.get("added", 0),
                            full_tokens=d.get("full_tokens", 0), shortcut=d.get("shortcut"))


def _render_body(messages: Any, budget: int | None, method: str | None, overrides: dict[str, Any] | None,
                 on_conflict: str) -> dict[str, Any]:
    body: dict[str, Any] = {"on_conflict": on_conflict}
    if messages is not None:
        body["messages"] = messages
    if budget is not None:
        body["budget"] = budget
    if method is not None:
        body["method"] = method
    if overrides:
        body["overrides"] = overrides
    return body


class ContextRenderClient:
    """HTTP client for one server. ``base_url`` defaults to ``$CONTEXTRENDER_URL`` or 127.0.0.1:8765."""

    def __init__(self, base_url: str | None = None, *, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = (base_url or os.environ.get("CONTEXTRENDER_URL") or DEFAULT_URL).rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ContextRenderClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        resp = self._http.request(method, path, **kw)
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text
            raise ContextRenderError(resp.status_code, str(detail))
        if resp.headers.get("content-type", "").startswith("application/json"):
            return resp.json()
        return resp.text

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def create_session(self, session: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._call("PUT", f"/sessions/{session}", json={"meta": meta or {}})

    def append(self, session: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return self._call("POST", f"/sessions/{session}/messages", json=messages)

    def sync(self, session: str, messages: list[dict[str, Any]], on_conflict: str = "error") -> dict[str, Any]:
        return self._call("POST", f"/sessions/{session}/messages",
                          json={"messages": messages, "mode": "sync", "on_conflict": on_conflict})

    def render(self, session: str, messages: list[dict[str, Any]] | None = None, *, budget: int | None = None,
               method: str | None = None, overrides: dict[str, Any] | None = None,
               on_conflict: str = "error") -> RenderResult:
        """Render ``session``; with ``messages`` (the full history) sync them first."""
        body = _render_body(messages, budget, method, overrides, on_conflict)
        return RenderResult.from_json(self._call("POST", f"/sessions/{session}/render", json=body))

    def scores(self, session: str, *, budget: int | None = None, method: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in (("budget", budget), ("method", method)) if v is not None}
        return self._call("GET", f"/sessions/{session}/scores", params=params)

    def edges(self, session: str) -> dict[str, Any]:
        return self._call("GET", f"/sessions/{session}/edges")

    def messages(self, session: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/sessions/{session}/messages")["messages"]

    def export(self, session: str) -> dict[str, Any]:
        return self._call("GET", f"/sessions/{session}/export")


class InProcessClient:
    """The same interface over a ``ContextService`` in this process: the server's bodies, and its
    statuses in :class:`ContextRenderError`."""

    def __init__(self, service: Any) -> None:
        self.service = service

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        from contextrender.service.errors import ServiceError

        try:
            return fn(*args, **kw).to_json()
        except ServiceError as e:
            from contextrender.service.server import http_status

            raise ContextRenderError(http_status(e), e.message) from None

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "sessions": len(self.service.sessions())}

    def create_session(self, session: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._call(self.service.create, session, meta=meta)

    def append(self, session: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return self._call(self.service.append, session, messages)

    def sync(self, session: str, messages: list[dict[str, Any]], on_conflict: str = "error") -> dict[str, Any]:
        return self._call(self.service.sync, session, messages, on_conflict)

    def render(self, session: str, messages: list[dict[str, Any]] | None = None, *, budget: int | None = None,
               method: str | None = None, overrides: dict[str, Any] | None = None,
               on_conflict: str = "error") -> RenderResult:
        out = self._call(self.service.render, session, messages=messages, budget=budget, method=method,
                         overrides=overrides, on_conflict=on_conflict)
        return RenderResult.from_json(out)

    def scores(self, session: str, *, budget: int | None = None, method: str | None = None) -> dict[str, Any]:
        return self._call(self.service.scores, session, budget=budget, method=method)

    def edges(self, session: str) -> dict[str, Any]:
        return self._call(self.service.edges, session)

    def messages(self, session: str) -> list[dict[str, Any]]:
        return self._call(self.service.transcript, session)["messages"]

    def export(self, session: str) -> dict[str, Any]:
        return self._call(self.service.export, session)


__all__ = ["ContextRenderClient", "ContextRenderError", "DEFAULT_URL", "InProcessClient", "RenderResult"]
