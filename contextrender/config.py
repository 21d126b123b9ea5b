"""Building policies from Hydra method configs (``conf/method/*.yaml``).

The ``_target_`` of each group file is the registry; there is no second one.
Runtime objects (the embedder, the compaction model) are injected here, and
only into constructors that take them.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def method_config(name: str, overrides: dict[str, Any] | None = None) -> DictConfig:
    """Load ``conf/method/<name>.yaml`` (with optional dotted overrides) outside a Hydra app."""
    path = CONF_DIR / "method" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))
        raise ValueError(f"unknown method {name!r}; known: {', '.join(known)}")
    cfg = OmegaConf.load(path)
    for key, value in (overrides or {}).items():
        OmegaConf.update(cfg, key, value, merge=True)
    assert isinstance(cfg, DictConfig)
    return cfg


def build_policy(method_cfg: DictConfig | dict[str, Any], *, embedder: Any = None, compactor: Any = None) -> Any:
    """Instantiate a policy, passing ``embedder``/``compactor`` only to constructors that accept them."""
    cfg = OmegaConf.create(method_cfg) if isinstance(method_cfg, dict) else method_cfg
    params = inspect.signature(get_class(cfg._target_)).parameters
    runtime = {k: v for k, v in (("embedder", embedder), ("compactor", compactor))
               if v is not None and k in params}
    return instantiate(cfg, **runtime, _convert_="all")
