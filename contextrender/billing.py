"""Billed cost: what a provider charges for each request, from that request's own cached prefix (docs/method.md §14).

Providers bill the part of a prompt they find in their prompt cache at a fraction of the input price
(a tenth to a half) and, for Anthropic, the part they write to it at a premium. A request is cheap only
while its prefix is byte-identical to what an earlier request of the session sent, so a method that
re-selects what to show at every call pays for the prefix it changed. Eq. 3 (docs/method.md §7) gives
every method the cache share Full history had; this module bills each request from what it sent.

**Profiles** (:data:`PROFILES`):

- ``openai`` — automatic prefix caching. A request reads from the cache the longest prefix it shares
  with an earlier request of the session (at block boundaries: a block that differs anywhere is not
  read), counted only from 1,024 tokens and in steps of 128 tokens; nothing is charged for writing.
- ``anthropic`` — explicit breakpoints (``cache_control``, at most 4 per request). Each breakpoint whose
  prefix holds at least 1,024 tokens writes that prefix to the cache; a later request reads the longest
  prefix an earlier request wrote, found by checking the block boundaries at and up to 20 blocks before
  each of its own breakpoints. Tokens from the read point to the last breakpoint are written (cache
  creation), the rest after the last breakpoint is plain input.
- ``none`` — every input token at the input price.

The harness's own requests put Anthropic breakpoints where a well-behaved client does
(:func:`chat_blocks`): after the tools and system prompt, and on the last message, so each request
writes the whole prompt and the next one reads it if it only appended. A live run or the proxy takes the
provider's own figures instead (:class:`PromptUsage` read from the response's ``usage``).

**Prices** come from litellm's model cost map (``input_cost_per_token``,
``cache_read_input_token_cost``, ``cache_creation_input_token_cost``, ``output_cost_per_token``), read as
the JSON file litellm ships, without importing litellm; nothing here is typed in by hand. A model without
a cache price is billed its input price for cached tokens (no discount), and :func:`profile_of` gives it
the profile its provider uses.

What the simulation leaves out: cache lifetimes (5 minutes on both providers, refreshed on use; the
oracle's calls follow each other at once), cache routing misses, and partial matches inside a block.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: What a :class:`PromptCache` simulates, by name.
PROFILE_NAMES = ("anthropic", "openai", "none")
#: The model whose prices bill a profile when none is named: Claude Code's default, and the paper's gpt-4.1.
PROFILE_MODELS: Mapping[str, str] = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4.1", "none": "gpt-4.1"}


@dataclass(frozen=True)
class CacheRules:
    """A provider's prompt-cache rules: which kind, the smallest cacheable prefix, the read granularity, how far
    back from a breakpoint a hit is looked for (in blocks) and how many breakpoints a request may carry."""

    profile: str
    min_tokens: int = 1024
    step: int = 1
    lookback: int = 20
    max_breakpoints: int = 4


PROFILES: Mapping[str, CacheRules] = {
    "openai": CacheRules("openai", min_tokens=1024, step=128, lookback=0, max_breakpoints=0),
    "anthropic": CacheRules("anthropic", min_tokens=1024, step=1, lookback=20, max_breakpoints=4),
    "none": CacheRules("none", min_tokens=0, step=1, lookback=0, max_breakpoints=0),
}


def rules(profile: str) -> CacheRules:
    """The :class:`CacheRules` of a profile name; an unknown name is refused, naming the choices."""
    try:
        return PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown billing profile {profile!r}; choose one of {', '.join(PROFILE_NAMES)}") from None


@dataclass(frozen=True)
class PromptUsage:
    """One request (or a sum of requests) as billed: every prompt token (``prompt``), of them ``cache_read`` read
    from the cache and ``cache_write`` written to it, and the ``output`` tokens. The rest is plain input."""

    prompt: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0

    def __post_init__(self) -> None:
        if min(self.prompt, self.cache_read, self.cache_write, self.output) < 0:
            raise ValueError(f"token counts cannot be negative: {self}")
        if self.cache_read + self.cache_write > self.prompt:
            raise ValueError(f"cache reads and writes exceed the prompt: {self}")

    @property
    def uncached(self) -> int:
        """Prompt tokens billed at the plain input price."""
        return self.prompt - self.cache_read - self.cache_write

    def __add__(self, other: PromptUsage) -> PromptUsage:
        return PromptUsage(self.prompt + other.prompt, self.cache_read + other.cache_read,
                           self.cache_write + other.cache_write, self.output + other.output)

    def to_dict(self) -> dict[str, int]:
        return {"prompt": self.prompt, "cache_read": self.cache_read, "cache_write": self.cache_write,
                "output": self.output}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> PromptUsage:
        return PromptUsage(*(int(d.get(k) or 0) for k in ("prompt", "cache_read", "cache_write", "output")))


def total(usages: Iterable[PromptUsage]) -> PromptUsage:
    out = PromptUsage()
    for u in usages:
        out = out + u
    return out


# -- the simulated cache -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One unit of a prompt in provider order (tools, system, messages): a digest of its content, its tokens,
    how many of the provider's content blocks it stands for (Anthropic's lookback counts those), and whether a
    breakpoint sits on it."""

    key: str
    tokens: int
    parts: int = 1
    breakpoint: bool = False


def _chain(blocks: Sequence[Block]) -> tuple[list[str], list[int], list[int]]:
    """Per block boundary i (the prefix through block i): a digest of the whole prefix, its tokens, and the
    content blocks it holds."""
    digests, tokens, parts = [], [], []
    h, t, p = b"", 0, 0
    for b in blocks:
        h = hashlib.sha1(h + b.key.encode()).digest()
        t += b.tokens
        p += b.parts
        digests.append(h.hex())
        tokens.append(t)
        parts.append(p)
    return digests, tokens, parts


class PromptCache:
    """One session's provider-side prompt cache, simulated under a profile's :class:`CacheRules`.

    ``request(blocks, output)`` bills one request and updates the cache as the provider would.
    """

    def __init__(self, profile: str | CacheRules) -> None:
        self.rules = profile if isinstance(profile, CacheRules) else rules(profile)
        self._entries: dict[str, int] = {}  # prefix digest -> its tokens

    def _granular(self, read: int) -> int:
        r = self.rules
        if read < r.min_tokens or read <= 0:
            return 0
        return r.min_tokens + ((read - r.min_tokens) // r.step) * r.step

    def request(self, blocks: Sequence[Block], output: int = 0) -> PromptUsage:
        digests, tokens, parts = _chain(blocks)
        prompt = tokens[-1] if tokens else 0
        kind = self.rules.profile
        if kind == "none" or not blocks:
            return PromptUsage(prompt, 0, 0, output)
        if kind == "openai":
            read = max((tokens[i] for i, d in enumerate(digests) if d in self._entries), default=0)
            for d, t in zip(digests, tokens, strict=True):  # every prefix of this request is cached now
                self._entries[d] = t
            return PromptUsage(prompt, min(self._granular(read), prompt), 0, output)
        return self._anthropic(blocks, digests, tokens, parts, prompt, output)

    def _anthropic(self, blocks: Sequence[Block], digests: list[str], tokens: list[int], parts: list[int],
                   prompt: int, output: int) -> PromptUsage:
        r = self.rules
        points = [i for i, b in enumerate(blocks) if b.breakpoint]
        if len(points) > r.max_breakpoints:
            raise ValueError(f"a request may carry at most {r.max_breakpoints} cache breakpoints, this one has "
                             f"{len(points)}")
        read = 0
        for bp in points:  # hits are looked for at the breakpoint and up to `lookback` content blocks before it
            for j in range(bp, -1, -1):
                if parts[bp] - parts[j] > r.lookback:
                    break
                if digests[j] in self._entries:
                    read = max(read, tokens[j])
                    break
        write = 0
        if points and tokens[points[-1]] >= r.min_tokens:
            write = max(0, tokens[points[-1]] - read)
        for bp in points:
            if tokens[bp] >= r.min_tokens:
                self._entries[digests[bp]] = tokens[bp]
        return PromptUsage(prompt, read, write, output)


def message_key(message: Mapping[str, Any]) -> str:
    """The digest a message's block is keyed by: its JSON with sorted keys (what is sent, byte for byte)."""
    return hashlib.sha1(json.dumps(message, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def chat_blocks(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                counter: Any, previous: Sequence[Mapping[str, Any]] | None = None) -> list[Block]:
    """A chat request (OpenAI format) as blocks in provider order — the tools, then each message — with the
    breakpoints a well-behaved Anthropic client places: on the last leading system message (or on the tools when
    there is none), on the last message, and — when the request changed a message of ``previous`` (the session's
    request before it) — on the last message before that change, so the unchanged prefix is looked up where it ends
    rather than 20 blocks back from the end. Tokens are the session's counter's (``counter.text`` for the tool
    schemas, ``counter.message`` per message, as the offline oracle counts its usage)."""
    blocks: list[Block] = []
    if tools:
        text = json.dumps(list(tools))
        blocks.append(Block(hashlib.sha1(text.encode()).hexdigest(), counter.text(text)))
    n_sys = 0
    while n_sys < len(messages) and messages[n_sys].get("role") in ("system", "developer"):
        n_sys += 1
    for m in messages:
        calls = m.get("tool_calls") or ()
        blocks.append(Block(message_key(m), counter.message(m), parts=1 + len(calls)))
    marks = set()
    offset = len(blocks) - len(messages)
    head = offset + n_sys - 1  # the last system block, else the tools block, else none
    if head >= 0:
        marks.add(head)
    if blocks:
        marks.add(len(blocks) - 1)
    if previous is not None:
        same = 0
        for a, b in zip(previous, messages, strict=False):
            if a != b:
                break
            same += 1
        if n_sys < same < min(len(previous), len(messages)):  # a change after the system prompt, before the end
            marks.add(offset + same - 1)
    return [Block(b.key, b.tokens, b.parts, i in marks) for i, b in enumerate(blocks)]


class SessionBilling:
    """The simulated prompt cache of one session under each profile: ``request`` bills one chat request (OpenAI
    format, as :func:`chat_blocks` lays it out) under every profile at once."""

    def __init__(self, profiles: Sequence[str] = ("anthropic", "openai"), counter: Any = None) -> None:
        self.counter = counter
        self.caches = {p: PromptCache(p) for p in profiles}
        self._previous: Sequence[Mapping[str, Any]] | None = None

    def request(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                output: int = 0, counter: Any = None) -> dict[str, PromptUsage]:
        blocks = chat_blocks(messages, tools, counter or self.counter, self._previous)
        self._previous = list(messages)
        return {p: c.request(blocks, output) for p, c in self.caches.items()}


# -- prices -------------------------------------------------------------------------------------------

#: Set to the path of a model cost map (litellm's format) to bill from it instead of litellm's shipped one.
COST_MAP_ENV = "CONTEXTRENDER_COST_MAP"
_LITELLM_MAP = "model_prices_and_context_window_backup.json"
#: The fields of a cost-map entry billing reads; the shipped snapshot keeps only these.
COST_FIELDS = ("input_cost_per_token", "output_cost_per_token", "cache_read_input_token_cost",
               "cache_creation_input_token_cost", "litellm_provider")
#: litellm's cost map cut to :data:`COST_FIELDS`, shipped so an install without litellm (``[service]``) bills
#: the same dollars; written by scripts/cost_map_snapshot.py from the pinned litellm.
SNAPSHOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prices", "model_costs.json.gz")


class PricesUnavailable(LookupError):
    """No price for a model: no cost map could be read or it does not list the model. The message says what to do."""


@functools.lru_cache(maxsize=4)
def _load_cost_map(path: str) -> dict[str, Any]:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise PricesUnavailable(f"cannot read the model cost map {path}: {e}; set {COST_MAP_ENV} to a readable "
                                "cost map file") from None
    except json.JSONDecodeError as e:
        raise PricesUnavailable(f"{path}: not JSON (line {e.lineno}, column {e.colno}); set {COST_MAP_ENV} to "
                                "a cost map in litellm's format") from None
    if not isinstance(data, dict):
        raise PricesUnavailable(f"{path}: not a model cost map (a JSON object of models)")
    if isinstance(data.get("models"), dict) and "litellm" in data:  # the shipped snapshot
        return data["models"]
    return data


def litellm_cost_map_path() -> str | None:
    """The cost map an installed litellm ships (found without importing litellm), or None."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], _LITELLM_MAP)
    return path if os.path.isfile(path) else None


def litellm_version() -> str | None:
    """The installed litellm's version, or None."""
    try:
        return importlib.metadata.version("litellm")
    except importlib.metadata.PackageNotFoundError:
        return None


def cost_map_path() -> str:
    """Where the cost map is read from: ``$CONTEXTRENDER_COST_MAP``, else the file an installed litellm ships,
    else the snapshot of the pinned litellm's map this package ships (:data:`SNAPSHOT`)."""
    return os.environ.get(COST_MAP_ENV) or litellm_cost_map_path() or SNAPSHOT


def cost_map() -> dict[str, Any]:
    """The model cost map (model name -> prices and provider)."""
    path = cost_map_path()
    if not os.path.isfile(path):
        raise PricesUnavailable(f"no model cost map at {path}; set {COST_MAP_ENV} to a cost map file in "
                                "litellm's format, or unset it to use the shipped one")
    return _load_cost_map(path)


def snapshot_of(table: Mapping[str, Any], version: str | None) -> dict[str, Any]:
    """``table`` cut to the priced models and :data:`COST_FIELDS`, tagged with the litellm version it came from."""
    models = {name: {k: e[k] for k in COST_FIELDS if k in e} for name, e in sorted(table.items())
              if isinstance(e, Mapping) and isinstance(e.get("input_cost_per_token"), (int, float))}
    return {"litellm": version, "fields": list(COST_FIELDS), "models": models}


def load_snapshot(path: str = SNAPSHOT) -> dict[str, Any]:
    """The shipped snapshot as written (litellm version, fields, models)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def write_snapshot(snapshot: Mapping[str, Any], path: str = SNAPSHOT) -> None:
    """Write ``snapshot`` reproducibly (sorted keys, no gzip timestamp)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    raw = json.dumps(snapshot, sort_keys=True, separators=(",", ":")).encode()
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as z:
        z.write(raw)


def _entry(model: str, table: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """The cost-map entry of ``model``: as named, else without a ``provider/`` prefix."""
    for name in (model, model.split("/", 1)[-1]):
        e = table.get(name)
        if isinstance(e, Mapping) and "input_cost_per_token" in e:
            return name, e
    raise PricesUnavailable(f"litellm's model cost map has no prices for {model!r}: name a model it lists "
                            "(e.g. billing.models.anthropic=claude-sonnet-4-5, billing.models.openai=gpt-4.1)")


@dataclass(frozen=True)
class Prices:
    """US$ per token of one model: plain input, output, a cached read and a cache write."""

    model: str
    provider: str
    input: float
    output: float
    cache_read: float
    cache_write: float

    def cost(self, usage: PromptUsage) -> float:
        """US$ of ``usage`` at these prices."""
        return (usage.uncached * self.input + usage.cache_read * self.cache_read
                + usage.cache_write * self.cache_write + usage.output * self.output)


def prices(model: str, table: Mapping[str, Any] | None = None) -> Prices:
    """The :class:`Prices` of ``model`` from the cost map (a missing cache price is the input price: no
    discount, no premium)."""
    name, e = _entry(model, cost_map() if table is None else table)
    inp = float(e["input_cost_per_token"])

    def price(key: str, default: float) -> float:
        v = e.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default

    return Prices(name, str(e.get("litellm_provider", "")), inp, price("output_cost_per_token", 0.0),
                  price("cache_read_input_token_cost", inp), price("cache_creation_input_token_cost", inp))


def profile_of(model: str, table: Mapping[str, Any] | None = None) -> str:
    """The cache profile a model's provider bills by: ``anthropic`` for Claude models (explicit breakpoints),
    ``openai`` for any other model the cost map gives a cache-read price (automatic prefix caching: OpenAI,
    DeepSeek, Gemini, …), else ``none``."""
    try:
        p = prices(model, table)
    except PricesUnavailable:
        return "none"
    if p.provider == "anthropic" or "claude" in p.model.split("/")[-1]:
        return "anthropic"
    return "openai" if p.cache_read < p.input else "none"


__all__ = ["Block", "CacheRules", "COST_MAP_ENV", "PROFILES", "PROFILE_MODELS", "PROFILE_NAMES", "Prices", "PricesUnavailable",
           "PromptCache", "PromptUsage", "SessionBilling", "SNAPSHOT", "chat_blocks", "cost_map", "cost_map_path", "message_key", "prices",
           "profile_of", "rules", "total"]
