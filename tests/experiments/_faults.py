"""Infrastructure faults for runner tests: the real oracle, failing the way production fails.

:class:`FaultyOracle` is the offline oracle (same name, so the same record
keys as ``model=oracle``) that, while its ``flag`` file exists, breaks the
episodes of chosen tasks on their second model call:

- ``disk_full``: writes to ``/dev/full``, so the kernel answers ENOSPC (a real
  full-disk ``OSError``, not one built by hand);
- ``rate_limited``: sends the call through a real :class:`LiteLLMModel` whose
  provider (a litellm ``CustomLLM`` registered in ``litellm.custom_provider_map``)
  answers every request with ``litellm.RateLimitError`` quoting a key and a
  credentialed URL, so the model gives up with ``TransientModelError``.

Deleting the flag is the disk being freed / the rate-limit window passing.
:class:`SlowOracle` is the oracle at a fixed pace, for a runner that must
still be running while a test races it.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import litellm
from litellm import CustomLLM

from contextrender.experiments.runtime.models import LiteLLMModel
from contextrender.experiments.runtime.oracle import OracleModel

PROVIDER = "ratelimited429"
SECRET_KEY = "sk-test0123456789abcdefSECRET"
SECRET_URL = "https://alice:hunter2pass@llm.example.com/v1?api_key=querysecret42"


class AlwaysRateLimited(CustomLLM):
    """A provider that is always over its rate limit, and says so with secrets in the message."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def completion(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        raise litellm.RateLimitError(f"429 Too Many Requests for key {SECRET_KEY} at {SECRET_URL}",
                                     llm_provider=PROVIDER, model="m")


def install_provider() -> AlwaysRateLimited:
    handler = AlwaysRateLimited()
    litellm.custom_provider_map = [{"provider": PROVIDER, "custom_handler": handler}]
    litellm.utils.custom_llm_setup()
    return handler


def uninstall_provider() -> None:
    litellm.custom_provider_map = []


def _disk_full() -> None:
    if os.path.exists("/dev/full"):
        with open("/dev/full", "wb", buffering=0) as f:
            f.write(b"x")  # ENOSPC from the kernel
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # pragma: no cover - no /dev/full here


class _Faulty:
    def __init__(self, inner: Any, kind: str) -> None:
        self.inner = inner
        self.kind = kind
        self.name = inner.name
        self.calls = 0

    def episode(self, task: Any, session: Any) -> _Faulty:
        return self

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Any:
        self.calls += 1
        if self.calls == 2:  # mid-episode: the failed attempt leaves a partial session behind
            if self.kind == "disk_full":
                _disk_full()
            LiteLLMModel(f"{PROVIDER}/m", cache=False, max_retries=2, backoff_s=0.0).complete(messages, tools)
        return self.inner.complete(messages, tools)


class FaultyOracle:
    name = "oracle"

    def __init__(self, flag: str, disk_full: list[str] | None = None, rate_limited: list[str] | None = None) -> None:
        self.oracle = OracleModel()
        self.flag = Path(flag)
        self.disk_full = set(disk_full or ())
        self.rate_limited = set(rate_limited or ())

    def episode(self, task: Any, session: Any) -> Any:
        inner = self.oracle.episode(task, session)
        if self.flag.exists():
            if task.id in self.disk_full:
                return _Faulty(inner, "disk_full")
            if task.id in self.rate_limited:
                return _Faulty(inner, "rate_limited")
        return inner

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Any:
        return self.oracle.complete(messages, tools)


class _Slow:
    def __init__(self, inner: Any, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.name = inner.name

    def episode(self, task: Any, session: Any) -> _Slow:
        return self

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Any:
        time.sleep(self.delay_s)
        return self.inner.complete(messages, tools)


class SlowOracle(OracleModel):
    """The oracle at a fixed pace per call: a runner that is reliably still running when a test races it."""

    def __init__(self, delay_s: float = 0.05, **kw: Any) -> None:
        super().__init__(**kw)  # the oracle's own settings (its mode) from conf/model/oracle.yaml
        self.delay_s = delay_s

    def episode(self, task: Any, session: Any) -> Any:
        return _Slow(super().episode(task, session), self.delay_s)
