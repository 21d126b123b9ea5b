"""Later-Used Result Recall (docs/method.md §7): the metric lives in the core (:mod:`contextrender.recall`), where the
session viewer uses it too; the harness's replay imports it from here."""

from contextrender.recall import (
    AGE_BINS,
    Event,
    FirstAppearance,
    RecallStats,
    age_bin,
    count_events,
    eligible,
    eligible_tokens,
    recall,
    reuse_events,
    turn_text,
)

__all__ = ["AGE_BINS", "Event", "FirstAppearance", "RecallStats", "age_bin", "count_events", "eligible", "eligible_tokens", "recall",
           "reuse_events", "turn_text"]
