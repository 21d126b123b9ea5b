"""The single token counter (docs/method.md §1: B is measured in tiktoken tokens).

Every policy, budget check and cost figure uses :class:`TokenCounter`. A
message costs its content, its tool calls' names and raw argument strings, and
a fixed framing overhead, so the count of an assembled history is the sum of
its messages' counts: Tok(H) can be updated exactly when one tool result's body
is swapped for its omission marker.

The encodings the counter needs — ``o200k_base`` (the default, gpt-4.1) and
``cl100k_base`` (embedding usage) — ship inside the package
(``contextrender/encodings``, see its NOTICE) and are built straight into a
:class:`tiktoken.Encoding`: no download, no cache directory and no
environment variable is involved on first use. Any other encoding is loaded
by :func:`tiktoken.get_encoding` (tiktoken's own download and cache).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.resources
from dataclasses import dataclass, field
from typing import Any

import tiktoken

from contextrender.events import Message

#: Framing tokens per message (role and separators), as in OpenAI's counting guide.
MESSAGE_OVERHEAD = 4
#: Framing tokens per tool call inside an assistant message.
TOOL_CALL_OVERHEAD = 3
DEFAULT_ENCODING = "o200k_base"


_ENDOFTEXT = "<|endoftext|>"
_FIM_PREFIX = "<|fim_prefix|>"
_FIM_MIDDLE = "<|fim_middle|>"
_FIM_SUFFIX = "<|fim_suffix|>"
_ENDOFPROMPT = "<|endofprompt|>"


@dataclass(frozen=True)
class _Shipped:
    """A BPE rank file in ``contextrender/encodings`` and what tiktoken defines around it.

    ``pat_str`` and ``special_tokens`` are copied from tiktoken's own definitions
    (``tiktoken_ext/openai_public.py``); tests/packaging checks that the result
    tokenises exactly as ``tiktoken.get_encoding`` does.
    """

    file: str
    sha256: str
    pat_str: str
    special_tokens: dict[str, int] = field(default_factory=dict)


#: Encodings shipped with the package (``contextrender/encodings/NOTICE`` says where they come from).
SHIPPED_ENCODINGS: dict[str, _Shipped] = {
    "o200k_base": _Shipped(
        file="o200k_base.tiktoken",
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        pat_str="|".join([
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""",
            r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
            r"""\s*[\r\n]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",
        ]),
        special_tokens={_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
    ),
    "cl100k_base": _Shipped(
        file="cl100k_base.tiktoken",
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        pat_str=r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
        special_tokens={_ENDOFTEXT: 100257, _FIM_PREFIX: 100258, _FIM_MIDDLE: 100259, _FIM_SUFFIX: 100260,
                        _ENDOFPROMPT: 100276},
    ),
}


def _parse_ranks(data: bytes, source: str) -> dict[bytes, int]:
    """``base64-token rank`` per line (tiktoken's BPE file format) → mergeable ranks."""
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as e:  # binascii.Error is a ValueError
            raise ValueError(f"{source}:{lineno}: not a 'base64-token rank' line ({e})") from None
    return ranks


def _load_shipped(name: str) -> tiktoken.Encoding:
    spec = SHIPPED_ENCODINGS[name]
    source = f"contextrender/encodings/{spec.file}"
    data = importlib.resources.files("contextrender").joinpath("encodings", spec.file).read_bytes()
    # The same integrity check tiktoken applies to a download: a damaged install fails loudly
    # here instead of silently miscounting every budget.
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise ValueError(f"{source}: sha256 {digest} does not match the shipped encoding's {spec.sha256}; "
                         "reinstall contextrender")
    return tiktoken.Encoding(name, pat_str=spec.pat_str, mergeable_ranks=_parse_ranks(data, source),
                             special_tokens=dict(spec.special_tokens))


@functools.cache
def _encoding(name: str) -> tiktoken.Encoding:
    if name in SHIPPED_ENCODINGS:
        return _load_shipped(name)
    return tiktoken.get_encoding(name)  # not shipped: tiktoken's own loader (may download)


def encoding_name_for(model: str | None) -> str:
    """tiktoken encoding for ``model``; o200k_base for gpt-4.1 and unknown models."""
    if not model:
        return DEFAULT_ENCODING
    bare = model.split("/")[-1]
    try:
        return tiktoken.encoding_name_for_model(bare)
    except KeyError:
        return DEFAULT_ENCODING


class TokenCounter:
    """Counts tokens of text and of OpenAI-format messages with one encoding.

    Args:
        encoding: a tiktoken encoding name. ``o200k_base`` (default) and
            ``cl100k_base`` are read from the package; others via :func:`tiktoken.get_encoding`.
    """

    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        self.encoding_name = encoding
        self._enc = _encoding(encoding)

    @classmethod
    def for_model(cls, model: str | None) -> TokenCounter:
        """A counter in ``model``'s encoding (see :func:`encoding_name_for`)."""
        return cls(encoding_name_for(model))

    def text(self, text: str) -> int:
        """Tokens of ``text``; special-token strings such as ``<|endoftext|>`` count as plain text."""
        if not text:
            return 0
        return len(self._enc.encode(text, disallowed_special=()))

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` (on token boundaries) with at most ``max_tokens`` tokens."""
        if max_tokens <= 0:
            return ""
        ids = self._enc.encode(text, disallowed_special=())
        if len(ids) <= max_tokens:
            return text
        return self._enc.decode(ids[:max_tokens])

    def message(self, msg: Message | dict[str, Any]) -> int:
        """Tokens of one message: framing overhead, content, and each tool call's name and raw arguments.

        Args:
            msg: a :class:`~contextrender.events.Message` or an OpenAI-format dict (validated).

        Returns:
            ``MESSAGE_OVERHEAD + Tok(content) + Σ (TOOL_CALL_OVERHEAD + Tok(name) + Tok(arguments))``.
        """
        m = Message.from_openai(msg)
        n = MESSAGE_OVERHEAD + self.text(m.content)
        for call in m.tool_calls:
            n += TOOL_CALL_OVERHEAD + self.text(call.name) + self.text(call.arguments)
        return n

    def messages(self, msgs: list[Message] | list[dict[str, Any]]) -> int:
        """Tokens of a history: the sum of its messages' counts."""
        return sum(self.message(m) for m in msgs)

    def tool_result(self, content: str) -> int:
        """Cost of a tool message carrying ``content``."""
        return MESSAGE_OVERHEAD + self.text(content)
