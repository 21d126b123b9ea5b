"""Prompt-cache breakpoints in Messages API requests: what the API refuses, and what a forwarded request must
keep of the client's (docs/service.md, "Cache breakpoints"). Written from the API's rules, independently of
the code under test.

:func:`cache_control_problems` is what the API answers 400 to (its own messages): more than 4 blocks with
``cache_control``, one on a thinking or redacted thinking block or an empty text block, a ``ttl='1h'`` one
after a ``ttl='5m'`` one (in the order tools, system, messages). :func:`breakpoint_problems` compares a
forwarded request with the client's; :func:`shared_prefix_problems` compares two consecutive forwarded
requests, as the provider's cache reads them.
"""

from __future__ import annotations

import json
from typing import Any

MAX = 4
#: The blocks a breakpoint may be put on (thinking, redacted thinking and empty text may not carry one).
CARRIERS = frozenset({"text", "image", "document", "tool_use", "tool_result"})

Place = tuple[int, int]  # (message, block) in a request's messages


def canonical(value: Any) -> str:
    """JSON as the provider reads it: key order and whitespace aside."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def blocks(message: dict[str, Any]) -> list[Any]:
    """A message's content blocks; a string content is one item (the string), which carries no breakpoint."""
    content = message["content"]
    return [content] if isinstance(content, str) else list(content)


def marks(block: Any) -> list[dict[str, Any]]:
    """The breakpoints on a block and, for a tool_result, on the blocks of its content."""
    if not isinstance(block, dict):
        return []
    out = [block["cache_control"]] if block.get("cache_control") else []
    if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
        out += [b["cache_control"] for b in block["content"] if b.get("cache_control")]
    return out


def _carrier(block: Any) -> bool:
    return (isinstance(block, dict) and block.get("type") in CARRIERS
            and (block["type"] != "text" or bool(block.get("text"))))


def _long(cc: dict[str, Any]) -> bool:
    return cc.get("ttl") == "1h"


def located_breakpoints(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every breakpoint of a request with its path, in the order the provider processes them."""
    out: list[tuple[str, dict[str, Any]]] = []
    for key in ("tools", "system"):
        part = body.get(key)
        if isinstance(part, list):
            out += [(f"{key}.{n}", b["cache_control"]) for n, b in enumerate(part) if b.get("cache_control")]
    for i, m in enumerate(body.get("messages") or []):
        for j, b in enumerate(blocks(m)):
            if not isinstance(b, dict):
                continue
            if b.get("cache_control"):
                out.append((f"messages.{i}.content.{j}", b["cache_control"]))
            if b.get("type") == "tool_result" and isinstance(b.get("content"), list):
                out += [(f"messages.{i}.content.{j}.content.{k}", c["cache_control"])
                        for k, c in enumerate(b["content"]) if c.get("cache_control")]
    return out


def cache_control_problems(body: dict[str, Any]) -> list[str]:
    """What the Messages API refuses about a request's breakpoints, in its words (empty when it takes them)."""
    found = located_breakpoints(body)
    if len(found) > MAX:
        return [f"A maximum of 4 blocks with cache_control may be provided. Found {len(found)}."]
    problems = []
    for i, m in enumerate(body.get("messages") or []):
        for j, b in enumerate(blocks(m)):
            if isinstance(b, dict) and b.get("cache_control"):
                if b.get("type") in ("thinking", "redacted_thinking"):
                    problems.append(f"messages.{i}.content.{j}.{b['type']}.cache_control: Extra inputs are not "
                                    "permitted")
                elif b.get("type") == "text" and not b.get("text"):
                    problems.append(f"messages.{i}.content.{j}.text: cache_control cannot be set for empty text "
                                    "blocks")
    seen_short = False
    for path, cc in found:
        if _long(cc) and seen_short:
            problems.append(f"{path}.cache_control.ttl: a ttl='1h' cache_control block must not come after a "
                            "ttl='5m' cache_control block. Note that blocks are processed in the following order: "
                            "`tools`, `system`, `messages`.")
            break
        seen_short = seen_short or not _long(cc)
    return problems


# -- which of the client's blocks a forwarded request holds ------------------------------------------------


def _bare(block: Any, *also: str) -> Any:
    return {k: v for k, v in block.items() if k not in ("cache_control", *also)} if isinstance(block, dict) else block


def _same(f: Any, c: Any) -> bool:
    """Whether forwarded block ``f`` is the client's block ``c``: equal but for a breakpoint, or, for a
    tool_result, equal but for its content (an omitted result's marker)."""
    if isinstance(c, str):  # a string content, merged into another message as its one text block
        return f == c or f == {"type": "text", "text": c}
    if isinstance(c, dict) and c.get("type") == "tool_result":
        return (isinstance(f, dict) and f.get("type") == "tool_result"
                and canonical(_bare(f, "content")) == canonical(_bare(c, "content")))
    return canonical(_bare(f)) == canonical(_bare(c))


def _as_subsequence(client: list[Any], forwarded: list[Any]) -> list[int] | None:
    out, j = [], 0
    for f in forwarded:
        while j < len(client) and not _same(f, client[j]):
            j += 1
        if j == len(client):
            return None
        out.append(j)
        j += 1
    return out


def alignment(client: list[dict[str, Any]], forwarded: list[dict[str, Any]]) -> dict[Place, Place]:
    """Where each forwarded block came from in the client's messages: forwarded (k, n) -> client (i, j).

    A forwarded message is the next client message of its role whose blocks hold its blocks in order; a
    forwarded message that is none of the client's (an inserted summary) has no entry. A forwarded user
    message may be several merged into one (the render left them adjacent: an inserted summary, the task and
    a later user turn): each of its blocks is the next client user block equal to it, if any.
    """
    out: dict[Place, Place] = {}
    start = 0
    for k, f in enumerate(forwarded):
        if f["role"] == "user":
            found: dict[Place, Place] = {}
            cursor = (start, 0)
            for n, b in enumerate(blocks(f)):
                pos = next(((i, j) for i in range(cursor[0], len(client)) if client[i]["role"] == "user"
                            for j in range(cursor[1] if i == cursor[0] else 0, len(blocks(client[i])))
                            if _same(b, blocks(client[i])[j])), None)
                if pos is not None:
                    found[(k, n)] = pos
                    cursor = (pos[0], pos[1] + 1)
            if found:
                out.update(found)
                start = cursor[0] + 1
            continue
        for i in range(start, len(client)):
            if client[i]["role"] == f["role"] and (idx := _as_subsequence(blocks(client[i]), blocks(f))) is not None:
                out.update({(k, n): (i, j) for n, j in enumerate(idx)})
                start = i + 1
                break
    return out


def _inner(block: Any) -> list[dict[str, Any]]:
    """The breakpoints on the content blocks of a tool_result."""
    return marks(block)[1:] if isinstance(block, dict) and block.get("cache_control") else marks(block)


def _nearest(forwarded: list[dict[str, Any]], kept: dict[Place, Place], limit: Place,
             client: list[dict[str, Any]]) -> Place | None:
    """The forwarded place of the kept client block nearest at or before client place ``limit`` that carries a
    breakpoint or can carry one (a string content cannot, also where a merge made it a text block)."""
    for c in sorted((c for c in kept if c <= limit), reverse=True):
        if isinstance(blocks(client[c[0]])[c[1]], str):
            continue
        k, n = kept[c]
        fb = blocks(forwarded[k])[n]
        if marks(fb) or _carrier(fb):
            return k, n
    return None


def _out_of_ttl_order(forwarded: dict[str, Any], at: Place, cc: dict[str, Any]) -> bool:
    """Whether breakpoint ``cc`` on forwarded block ``at`` would put a 1h breakpoint after a 5m one."""
    for path, other in located_breakpoints(forwarded):
        parts = path.split(".")
        place = (int(parts[1]), int(parts[3])) if parts[0] == "messages" else (-1, -1)
        if place == at:
            continue
        if (_long(cc) and place < at and not _long(other)) or (not _long(cc) and place > at and _long(other)):
            return True
    return False


def breakpoint_problems(client: dict[str, Any], forwarded: dict[str, Any], inserted: bool = False) -> list[str]:
    """What ``forwarded`` (the request that went upstream) breaks of the client's request and its breakpoints.

    Every forwarded block is one of the client's, in order (a tool_result may carry other content); tools and
    system are as sent; the API takes the breakpoints (at most 4, a 1h one never after a 5m one, none on
    thinking or empty text); a client breakpoint on a kept block is there as sent; one the render lost (with
    its block, or inside an omitted result's content) is on the nearest kept block at or before its place
    that can carry one — unless that block already carried one, or the cap or the TTL order leaves it out;
    no other breakpoint is added. ``inserted``: forwarded messages that are none of the client's (a
    method's summary) are allowed.
    """
    problems = cache_control_problems(forwarded)
    for key in ("tools", "system"):
        if canonical(forwarded.get(key)) != canonical(client.get(key)):
            problems.append(f"{key}: not as the client sent it")
    cm, fm = client["messages"], forwarded["messages"]
    where = alignment(cm, fm)
    for k, m in enumerate(fm):
        own = [n for n in range(len(blocks(m))) if (k, n) in where]
        if len(own) < len(blocks(m)) and not (inserted and (not own or m["role"] == "user")):
            problems.append(f"messages.{k}: blocks that are not the client's: {canonical(m)[:200]}")
    kept = {c: f for f, c in where.items()}
    due: dict[Place, list[dict[str, Any]]] = {}  # forwarded place -> the lost breakpoints that move there
    for i, m in enumerate(cm):
        for j, cb in enumerate(blocks(m)):
            if not isinstance(cb, dict):
                continue
            f = kept.get((i, j))
            if f is None:
                lost = marks(cb)
            else:
                fb = blocks(fm[f[0]])[f[1]]
                if cb.get("cache_control") and fb.get("cache_control") != cb["cache_control"]:
                    problems.append(f"client messages.{i}.content.{j}: its breakpoint is not on the kept block")
                lost = _inner(cb) if canonical(fb.get("content")) != canonical(cb.get("content")) else []
            for cc in lost:
                target = _nearest(fm, kept, (i, j), cm)
                if target is not None:
                    due.setdefault(target, []).append(cc)
    total = len(located_breakpoints(forwarded)) + bool(forwarded.get("cache_control"))  # automatic caching: one
    for k, m in enumerate(fm):
        for n, fb in enumerate(blocks(m)):
            c = where.get((k, n))
            cb = blocks(cm[c[0]])[c[1]] if c is not None else None
            added = isinstance(fb, dict) and fb.get("cache_control") and not (
                isinstance(cb, dict) and cb.get("cache_control"))
            if added and fb["cache_control"] not in due.get((k, n), []):
                problems.append(f"messages.{k}.content.{n}: a breakpoint the client did not place there")
            elif (not added and (k, n) in due and not marks(fb) and total < MAX
                  and not _out_of_ttl_order(forwarded, (k, n), due[(k, n)][0])):
                problems.append(f"messages.{k}.content.{n}: the breakpoint lost after it was not moved here")
    return problems


# -- what two consecutive requests share ---------------------------------------------------------------


def _items(body: dict[str, Any]) -> list[str]:
    """A request's messages as the provider's cache reads them: one item per block (a message's first one with
    its role, so where a message starts is read too), breakpoints aside (they say where to cache, they are not
    part of what is cached)."""
    return [canonical([m["role"] if n == 0 else None, _bare(b)]) for m in body["messages"]
            for n, b in enumerate(blocks(m))]


def _changed(client: dict[str, Any], forwarded: dict[str, Any]) -> list[bool]:
    """Per item of ``forwarded`` (as :func:`_items` lists them): whether the render changed it — a block the
    render made, other content than the client's, or the first block after some it left out."""
    cm, fm = client["messages"], forwarded["messages"]
    where = alignment(cm, fm)
    index = {(i, j): n for n, (i, j) in enumerate((i, j) for i, m in enumerate(cm) for j in range(len(blocks(m))))}
    out, prev = [], -1
    for k, m in enumerate(fm):
        for n, b in enumerate(blocks(m)):
            c = where.get((k, n))
            if c is None:
                out.append(True)
                continue
            differs = canonical(_bare(b)) != canonical(_bare(blocks(cm[c[0]])[c[1]]))
            out.append(differs or index[c] != prev + 1)
            prev = index[c]
    return out


def shared_prefix_problems(earlier: tuple[dict[str, Any], dict[str, Any]],
                           later: tuple[dict[str, Any], dict[str, Any]]) -> list[str]:
    """What keeps two consecutive forwarded requests from sharing their prefix up to the first block the render
    changed. ``earlier``/``later``: (the client's request, the forwarded one).

    The client's own requests must share theirs (the later one appends, breakpoints aside); then the forwarded
    ones must be the same, tools and system included, up to their first difference, and there the render changed
    the block in one of them (an omitted result, a dropped block, a block the render made).
    """
    (c1, f1), (c2, f2) = earlier, later
    problems = []
    for key in ("tools", "system"):
        if canonical(f1.get(key)) != canonical(f2.get(key)):
            problems.append(f"{key} differ between the requests")
    a, b = _items(c1), _items(c2)
    if b[:len(a)] != a:
        problems.append("the client's own requests do not share their prefix")
        return problems
    x, y = _items(f1), _items(f2)
    d = next((n for n, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
    if d == len(x):
        return problems  # the later request holds all of the earlier one, and more
    ch1, ch2 = _changed(c1, f1), _changed(c2, f2)
    if not (ch1[d] or (d < len(y) and ch2[d])):
        problems.append(f"item {d} differs between the requests though the render changed it in neither: "
                        f"{x[d][:160]} / {y[d][:160] if d < len(y) else '(end)'}")
    return problems
