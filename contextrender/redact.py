"""Keep secrets out of logs, records and error texts.

Upstream base URLs may carry credentials (``https://user:pass@host/v1``),
query strings may carry keys (``?api_key=...``) and provider errors sometimes
quote the key they refused. :func:`redact` removes all three from any text;
:class:`RedactingFormatter` applies it to every formatted log line, the
traceback included, so what a library (httpx logs each request URL at INFO,
uvicorn logs each path) writes is covered too.
"""

from __future__ import annotations

import logging
import re
from typing import Any

REDACTED = "***"

# scheme://user[:password]@host  ->  scheme://***@host
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<info>[^/\s@?#]+)@")
# ?key=value / &token=value, for query parameter names that usually hold secrets.
_SECRET_PARAM = re.compile(
    r"(?P<lead>[?&;](?:[A-Za-z0-9_.\-]*)(?:key|token|secret|password|passwd|pwd|sig|signature|auth|credential)"
    r"[A-Za-z0-9_.\-]*=)(?P<value>[^&#\s\"']+)",
    re.IGNORECASE)
# Authorization header values and bearer tokens quoted in messages.
_BEARER = re.compile(r"(?P<lead>\b(?:Bearer|Basic)\s+)(?P<value>[A-Za-z0-9._~+/=\-]{6,})", re.IGNORECASE)
# Provider key shapes (OpenAI/Anthropic "sk-...", others' long prefixed keys).
_KEY_SHAPES = re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{12,}\b|\bsk-ant-[A-Za-z0-9_\-]{12,}\b")


_KNOWN: set[str] = set()


def register_secret(value: str | None) -> None:
    """Mask this exact value wherever it appears (the service's access token, the upstream key).

    Values shorter than 8 characters are ignored: masking them would mangle ordinary text.
    """
    if value and len(value) >= 8:
        _KNOWN.add(value)


def redact(text: str) -> str:
    """``text`` with URL credentials, secret-looking query values, bearer tokens, API-key shapes and
    registered secrets masked."""
    if not text:
        return text
    for secret in sorted(_KNOWN, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _SECRET_PARAM.sub(lambda m: f"{m.group('lead')}{REDACTED}", text)
    text = _BEARER.sub(lambda m: f"{m.group('lead')}{REDACTED}", text)
    return _KEY_SHAPES.sub(REDACTED, text)


def redact_data(value: Any) -> Any:
    """``value`` (JSON data: a tool definition, a request body) with :func:`redact` applied to every string in it,
    keys included; its shape is kept."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_data(v) for v in value]
    if isinstance(value, dict):
        return {redact(str(k)): redact_data(v) for k, v in value.items()}
    return value


def redact_url(url: str) -> str:
    """A URL safe to print (no userinfo, no secret-looking query values)."""
    return redact(str(url))


class RedactingFormatter(logging.Formatter):
    """A formatter whose every output line (message, arguments, traceback) goes through :func:`redact`."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Redacted(logging.Formatter):
    """Wraps another formatter (Hydra's, uvicorn's) and redacts what it produces."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return redact(self.inner.format(record))


def redact_handlers(logger: logging.Logger | None = None) -> None:
    """Make every handler of ``logger`` (default: the root logger) redact its output."""
    for h in (logger or logging.getLogger()).handlers:
        fmt = h.formatter
        if not isinstance(fmt, (RedactingFormatter, _Redacted)):
            h.setFormatter(_Redacted(fmt or logging.Formatter()))


def configure_logging(level: int | str = logging.INFO, fmt: str = LOG_FORMAT) -> None:
    """Root logging to stderr, every line redacted (used by the CLI and the harness entry points).

    A root logger that already has handlers keeps them, each made redacting;
    otherwise one stderr handler is added.
    """
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(RedactingFormatter(fmt))
        root.addHandler(handler)
    redact_handlers(root)
    root.setLevel(level if isinstance(level, int) else str(level).upper())


__all__ = ["REDACTED", "RedactingFormatter", "configure_logging", "redact", "redact_data", "redact_handlers",
           "redact_url", "register_secret"]
