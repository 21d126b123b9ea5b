"""Offline evaluation: trace files, Later-Used Result Recall (docs/method.md §7), replay, the hindsight ceiling."""
