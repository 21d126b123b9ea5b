"""The compaction model: summaries and compacted results (docs/method.md §5 step 5, §6).

Compact, Recency + Summary, ACON and ContextRender's oversized-result fallback
all call a :class:`Compactor`. :class:`LLMCompactor` sends the summary prompt
of docs/method.md §6 to any litellm model (paper: gpt-4.1, temperature 0).
:class:`ExtractiveCompactor` is the deterministic offline stand-in: it is *not*
an LLM; it keeps, in order, the lines that carry identifiers, numbers, paths
and errors, and its usage is counted as if the same prompt had been sent, so
offline costs stay comparable. Every record names the compactor that produced it.
"""

from __future__ import annotations

import re
from typing import Any, Protocol, runtime_checkable

from contextrender.events import Usage
from contextrender.tfa import extract_values
from contextrender.tokens import TokenCounter

#: docs/method.md §6: the summary sections, and what must survive verbatim.
SUMMARY_PROMPT = """You compress the working history of a tool-using agent so it can continue its task.
Write a summary of the content below with these sections:
## Files read
## Key observations
## Commands run
## Decisions
## Unresolved questions
Copy every number, configuration key, file path, identifier (ids, e-mail addresses, names of
records, API names) and error string verbatim; never paraphrase them. Omit pleasantries.
Use at most {max_tokens} tokens."""


@runtime_checkable
class Compactor(Protocol):
    """Compresses text to at most ``max_tokens`` tokens (the caller enforces the cap).

    ``instructions`` is a prompt template (:func:`fill`): its ``{max_tokens}``
    is the cap, every other brace is text; None means :data:`SUMMARY_PROMPT`.
    """

    name: str

    def compact(self, text: str, max_tokens: int, *, instructions: str | None = None) -> tuple[str, Usage]: ...


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def fill(template: str, **values: object) -> str:
    """The one prompt-template convention for every prompt sent to the compaction model.

    Each ``{name}`` in ``template`` whose name is given is replaced by
    ``str(value)``, in one pass: nothing else is special (``{{`` is two
    braces, an unknown ``{name}`` stays as it is) and the inserted values are
    never scanned again, so a guideline or a transcript containing
    ``{"id": 1}`` reaches the model exactly as written. Not ``str.format``,
    which would need every literal brace doubled.

    Instructions passed to :meth:`Compactor.compact` are templates whose
    ``{max_tokens}`` the compactor fills with the cap (:func:`compaction_prompt`);
    a policy that builds them from other text fills its own placeholders first
    (ACON: ``{guideline}``).
    """
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


def compaction_prompt(instructions: str | None, max_tokens: int) -> str:
    """The system prompt the compaction model receives: ``instructions`` (default
    :data:`SUMMARY_PROMPT`) with ``{max_tokens}`` filled in (:func:`fill`)."""
    return fill(instructions or SUMMARY_PROMPT, max_tokens=max_tokens)


def _enforce_cap(counter: TokenCounter, text: str, max_tokens: int) -> str:
    """A summary that still exceeds its share is truncated (docs/method.md §5 postcondition)."""
    return text if counter.text(text) <= max_tokens else counter.truncate(text, max_tokens)


class ExtractiveCompactor:
    """Deterministic offline stand-in for the compaction model (not an LLM).

    Lines carrying qualifying values (identifiers, numbers, paths, e-mail
    parts, error strings) are kept first, in their original order; other lines
    fill what room is left. Usage counts the prompt and output tokens as if an
    LLM had been called with :data:`SUMMARY_PROMPT`.
    """

    name = "extractive-offline"

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.counter = counter or TokenCounter()

    #: a line longer than this (tokens) is cut at field boundaries so single-line JSON can be kept in part
    SEGMENT_TOKENS = 48
    _BOUNDARY = re.compile(r"(?<=[,;\]}])\s*")

    def _segments(self, line: str) -> list[str]:
        if self.counter.text(line) <= self.SEGMENT_TOKENS:
            return [line]
        out: list[str] = []
        cur = ""
        for piece in self._BOUNDARY.split(line):
            if cur and self.counter.text(cur + " " + piece) > self.SEGMENT_TOKENS:
                out.append(cur)
                cur = piece
            else:
                cur = f"{cur} {piece}" if cur else piece
        if cur:
            out.append(cur)
        return out

    def compact(self, text: str, max_tokens: int, *, instructions: str | None = None) -> tuple[str, Usage]:
        prompt = compaction_prompt(instructions, max_tokens)
        lines = [seg for ln in text.splitlines() for seg in self._segments(ln.strip()) if seg]
        important = [i for i, ln in enumerate(lines) if extract_values(ln) or re.search(r"error|exception|fail", ln, re.I)]
        chosen: list[int] = []
        used = self.counter.text("Key observations:\n")
        important_set = set(important)
        for pool in (important, [i for i in range(len(lines)) if i not in important_set]):
            for i in pool:
                cost = self.counter.text(lines[i]) + 1
                if used + cost > max_tokens:
                    continue
                chosen.append(i)
                used += cost
        out = "Key observations:\n" + "\n".join(lines[i] for i in sorted(chosen))
        out = _enforce_cap(self.counter, out, max_tokens)
        usage = Usage(input=self.counter.text(prompt) + self.counter.text(text) + 8,
                      output=self.counter.text(out), calls=1)
        return out, usage


class LLMCompactor:
    """The compaction model through litellm (paper: gpt-4.1, temperature 0, top-p 1, seed 42)."""

    def __init__(self, model: str = "gpt-4.1", counter: TokenCounter | None = None, **completion_kwargs: Any) -> None:
        self.model = model
        self.name = f"llm:{model}"
        self.counter = counter or TokenCounter.for_model(model)
        self.kwargs = {"temperature": 0.0, "top_p": 1.0, "seed": 42, **completion_kwargs}

    def compact(self, text: str, max_tokens: int, *, instructions: str | None = None) -> tuple[str, Usage]:
        import litellm

        system = compaction_prompt(instructions, max_tokens)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        usage = Usage()
        out = ""
        for _ in range(2):  # re-ask once if the summary overshoots, then truncate
            resp = litellm.completion(model=self.model, messages=messages, max_tokens=max_tokens, **self.kwargs)
            out = resp.choices[0].message.content or ""
            u = resp.usage
            cached = getattr(getattr(u, "prompt_tokens_details", None), "cached_tokens", 0) or 0
            usage = usage + Usage(input=u.prompt_tokens, output=u.completion_tokens, cached=cached, calls=1)
            if self.counter.text(out) <= max_tokens:
                break
            messages = messages + [{"role": "assistant", "content": out},
                                   {"role": "user", "content": f"Too long. Rewrite it in at most {max_tokens} tokens."}]
        return _enforce_cap(self.counter, out, max_tokens), usage


def make_compactor(kind: str = "extractive", model: str | None = None, **kwargs: Any) -> Compactor:
    """``extractive`` (offline stand-in) or ``llm`` (litellm ``model``)."""
    if kind == "extractive":
        return ExtractiveCompactor()
    if kind == "llm":
        return LLMCompactor(model or "gpt-4.1", **kwargs)
    raise ValueError(f"unknown compactor {kind!r}; choose extractive or llm")
