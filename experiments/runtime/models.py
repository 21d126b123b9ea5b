"""The model layer: one ``complete(messages, tools) -> Completion`` for every model.

- :class:`LiteLLMModel`: any provider through litellm, with the paper's decoding
  (temperature 0, top-p 1, seed 42; docs/method.md §8), usage including cached input
  tokens, an on-disk response cache (a rerun costs nothing and replays the
  recorded usage, so costs do not depend on the cache), and retries with
  exponential backoff on rate limits and transient errors.
- The offline ``oracle`` lives in :mod:`experiments.oracle`.

A model may bind itself to one episode with ``episode(task, session)``; API
models return themselves, the oracle returns a per-task script follower.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from contextrender.embed import default_cache_dir
from contextrender.events import Completion, Usage

log = logging.getLogger(__name__)


@runtime_checkable
class Model(Protocol):
    """What the runner calls. ``name`` goes into records."""

    name: str

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Completion: ...

    def episode(self, task: Any, session: Any) -> Model: ...


class ResponseCache:
    """SQLite cache of completions keyed by a hash of the full request."""

    def __init__(self, path: str | Path | None = None) -> None:
        path = Path(path) if path else default_cache_dir() / "responses.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, message TEXT, usage TEXT)")
        self._lock = threading.Lock()

    @staticmethod
    def key(request: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def get(self, key: str) -> Completion | None:
        with self._lock:
            row = self._db.execute("SELECT message, usage FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        return Completion(json.loads(row[0]), Usage.from_dict(json.loads(row[1])))

    def put(self, key: str, c: Completion) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?,?,?)",
                             (key, json.dumps(c.message), json.dumps(c.usage.to_dict())))


class TransientModelError(RuntimeError):
    """Raised after retries are exhausted on rate limits / transient provider errors."""


def _is_transient(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name in {"RateLimitError", "APIConnectionError", "Timeout", "APITimeoutError",
                    "ServiceUnavailableError", "InternalServerError", "APIError"} or "rate limit" in str(exc).lower()


class LiteLLMModel:
    """A litellm chat model with the paper's decoding settings, a cache and retries."""

    def __init__(self, model: str, *, name: str | None = None, api_base: str | None = None,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int | None = 42,
                 max_tokens: int | None = None, cache: bool = True, cache_path: str | None = None,
                 max_retries: int = 6, backoff_s: float = 2.0, timeout_s: float = 600.0,
                 extra: dict[str, Any] | None = None) -> None:
        self.model = model
        self.name = name or model
        self.params: dict[str, Any] = {"temperature": temperature, "top_p": top_p}
        if seed is not None:
            self.params["seed"] = seed
        if max_tokens is not None:
            self.params["max_tokens"] = max_tokens
        if api_base:
            self.params["api_base"] = api_base
        self.params.update(extra or {})
        self.cache = ResponseCache(cache_path) if cache else None
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.calls = 0  # provider calls actually made (cache hits excluded)

    def episode(self, task: Any, session: Any) -> LiteLLMModel:
        return self

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Completion:
        request = {"model": self.model, "messages": messages, "tools": tools or None, **self.params}
        key = ResponseCache.key(request)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            return hit
        completion = self._call(request)
        if self.cache is not None:
            self.cache.put(key, completion)
        return completion

    def _call(self, request: dict[str, Any]) -> Completion:
        import litellm

        kwargs = {k: v for k, v in request.items() if v is not None}
        for attempt in range(self.max_retries + 1):
            try:
                resp = litellm.completion(timeout=self.timeout_s, **kwargs)
                break
            except Exception as exc:  # noqa: BLE001 — classified below
                if not _is_transient(exc) or attempt == self.max_retries:
                    if _is_transient(exc):
                        raise TransientModelError(f"{self.model}: gave up after {attempt + 1} tries: {exc}") from exc
                    raise
                delay = self.backoff_s * (2 ** attempt) * (0.5 + random.random())
                log.warning("%s: %s; retrying in %.1fs", self.model, type(exc).__name__, delay)
                time.sleep(delay)
        self.calls += 1
        msg = resp.choices[0].message
        message: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
        if getattr(msg, "tool_calls", None):
            # Some providers omit call ids; a deterministic one keeps call/result pairing valid.
            message["tool_calls"] = [
                {"id": tc.id or "call_{}_{}".format(i, hashlib.sha1(
                    (tc.function.name + (tc.function.arguments or "")).encode()).hexdigest()[:10]),
                 "type": "function",
                 "function": {"name": tc.function.name, "arguments": tc.function.arguments or "{}"}}
                for i, tc in enumerate(msg.tool_calls)]
        return Completion(message, provider_usage(resp.usage))


def provider_usage(u: Any) -> Usage:
    """A litellm response's usage as the provider billed it: every prompt token (litellm's ``prompt_tokens``
    counts cache reads and writes too), of them the ones read from the prompt cache
    (``prompt_tokens_details.cached_tokens``, or Anthropic's ``cache_read_input_tokens``) and the ones written
    to it (Anthropic's ``cache_creation_input_tokens``; docs/method.md §14)."""
    details = getattr(u, "prompt_tokens_details", None)
    read = int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
    read = read or int(getattr(u, "cache_read_input_tokens", 0) or 0)
    write = int(getattr(u, "cache_creation_input_tokens", 0) or 0)
    return Usage(input=int(u.prompt_tokens), output=int(u.completion_tokens), cached=read, calls=1, cache_write=write)
