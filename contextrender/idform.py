"""The *id form* of a tool result: the values a later call could pass on, grouped by key, without the prose.

A call that needs an earlier value — an order's item ids, a payment method, a flight number, a file
name — needs that value, not the result around it. The id form keeps such values at a fraction of
the result's tokens, so a policy can keep the ids of many results when only a few fit in full
(``contextrender_plus``'s ``id_floor``; docs/method.md, "Beyond the paper")::

    [omitted; values]
    order_id: #W2378156
    items.item_id: 1151293680, 4983901480
    items.product_id: 1656367028, 4896585277
    payment_history.payment_method_id: credit_card_9513926

For a JSON result: every scalar leaf that a call could need — every number (a call that writes 35 as
35.0 needs it), a string of :data:`~contextrender.readiness.MIN_CHARS` characters or more without
whitespace, or a short phrase of up to :data:`PHRASE_CHARS` characters such as an address line — each
once under its key path (list positions dropped; a key that is not a name, such as an id used as a dict
key, or any key of a dict of two or more records, becomes ``*`` and is listed as a value itself). A longer
text leaf, and any text that is not JSON, contributes its quoted strings, its numbers and its identifiers
(Tool-Flow Analysis' qualifying values, docs/method.md §3), those with a digit first. At most
:data:`MAX_VALUES` values per key. What it drops: booleans and nulls, short strings, the wording of
prose, and which values sat in the same record. It is not the original, so a result shown so is never a
*visible* result for recall (docs/method.md §7); whole-token matching still finds each value in it, so
call readiness counts it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from contextrender.readiness import MIN_CHARS
from contextrender.tfa import extract_values

__all__ = ["HEADER", "MAX_VALUES", "PHRASE_CHARS", "id_form"]

#: The first line of every id form: what the model sees in place of the result.
HEADER = "[omitted; values]"
#: A string leaf with whitespace is kept whole up to this many characters (an address, a full name).
PHRASE_CHARS = 40
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9 _-]*")
_MAX_DEPTH = 64
#: Values listed under one key path at most (the rest are counted).
MAX_VALUES = 64


#: A quoted string in text that is not JSON (a Python repr, a log line): '...' or "...".
_QUOTED = re.compile(r"'([^'\n]{1,200})'|\"([^\"\n]{1,200})\"")
_NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?![\w])")


def _text_values(text: str) -> list[str]:
    """Values of a text that is not JSON: quoted strings a call could need, identifiers, and numbers written
    with at least :data:`MIN_CHARS` characters, in order of first occurrence."""
    found: list[tuple[int, str]] = []
    for m in _QUOTED.finditer(text):
        v = m.group(1) if m.group(1) is not None else m.group(2)
        if len(v) >= MIN_CHARS and (not any(c.isspace() for c in v) or len(v) <= PHRASE_CHARS):
            found.append((m.start(), v))
    found += [(m.start(), m.group()) for m in _NUMBER.finditer(text)]  # any number: 35 shows a call's 35.0
    found += [(text.find(v), v) for v in extract_values(text)]
    # values with a digit first (numbers, codes, dates), then the rest: when a long text has more values than
    # one key lists (MAX_VALUES), the words go first
    ordered = sorted(found, key=lambda p: (not any(c.isdigit() for c in p[1]), p[0]))
    return list(dict.fromkeys(v for _, v in ordered))


def _leaf(v: Any) -> list[str]:
    """What one scalar leaf contributes."""
    if v is None or isinstance(v, bool):
        return []
    if isinstance(v, (int, float)):
        if isinstance(v, float) and not math.isfinite(v):
            return []
        return [json.dumps(v)]  # any number: a call may write 35 as 35.0, which compares equal
    s = str(v)
    if len(s) < MIN_CHARS:
        return []
    if not any(c.isspace() for c in s) or len(s) <= PHRASE_CHARS:
        return [s]
    return _text_values(s)


def _walk(v: Any, path: tuple[str, ...], out: dict[tuple[str, ...], list[str]], depth: int) -> set[str]:
    """Add ``v``'s leaves to ``out`` under their key paths; return every leaf string listed below ``v``."""
    if depth > _MAX_DEPTH:
        return set()
    seen: set[str] = set()
    if isinstance(v, dict):
        # a dict of two or more records is keyed by ids (booking001, booking_901, ...), whatever they look like
        records = len(v) >= 2 and all(isinstance(x, dict) for x in v.values())
        for k, x in v.items():
            key = str(k)
            if _NAME.fullmatch(key) and not records:
                seen |= _walk(x, (*path, key), out, depth + 1)
            else:  # an id (or any non-name) used as a key: a wildcard in the path, and a value itself
                # unless the record it keys repeats it (a product's variants keyed by their item_id)
                inner = _walk(x, (*path, "*"), out, depth + 1)
                seen |= inner
                own = [k2 for k2 in _leaf(key) if k2 not in inner]
                out.setdefault((*path, "*"), []).extend(own)
                seen.update(own)
    elif isinstance(v, list):
        for x in v:
            seen |= _walk(x, path, out, depth + 1)
    else:
        leaves = _leaf(v)
        out.setdefault(path, []).extend(leaves)
        seen.update(leaves)
    return seen


def id_form(text: str) -> str:
    """The id form of a tool result's text (just :data:`HEADER` when it holds no such value)."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        obj = None
    lines = [HEADER]
    if isinstance(obj, (dict, list)):
        groups: dict[tuple[str, ...], list[str]] = {}
        _walk(obj, (), groups, 0)
        for path, values in groups.items():
            distinct = list(dict.fromkeys(values))  # each value once per key: the keys say what it is
            if distinct:
                lines.append(f"{'.'.join(path) or '-'}: {_capped(distinct)}")
    else:
        values = _text_values(text)
        if values:
            lines.append(_capped(values))
    return "\n".join(lines)


def _capped(values: list[str]) -> str:
    """At most :data:`MAX_VALUES` values of one key (a long series — prices over time — is not an id list)."""
    if len(values) <= MAX_VALUES:
        return ", ".join(values)
    return ", ".join(values[:MAX_VALUES]) + f", … ({len(values) - MAX_VALUES} more)"
