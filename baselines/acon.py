"""ACON-style history and observation compression (docs/method.md §6).

ACON compresses an agent's context with a natural-language guideline and a
compressor model; the paper runs it with the authors' optimised guideline and
the compaction model as compressor, under the same B as every other method.
This module implements that procedure; it contains no code or prompt text from
the ACON project.

- **Guideline.** By default the project's own guideline,
  ``baselines/acon_guideline.md``, written from scratch for this harness (its
  "History compression" and "Observation compression" sections). The authors'
  optimised guideline can be used instead by passing its file as
  ``guideline_path`` (and optionally ``observation_guideline_path``); a file
  without those section headings is used whole as the history guideline.
  The guideline reaches the compaction model exactly as written: it is
  inserted with :func:`~contextrender.compaction.fill`, so braces in it (JSON
  examples such as ``{"id": 1}``) are text; only ``{max_tokens}``, the cap
  placeholder of every compaction prompt, is filled in.
- **Thresholds by benchmark.** ACON's own settings differ by benchmark
  (docs/method.md §6): history 4096 / observation 1024 on AppWorld, 2048 / 400 on QA.
  A threshold of 0 (the default, ``conf/method/acon.yaml``) means "ACON's
  value for the benchmark": :func:`resolve_thresholds` fills it in from
  :data:`BENCHMARK_THRESHOLDS` (QA's for ``moqa8*``) where the benchmark is
  known — the runner (``cfg.benchmark``) and replay (``benchmark=`` or the
  traces' recorded benchmark) call it before the policy is built, so the
  resolved numbers are what the config hash and the record see. Elsewhere
  (the service, a bare ``Acon()``) 0 means AppWorld's values. A positive
  value always wins.
- **Observation compression.** A tool result whose message exceeds the
  observation threshold (AppWorld default 1024 tokens; QA uses 400) is
  compressed once by the compactor with the observation guideline, to at most
  ``observation_ratio`` of the threshold, and shown in that form from then on
  (it no longer counts as visible). The compressed text is a graph artifact.
- **History compression.** When the history as ACON holds it (its summary plus
  the uncompressed turns, observations in compressed form) exceeds the history
  threshold (AppWorld default 4096; QA uses 2048), everything except the last
  ``keep_last_turns`` turns (default 1; a turn = one invocation with its
  tool calls and results) is compressed, together with the previous summary,
  into a new summary. The compressor is asked to write it under a
  "History Summary" heading; the text after that heading is kept (fallback:
  the whole output). The summary message is at most ``summary_share`` of the
  threshold. It is a user-role message right after the system prompt.
- **Same B.** Effective thresholds are min(threshold, B), so ACON never
  renders above B; if the summary plus the last turn still exceed B, the
  docs/method.md §5 project rules apply to the last turn (results newest first while
  they fit, the others as omission markers; oldest messages dropped if the
  verbatim messages alone overflow).

State (the summary and what it covers) is a graph artifact keyed by policy
name, budget, compactor and guideline digest: a reopened graph resumes
identically and a repeated render never compresses twice.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from contextrender.baselines._common import (
    Covered,
    Stored,
    SummaryPolicy,
    cap_text,
    compact,
    digest,
    state_key,
    summary_cost,
    uncovered,
)
from contextrender.compaction import Compactor, fill
from contextrender.events import Usage
from contextrender.graph import Session
from contextrender.render import Rendered, Scope, check_positive, check_share

DEFAULT_GUIDELINE_PATH = Path(__file__).with_name("acon_guideline.md")

SUMMARY_LABEL = ("[History Summary: the earlier steps of this task, compressed. "
                 "The messages and tool results it summarises are no longer shown.]")
OBSERVATION_LABEL = "[Tool output compressed to fit the context; the original is longer.]"
OBSERVATION_KIND = "acon_observation"

#: A threshold of 0 selects ACON's own value for the benchmark (see :func:`thresholds_for`).
AUTO = 0
#: ACON's own (history, observation) thresholds (docs/method.md §6): AppWorld's are the default.
APPWORLD_THRESHOLDS = (4096, 1024)
QA_THRESHOLDS = (2048, 400)
#: Benchmark-name prefix → ACON's thresholds there; the one table every caller resolves from.
#: BFCL and τ² have no ACON setting of their own and keep AppWorld's (the committed Table 1 ran so).
BENCHMARK_THRESHOLDS: tuple[tuple[str, tuple[int, int]], ...] = (("moqa8", QA_THRESHOLDS),)


def thresholds_for(benchmark: str | None) -> tuple[tuple[int, int], str]:
    """ACON's (history, observation) thresholds on ``benchmark``, and where they come from."""
    for prefix, values in BENCHMARK_THRESHOLDS:
        if benchmark is not None and benchmark.startswith(prefix):
            return values, f"ACON's QA values ({prefix}* benchmark {benchmark})"
    where = f"benchmark {benchmark}" if benchmark else "no benchmark known"
    return APPWORLD_THRESHOLDS, f"ACON's AppWorld values ({where})"


def is_acon_config(method_cfg: Any) -> bool:
    """Whether a method config builds :class:`Acon` (or a subclass of it)."""
    target = method_cfg.get("_target_") if hasattr(method_cfg, "get") else None
    if not isinstance(target, str):
        return False
    module, _, name = target.rpartition(".")
    try:
        import importlib

        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, Acon)


def resolve_thresholds(method_cfg: MutableMapping[str, Any], benchmark: str | None) -> dict[str, Any] | None:
    """Fill an ACON config's 0 (auto) thresholds with ACON's values for ``benchmark``, in place.

    Returns the thresholds the policy will use and their source (the record
    keeps it), or None when ``method_cfg`` is not an ACON config. Positive
    values are left as set. Called before the config is hashed, so a run
    whose resolved numbers equal an earlier run's explicit ones has the same
    config hash (BFCL keeps 4096/1024 and its committed keys).
    """
    if not is_acon_config(method_cfg):
        return None
    (hist, obs), source = thresholds_for(benchmark)
    out: dict[str, Any] = {}
    auto = []
    for key, value in (("history_threshold", hist), ("observation_threshold", obs)):
        current = method_cfg.get(key, AUTO)
        if current in (None, AUTO):
            method_cfg[key] = value
            auto.append(key)
        out[key] = int(method_cfg[key])
    out["thresholds_from"] = source if len(auto) == 2 else (
        "set explicitly" if not auto else f"{', '.join(auto)}: {source}; the other set explicitly")
    return out


# Prompt templates (compaction.fill): {guideline} is filled here, {max_tokens} by the compactor.
_HISTORY_TASK = """{guideline}

The user message holds the interaction history to compress (it may begin with an earlier summary).
Compress it following the guideline above. Write the result under a heading line
"## History Summary"; only the text after that heading is kept. Use at most {max_tokens} tokens."""

_OBSERVATION_TASK = """{guideline}

The user message holds one tool output. Compress it following the guideline above.
Reply with the compressed output only, in at most {max_tokens} tokens."""

# A "History Summary" heading: on its own line (markdown marks allowed) or followed by a colon.
_HEADING = re.compile(r"(?im)^[ \t#*_>]*history[ \t]+summary[ \t*_]*(?::|$)")


def parse_history_summary(output: str) -> str:
    """The text after the last "History Summary" heading; the whole output if there is none."""
    matches = list(_HEADING.finditer(output))
    if matches:
        rest = output[matches[-1].end():].strip()
        if rest:
            return rest
    return output.strip()


def load_guidelines(path: str | Path) -> tuple[str, str | None]:
    """(history guideline, observation guideline or None) from a markdown file.

    Sections are found by level-2 headings mentioning "history" and
    "observation"; a file without a history section is the history guideline.
    """
    text = Path(path).read_text(encoding="utf-8")
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            head = line[3:].lower()
            current = "history" if "history" in head else "observation" if "observation" in head else None
            if current is not None:
                sections[current] = []
            continue
        if current is not None:
            sections[current].append(line)
    history = "\n".join(sections["history"]).strip() if "history" in sections else text.strip()
    observation = "\n".join(sections["observation"]).strip() if "observation" in sections else None
    return history, observation


class Acon(SummaryPolicy):
    """History compression past a threshold, observation compression past another, within B."""

    label = SUMMARY_LABEL
    # ACON's own triggers are its thresholds, below B: an observation above the observation threshold is
    # compressed even while the whole history fits B.
    full_when_fits = False

    def __init__(self, *, compactor: Compactor | None = None, history_threshold: int = AUTO,
                 observation_threshold: int = AUTO, keep_last_turns: int = 1, summary_share: float = 0.5,
                 observation_ratio: float = 0.5, guideline_path: str | None = None,
                 observation_guideline_path: str | None = None, name: str = "acon") -> None:
        # 0 that nobody resolved for a benchmark (the service, a bare Acon()): AppWorld's values.
        if history_threshold in (None, AUTO):
            history_threshold = APPWORLD_THRESHOLDS[0]
        if observation_threshold in (None, AUTO):
            observation_threshold = APPWORLD_THRESHOLDS[1]
        if history_threshold < 0 or observation_threshold < 0:
            raise ValueError("thresholds must be positive (0 = ACON's value for the benchmark)")
        check_positive("keep_last_turns", keep_last_turns, allow_zero=True)
        super().__init__(compactor=compactor, summary_share=summary_share, name=name)
        check_share("observation_ratio", observation_ratio, allow_zero=False)
        self.history_threshold = history_threshold
        self.observation_threshold = observation_threshold
        self.keep_last_turns = keep_last_turns
        self.observation_ratio = observation_ratio
        default_history, default_observation = load_guidelines(DEFAULT_GUIDELINE_PATH)
        history, observation = (load_guidelines(guideline_path) if guideline_path
                                else (default_history, default_observation))
        if observation_guideline_path:
            observation = load_guidelines(observation_guideline_path)[0]
        # The guideline goes in as it is: its braces are text, never placeholders (compaction.fill).
        self.history_prompt = fill(_HISTORY_TASK, guideline=history)
        self.observation_prompt = fill(_OBSERVATION_TASK, guideline=observation or default_observation or "")
        self._digest = digest(self.history_prompt + "\0" + self.observation_prompt)

    def key_parts(self) -> tuple[str, ...]:
        return (self._digest,)  # another guideline is another state

    def parse(self, session: Session, output: str, cap: int) -> str:
        """The text after the "History Summary" heading (ACON's output format), within the cap."""
        return cap_text(session, parse_history_summary(output), cap)

    def compose(self, session: Session, scope: Scope, budget: int, stored: Stored) -> Rendered:
        """Compress large observations, then the history past its threshold (module docstring)."""
        t_hist = min(self.history_threshold, budget)  # docs/method.md §6: same B for every method
        t_obs = min(self.observation_threshold, budget)
        key, state = stored
        obs, usage = self._observations(session, uncovered(scope, state), t_obs, budget)
        return self.compress_window(session, scope, budget, key, state, threshold=t_hist,
                                    max_tokens=int(self.summary_share * t_hist),
                                    keep_from=lambda window, st: self._keep_from(session, window, st),
                                    usage=usage, replaced=obs, instructions=self.history_prompt)

    # -- helpers ---------------------------------------------------------------

    def _keep_from(self, session: Session, window: list[int], state: Covered | None) -> int:
        """First seq of the last ``keep_last_turns`` turns (everything before it is compressed)."""
        if not window:
            return 0
        t = session.next_invocation
        start = next((s for s in window if session.invocation_of(s) >= t - self.keep_last_turns), window[-1] + 1)
        in_window = set(window)
        for s in window:  # never separate a kept result from its call
            if s >= start and session.is_result(s):
                cs = session.result(s).call_seq
                if cs is not None and cs < start and cs in in_window:
                    start = cs
        if state is not None:  # a late result of a call already summarised is folded in
            for s in window:
                if session.is_result(s):
                    cs = session.result(s).call_seq
                    if cs is not None and state.covers(cs):
                        start = max(start, s + 1)
        return start

    def _observations(self, session: Session, window: list[int], t_obs: int,
                      budget: int) -> tuple[dict[int, str], Usage]:
        """Compressed text of every result in ``window`` whose message exceeds the observation threshold."""
        usage = Usage()
        out: dict[int, str] = {}
        limit = int(self.observation_ratio * t_obs)
        cap = limit - summary_cost(session, OBSERVATION_LABEL)
        if cap <= 0:
            return out, usage
        for s in window:
            if not session.is_result(s) or session.ntok(s) <= t_obs:
                continue
            key = state_key(self.name, budget, self.compactor.name, self._digest, f"seq={s}", f"cap={cap}")
            hit = session.latest_artifact(OBSERVATION_KIND, key)
            if hit is not None:
                out[s] = hit["text"]
                continue
            text, u = compact(session, self.compactor, session.message(s).content, cap,
                              instructions=self.observation_prompt)
            usage += u
            body = OBSERVATION_LABEL + "\n" + text
            session.put_artifact(OBSERVATION_KIND, key, {"text": body, "usage": u.to_dict()})
            out[s] = body
        return out, usage
