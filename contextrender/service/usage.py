"""What the three APIs' usage readers share: the checks on the counts an upstream reports (docs/service.md,
"Prompt-cache usage").

Each API reads its own wire fields in its own module — chat completions in :mod:`~contextrender.service.streams`
(:func:`~contextrender.service.streams.chat_prompt_usage`), the Messages API in
:mod:`~contextrender.service.anthropic_messages` and the Responses API in :mod:`~contextrender.service.responses_api`
(each ``prompt_usage``) — and hands the counts to :func:`prompt_usage`, which makes them one
:class:`~contextrender.billing.PromptUsage` or says they are unknown.

An upstream's numbers are data, never trusted to be sane: a count is a JSON integer from 0 to :data:`MAX_TOKENS`
(a bool, a float, a string or a larger number is not one). Usage without its prompt count, with a field that is
present but not a count, or with more cached tokens than prompt tokens is *unknown* (None), never zero and never
a guess. A cache or output count the upstream leaves out is 0: it reported none.
"""

from __future__ import annotations

from typing import Any

from contextrender.billing import PromptUsage

#: The largest token count taken from an upstream (far above any context window; sums of a session's requests
#: stay far inside a SQLite integer).
MAX_TOKENS = 10**12


class _NotACount(ValueError):
    pass


def count(value: Any) -> int | None:
    """``value`` as a token count (an int, not a bool, from 0 to :data:`MAX_TOKENS`), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
        return value
    return None


def _optional(value: Any) -> int:
    """An optional count: absent (None) is 0; present, it must be a count."""
    if value is None:
        return 0
    n = count(value)
    if n is None:
        raise _NotACount
    return n


def prompt_usage(prompt: Any, cache_read: Any = None, cache_write: Any = None, output: Any = None,
                 *, uncached: Any = None) -> PromptUsage | None:
    """One request's :class:`~contextrender.billing.PromptUsage` from the counts an API reports, or None (unknown).

    ``prompt`` is every prompt token, cached ones included (OpenAI's ``prompt_tokens`` / ``input_tokens``); an API
    that reports only the uncached part (Anthropic's ``input_tokens``) passes it as ``uncached`` instead, and the
    prompt is that plus the reads and writes (docs/method.md §14: what is read from the cache and written to it).
    """
    try:
        read, write, out = _optional(cache_read), _optional(cache_write), _optional(output)
        if uncached is not None:
            base = count(uncached)
            total = None if base is None else base + read + write
        else:
            total = count(prompt)
    except _NotACount:
        return None
    if total is None or read + write > total:
        return None
    return PromptUsage(total, read, write, out)


__all__ = ["MAX_TOKENS", "count", "prompt_usage"]
