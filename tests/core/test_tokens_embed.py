"""The single token counter (docs/method.md §1) and the embedding backends (docs/method.md §4)."""

from __future__ import annotations

import numpy as np
import pytest
import tiktoken

from contextrender import CachedEmbedder, HashingEmbedder, TokenCounter
from contextrender.tokens import MESSAGE_OVERHEAD, TOOL_CALL_OVERHEAD, encoding_name_for

O200K = tiktoken.get_encoding("o200k_base")


@pytest.mark.parametrize("model", ["gpt-4.1", "openai/gpt-4.1", "muse-glimmer:30b-q8_0", "no-such-model-xyz", None, ""])
def test_o200k_for_gpt41_and_unknown_models(model):
    assert encoding_name_for(model) == "o200k_base"
    assert TokenCounter.for_model(model).encoding_name == "o200k_base"


def test_text_count_is_tiktoken_o200k():
    text = "Send the rent reminder to troy_solo@gmail.com — 日本語 ✓"
    assert TokenCounter().text(text) == len(O200K.encode(text)) > 0
    assert TokenCounter().text("") == 0
    assert TokenCounter().text("<|endoftext|>") == len(O200K.encode("<|endoftext|>", disallowed_special=()))


def test_message_count_is_overhead_plus_content_plus_tool_calls():
    c = TokenCounter()
    msg = {"role": "assistant", "content": "Let me search.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "search_contacts", "arguments": '{"relationship": "roommate"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "send_email", "arguments": '{"to": "troy_solo@gmail.com"}'}},
    ]}
    n = lambda s: len(O200K.encode(s))  # noqa: E731
    expected = (4 + n("Let me search.")
                + 3 + n("search_contacts") + n('{"relationship": "roommate"}')
                + 3 + n("send_email") + n('{"to": "troy_solo@gmail.com"}'))
    assert (MESSAGE_OVERHEAD, TOOL_CALL_OVERHEAD) == (4, 3)
    assert c.message(msg) == expected
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "found 3 contacts"}
    assert c.message(tool) == 4 + n("found 3 contacts") == c.tool_result("found 3 contacts")
    assert c.messages([msg, tool]) == expected + c.message(tool)
    assert c.message({"role": "user", "content": ""}) == 4


def test_truncate_respects_the_token_cap():
    c = TokenCounter()
    text = "alpha beta gamma " * 100
    for k in (0, 1, 7, 50):
        out = c.truncate(text, k)
        assert c.text(out) <= k and text.startswith(out)
    assert c.truncate("short", 100) == "short"


# ---------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------


def test_local_embedder_unit_384d_and_semantic(local_embedder):
    texts = ["The cat sat on the mat.", "A kitten is sitting on a rug.",
             "Quarterly corporate tax filing deadlines and penalties."]
    vecs, usage = local_embedder.embed_documents(texts)
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    sim = vecs @ vecs.T
    assert sim[0, 1] > sim[0, 2] + 0.2 and sim[0, 1] > sim[1, 2] + 0.2
    assert usage.embedding == sum(len(tiktoken.get_encoding("cl100k_base").encode(t)) for t in texts)
    q, _ = local_embedder.embed_query("a small cat resting on a carpet")
    assert q.shape == (384,) and float(q @ vecs[0]) > float(q @ vecs[2])


def test_hashing_embedder_unit_vectors():
    vecs, _ = HashingEmbedder(dim=64).embed_documents(["abc def", "", "abc def"])
    assert vecs.shape == (3, 64)
    assert np.linalg.norm(vecs[0]) == pytest.approx(1.0, abs=1e-6)
    assert np.array_equal(vecs[0], vecs[2]) and not vecs[1].any()


def test_cached_embedder_hits_cache_and_reports_same_logical_usage(tmp_path):
    inner = HashingEmbedder(dim=128)
    calls = []
    orig = inner._embed
    inner._embed = lambda texts: (calls.append(list(texts)), orig(texts))[1]
    cached = CachedEmbedder(inner, tmp_path / "emb.sqlite")
    texts = ["first text about invoices", "second text about weather"]
    v1, u1 = cached.embed_documents(texts)
    assert (cached.hits, cached.misses) == (0, 2) and len(calls) == 1
    v2, u2 = cached.embed_documents(texts)
    assert (cached.hits, cached.misses) == (2, 2) and len(calls) == 1  # no new model call
    assert np.array_equal(v1, v2) and u1 == u2 and u1.embedding > 0
    ref, ref_usage = HashingEmbedder(dim=128).embed_documents(texts)
    assert np.allclose(v1, ref) and ref_usage == u1
    # A new wrapper on the same file hits the persisted cache.
    again = CachedEmbedder(inner, tmp_path / "emb.sqlite")
    v3, u3 = again.embed_query(texts[0])
    assert (again.hits, again.misses) == (1, 0) and len(calls) == 1 and np.array_equal(v3, v1[0])
    assert u3 == HashingEmbedder(dim=128).embed_query(texts[0])[1]


class _BareVectors:
    """An embedder written from the protocol's names alone: it returns vectors without their Usage."""

    name, dim = "bare", 8

    def embed_documents(self, texts):
        return np.ones((len(texts), self.dim)) / np.sqrt(self.dim)

    def embed_query(self, text):
        return np.ones(self.dim) / np.sqrt(self.dim)


class _QueryAsMatrix(_BareVectors):
    """Right tuples, but the query comes back as a (1, dim) matrix."""

    name = "matrix-query"

    def embed_documents(self, texts):
        from contextrender import Usage

        return np.ones((len(texts), self.dim)) / np.sqrt(self.dim), Usage()

    def embed_query(self, text):
        from contextrender import Usage

        return np.ones((1, self.dim)) / np.sqrt(self.dim), Usage()


@pytest.mark.parametrize("embedder, says", [(_BareVectors(), "embed_documents must return (an (6, dim) array"),
                                            (_QueryAsMatrix(), "its vectors have shape (1, 8)")])
def test_an_embedder_off_the_protocol_gets_an_error_that_says_what_it_must_return(tmp_path, embedder, says):
    from contextrender import ContextGraph, ContextRender

    graph = ContextGraph(tmp_path / "g.sqlite")
    s = graph.session("s")
    msgs: list[dict] = [{"role": "user", "content": "find the order"}]
    for i in range(6):  # more than B holds: the selector must score them, so it embeds the query too
        msgs += [{"role": "assistant", "content": None,
                  "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "get", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": f"c{i}", "content": f"order ORD_{i}7X " + "line item " * 60}]
    s.sync(msgs)
    with pytest.raises(TypeError, match=f"embedder {embedder.name!r}") as err:
        ContextRender(embedder=embedder).render(s, 300)
    assert says in str(err.value)


def test_the_embedding_cache_is_owner_only(tmp_path):
    """Text hashes and vectors say something of what was embedded: the cache file and any folder it creates
    are 0600 / 0700, like the graph; the WAL files SQLite adds take the file's mode."""
    import os
    import stat

    path = tmp_path / "new" / "cache" / "emb.sqlite"
    emb = CachedEmbedder(HashingEmbedder(dim=16), path=path)
    emb.embed_documents(["order ORD_1 shipped"])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path.parent.parent).st_mode) == 0o700
    for side in path.parent.glob("emb.sqlite-*"):
        assert stat.S_IMODE(os.stat(side).st_mode) & 0o077 == 0, side


def test_an_in_memory_embedding_cache_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    emb = CachedEmbedder(HashingEmbedder(dim=16), path=":memory:")
    first = emb.embed_documents(["order ORD_1 shipped"])
    again = emb.embed_documents(["order ORD_1 shipped"])
    assert emb.hits == 1 and emb.misses == 1  # a working cache, in memory
    assert (first[0] == again[0]).all()
    assert list(tmp_path.iterdir()) == []  # no file named ':memory:' (nor its -wal/-shm)
