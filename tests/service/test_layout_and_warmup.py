"""The render response's ``layout`` is the render's own ``Rendered.sources``; the embedder warms up at start."""

from __future__ import annotations

import time
from typing import Any

import pytest

from contextrender import HashingEmbedder
from contextrender.embed import CachedEmbedder
from contextrender.render import Rendered
from contextrender.service.errors import InternalError
from contextrender.service.proxy import create_proxy_app
from contextrender.service.server import create_app
from contextrender.service.sessions import WARM_UP_TEXT, ContextService

from .test_server import transcript


class CountingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(dim=64)
        self.queries: list[str] = []

    def embed_query(self, text: str) -> Any:
        self.queries.append(text)
        return super().embed_query(text)


@pytest.mark.parametrize("method", ["contextrender", "compact", "acon", "recency_summary", "prune",
                                    "semantic_retrieval", "contextrender_plus", "full"])
def test_layout_is_the_sources_of_the_render(service, method):
    msgs = transcript(12)
    out = service.render("s", messages=msgs, budget=600, method=method)
    with service._session("s", create=False) as (session, _):
        direct = service.policy(method).render(session, 600)  # the same render, straight from the policy
    assert list(out.messages) == list(direct.messages)
    assert out.layout == direct.sources and len(out.layout) == len(out.messages)
    for m, seq in zip(out.messages, out.layout, strict=True):
        if seq is None:
            assert m["role"] == "user" and m["content"].startswith("[")  # a summary
        else:
            assert msgs[seq]["role"] == m["role"] and msgs[seq].get("tool_call_id") == m.get("tool_call_id")
    if method in ("compact", "acon", "recency_summary"):
        assert None in out.layout


def test_a_render_without_sources_is_an_internal_error(service, monkeypatch):
    class NoSources:
        name = "no-sources"
        budgeted = True

        def render(self, session: Any, budget: int) -> Rendered:
            return Rendered(tuple(m.to_openai() for m in session.messages), 0, frozenset())

    monkeypatch.setattr(service, "policy", lambda *a, **k: NoSources())
    with pytest.raises(InternalError, match="without sources"):
        service.render("s", messages=transcript(2))


def test_the_service_warms_its_embedder_at_construction(tmp_path):
    emb = CountingEmbedder()
    svc = ContextService(str(tmp_path / "a.sqlite"), embedder=emb)
    assert emb.queries == [WARM_UP_TEXT]
    assert svc.warm_seconds is not None and svc.warm_seconds < 0.5  # HashingEmbedder: cheap
    svc.close()
    emb2 = CountingEmbedder()
    cold = ContextService(str(tmp_path / "b.sqlite"), embedder=emb2, warm=False)
    assert emb2.queries == [] and cold.warm_seconds is None
    cold.close()


def test_the_warm_up_reaches_the_model_behind_the_disk_cache(tmp_path):
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, tmp_path / "emb.sqlite")
    cached.embed_query(WARM_UP_TEXT)  # the text is now in the cache: a cached call would not load a model
    inner.queries.clear()
    hits, misses = cached.hits, cached.misses
    svc = ContextService(str(tmp_path / "g.sqlite"), embedder=cached)
    assert inner.queries == [WARM_UP_TEXT]  # the model itself ran
    assert (cached.hits, cached.misses) == (hits, misses)  # the cache was not consulted (nor written)
    svc.close()


def test_an_embedder_that_fails_to_warm_up_fails_start_up_and_releases_the_graph(tmp_path):
    class Broken(HashingEmbedder):
        def embed_query(self, text: str) -> Any:
            raise RuntimeError("model missing")

    path = str(tmp_path / "g.sqlite")
    with pytest.raises(RuntimeError, match="model missing"):
        ContextService(path, embedder=Broken(dim=8))
    ContextService(path, embedder=HashingEmbedder(dim=8)).close()  # the file's lock was released


def test_server_and_proxy_pass_warm_through(tmp_path):
    app = create_app(str(tmp_path / "a.sqlite"), embedding="hashing", warm=False)
    assert app.state.service.warm_seconds is None
    app.state.service.close()
    app = create_app(str(tmp_path / "b.sqlite"), embedding="hashing")
    assert app.state.service.warm_seconds is not None
    app.state.service.close()
    t0 = time.perf_counter()
    proxy = create_proxy_app("http://127.0.0.1:9/v1", str(tmp_path / "c.sqlite"), embedding="hashing")
    assert proxy.state.service.warm_seconds is not None and time.perf_counter() - t0 < 5
    proxy.state.service.close()


def test_a_start_up_that_fails_on_its_configuration_leaves_no_graph_file(tmp_path):
    class Broken(HashingEmbedder):
        def embed_query(self, text: str) -> Any:
            raise ImportError("needs the [local] extra")

    path = tmp_path / "g.sqlite"
    with pytest.raises(ImportError, match="local"):
        ContextService(str(path), embedder=Broken(dim=8))
    with pytest.raises(ValueError, match="unknown method|no method|nonexistent"):
        ContextService(str(path), embedder=HashingEmbedder(dim=8), default_method="nonexistent")
    with pytest.raises(ValueError, match="refuses overrides|not a tunable|unknown"):
        create_proxy_app("http://127.0.0.1:9/v1", str(path), budget=500, embedding="hashing",
                         overrides={"no_such_key": 1})
    assert list(tmp_path.iterdir()) == []  # nothing was created: a later start finds no stray empty graph


def test_a_graph_file_another_service_holds_fails_before_the_warm_up(tmp_path):
    from contextrender.files import LockedError

    path = str(tmp_path / "g.sqlite")
    holder = ContextService(path, embedder=HashingEmbedder(dim=8))
    try:
        emb = CountingEmbedder()
        with pytest.raises(LockedError):
            ContextService(path, embedder=emb)
        assert emb.queries == []  # refused at once: the model was never loaded for it
    finally:
        holder.close()
    ContextService(path, embedder=HashingEmbedder(dim=8)).close()  # and nothing of the refused one holds it
