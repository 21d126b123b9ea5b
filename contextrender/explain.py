"""Why each tool result was or was not rendered: the table ``make demo`` and ``contextrender explain`` print.

One row per historical tool result at the next invocation: its size, age a_t,
reuse c_t, relevance s_t, usefulness U_t, the similarity penalty D(r,S) at
the step it was picked or lost (R = U − 0.5·D, docs/method.md §5), the greedy step that
picked it, its form in the render, and the reason (``picked``, ``not a
candidate``, ``did not fit``, ``outscored by <seq>``).
"""

from __future__ import annotations

from collections.abc import Mapping

from contextrender.render import Rendered
from contextrender.selector import Selection


def _num(x: float | None, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def explain_table(sel: Selection, *, compare: Mapping[str, Rendered] | None = None,
                  notes: Mapping[int, str] | None = None) -> str:
    """The explanation table of a ContextRender-family selection, as text.

    Args:
        sel: a selection made with ``explain=True``.
        compare: other policies' renders of the same session and budget; each gets a column saying
            whether it kept the result in full.
        notes: a note per result seq, printed at the end of its row.

    Returns:
        The table, one line per result, with a header line.
    """
    compare = dict(compare or {})
    notes = dict(notes or {})
    if sel.shortcut:
        return f"The full history fits B = {sel.budget}: every result is shown in full (docs/method.md §5 step 2)."
    head = (f"{'seq':>4} {'tool':<30} {'tok':>5} {'age':>4} {'c_t':>5} {'s_t':>5} {'U_t':>6} {'D':>5} {'pick':>4} "
            f"{'form':<11} {'reason':<22}" + "".join(f" {name[:12]:<12}" for name in compare))
    lines = [head]
    for sc in sel.scores:
        cells = "".join(f" {('kept' if sc.seq in r.visible else 'omitted'):<12}" for r in compare.values())
        note = f"  {notes[sc.seq]}" if sc.seq in notes else ""
        lines.append(f"{sc.seq:>4} {sc.tool_name[:30]:<30} {sc.tokens:>5} {sc.age:>4} {sc.reuse_count:>5.2f} "
                     f"{sc.relevance:>5.2f} {sc.usefulness:>6.3f} {_num(sc.similarity, '5.2f'):>5} "
                     f"{'' if sc.pick is None else sc.pick:>4} {sc.form:<11} {sc.reason:<22}{cells}{note}")
    return "\n".join(lines)


__all__ = ["explain_table"]
