"""Why each tool result was or was not rendered: the table ``make demo`` and ``contextrender explain`` print.

One row per historical tool result at the next invocation: its size, age a_t,
reuse c_t, relevance s_t, usefulness U_t, the similarity penalty D(r,S) at
the step it was picked or lost (R = U − 0.5·D, docs/method.md §5), the greedy step that
picked it, its form in the render, and the reason (``picked``, ``not a
candidate``, ``did not fit``, ``outscored by <seq>``; "whole" added where the result is shown by its values
instead). :func:`cache_summary` is the line after it: the
session's requests as the upstream billed them.
"""

from __future__ import annotations

from collections.abc import Mapping

from contextrender.graph import OMISSION_MARKER, UsageTotals
from contextrender.render import Rendered
from contextrender.selector import Selection

#: A result's form as its name in the table: a result shown as ids or as a table keeps its values — not "omitted".
FORM_LABELS = {"ids": "ids (values)", "tabular": "table (values)"}


def form_in(render: Rendered | Selection, seq: int) -> str:
    """The form result ``seq`` has in another policy's render: a selection's own form, else read off the render —
    ``full``, ``omitted`` (a marker or a peer's placeholder), ``shortened`` (any other text), ``not rendered``."""
    if isinstance(render, Selection):
        form = render.forms.get(seq, "full" if render.shortcut or seq in render.rendered.visible else "not rendered")
        return FORM_LABELS.get(form, form)
    if seq in render.visible:
        return "full"
    if seq not in render.sources:
        return "not rendered"
    body = render.messages[render.sources.index(seq)].get("content")
    text = body.strip() if isinstance(body, str) else ""
    return "omitted" if text == OMISSION_MARKER or (text.startswith(("[", "(", "<")) and len(text) < 60) else "shortened"


def _num(x: float | None, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def _reason(reason: str, form: str) -> str:
    """The selector's reason, as it reads beside the form: a result shown as ids or a table was left out only
    *whole* (it did not fit whole, or was outscored whole), not dropped."""
    if form not in FORM_LABELS:
        return reason
    if reason == "did not fit":
        return "did not fit whole"
    return reason.replace("outscored by", "outscored whole by", 1)


def explain_table(sel: Selection, *, compare: Mapping[str, Rendered | Selection] | None = None,
                  notes: Mapping[int, str] | None = None) -> str:
    """The explanation table of a ContextRender-family selection, as text.

    Args:
        sel: a selection made with ``explain=True``.
        compare: other policies' renders (or selections) of the same session and budget; each gets a column
            with the result's form there (:func:`form_in`).
        notes: a note per result seq, printed at the end of its row.

    Returns:
        The table, one line per result, with a header line.
    """
    compare = dict(compare or {})
    notes = dict(notes or {})
    if sel.shortcut:
        return f"The full history fits B = {sel.budget}: every result is shown in full (docs/method.md §5 step 2)."
    # Tool and method names whole (a column as wide as its longest), never cut.
    tw = max([4, *(len(sc.tool_name) for sc in sel.scores)])
    widths = {name: max(len(name), 14) for name in compare}
    head = (f"{'seq':>4} {'tool':<{tw}} {'tok':>5} {'age':>4} {'c_t':>5} {'s_t':>5} {'U_t':>6} {'D':>5} {'pick':>4} "
            f"{'form':<14} {'reason':<22}" + "".join(f" {name:<{widths[name]}}" for name in compare))
    lines = [head]
    for sc in sel.scores:
        cells = "".join(f" {form_in(r, sc.seq):<{widths[name]}}" for name, r in compare.items())
        note = f"  {notes[sc.seq]}" if sc.seq in notes else ""
        lines.append(f"{sc.seq:>4} {sc.tool_name:<{tw}} {sc.tokens:>5} {sc.age:>4} {sc.reuse_count:>5.2f} "
                     f"{sc.relevance:>5.2f} {sc.usefulness:>6.3f} {_num(sc.similarity, '5.2f'):>5} "
                     f"{'' if sc.pick is None else sc.pick:>4} {FORM_LABELS.get(sc.form, sc.form):<14} "
                     f"{_reason(sc.reason, sc.form):<22}{cells}".rstrip() + note)
    return "\n".join(lines)


def cache_summary(totals: UsageTotals) -> str:
    """One line: a session's answered model requests as the upstream billed them (the proxy and ``wrap`` record
    them; docs/service.md, "Prompt-cache usage") — how many, how many carried usage, their prompt tokens, the share
    read from the prompt cache and the tokens written to it (docs/method.md §14), and the output."""
    if not totals.requests:
        return ("prompt cache as billed: no answered requests recorded for this session (the proxy and "
                "contextrender.wrap record the upstream's usage)")
    head = f"prompt cache as billed: {totals.requests} answered requests, {totals.known} with usage"
    if not totals.known:
        return head + " (the upstream reported none)"
    u, share = totals.usage, totals.cache_hit_share
    hit = "–" if share is None else f"{100 * share:.1f} %"
    return (f"{head}: {u.prompt} prompt tokens, {u.cache_read} read from the cache ({hit}), {u.cache_write} written "
            f"to it, {u.uncached} uncached; {u.output} output tokens")


__all__ = ["FORM_LABELS", "cache_summary", "explain_table", "form_in"]
