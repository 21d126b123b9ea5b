"""The method registry: policies built from their Hydra configs (``conf/method/*.yaml``).

The ``_target_`` of each group file is the registry; there is no second one.
The configs ship inside the package (``contextrender.conf``), so a policy can
be built by name from an installed wheel in any directory. Needs the
``[service]`` (or ``[harness]``) extra: Hydra and OmegaConf.
Runtime objects (the embedder, the compaction model) are injected here, and
only into constructors that take them.

Overrides that come from outside the process (an HTTP request, a proxy
header, ``contextrender proxy --override``) are data, never config syntax:
:func:`validate_overrides` accepts only a method's *tunable keys* — the
numeric and boolean leaves of its YAML file — with plain values of the same
type (finite, non-negative numbers; booleans), and refuses everything else
before any config is merged or any object is built. Strings are never
accepted, so OmegaConf interpolations (``${oc.env:...}``, ``${oc.create:...}``)
cannot reach the resolver, and ``_target_``-style keys cannot reach Hydra's
``instantiate``.
"""

from __future__ import annotations

import importlib.resources
import inspect
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

try:
    from hydra.utils import get_class, instantiate
    from omegaconf import DictConfig, OmegaConf
except ImportError as e:  # pragma: no cover - the light install
    from contextrender.extras import install_line

    raise ImportError(f"building policies by name needs Hydra: {install_line('service')}") from e

from contextrender.render import ContextPolicy

#: The Hydra config folder (the checkout's ``conf/``, shipped as package data ``contextrender.conf``).
try:
    CONF_DIR = Path(str(importlib.resources.files("contextrender.conf")))
except ModuleNotFoundError as e:  # a source checkout shadowing the installed package: say so (extras.py)
    from contextrender.extras import missing_extra

    raise ImportError(missing_extra(e, "the method registry"), name=e.name) from e


#: Integers beyond this are refused (exactly representable as floats; no tunable needs more).
MAX_OVERRIDE_INT = 2**53


class OverrideError(ValueError):
    """An override is not a tunable key of the method, or its value is not a plain value of the right type."""


def method_names() -> list[str]:
    """Every method in the registry (``conf/method/*.yaml``), sorted."""
    return sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))


def _method_path(name: str) -> Path:
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-" for c in name):
        raise ValueError(f"invalid method name {name!r}")
    path = CONF_DIR / "method" / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown method {name!r}; known: {', '.join(method_names())}")
    return path


def _base_config(name: str) -> DictConfig:
    cfg = OmegaConf.load(_method_path(name))
    assert isinstance(cfg, DictConfig)
    return cfg


def tunable_keys(name: str) -> dict[str, type]:
    """Dotted key → type (``bool``, ``int`` or ``float``) of every value of method ``name`` a client may set.

    The tunable keys are the numeric and boolean leaves of the method's YAML
    file; strings (``name``, guideline paths), nulls and ``_target_`` are not.
    """
    out: dict[str, type] = {}

    def walk(node: Any, prefix: str) -> None:  # the YAML files are ours: a few levels deep
        for key, value in node.items():
            path = f"{prefix}{key}"
            if str(key).startswith("_"):
                continue
            if isinstance(value, Mapping) or isinstance(value, DictConfig):
                walk(value, path + ".")
            elif isinstance(value, bool):
                out[path] = bool
            elif isinstance(value, int):
                out[path] = int
            elif isinstance(value, float):
                out[path] = float

    walk(OmegaConf.to_container(_base_config(name), resolve=False), "")
    return out


def _flatten(overrides: Mapping[str, Any], prefix: str = "", depth: int = 0) -> list[tuple[str, Any]]:
    if depth > 8:  # no method config nests this deep; a request that does is not a config
        raise OverrideError(f"override {prefix.rstrip('.')!r}: nested too deeply")
    items: list[tuple[str, Any]] = []
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise OverrideError(f"override key {key!r} must be a non-empty string")
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if not value:
                raise OverrideError(f"override {path!r}: an empty object is not a value")
            items.extend(_flatten(value, path + ".", depth + 1))
        else:
            items.append((path, value))
    return items


def validate_overrides(name: str, overrides: Any) -> dict[str, bool | int | float]:
    """Check ``overrides`` against the tunable keys of method ``name``; return them flat (dotted keys).

    Raises :class:`OverrideError` naming the first offending key: not a
    tunable key of this method, or a value that is not a plain value of the
    key's type (a string, a list, an object where a number belongs, NaN, an
    infinity, a negative number, a boolean where a number belongs or the
    reverse).
    """
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise OverrideError("overrides must be an object of dotted config keys, e.g. {\"weights.reuse\": 0}")
    tunable = tunable_keys(name)
    out: dict[str, bool | int | float] = {}
    for key, value in _flatten(overrides):
        kind = tunable.get(key)
        if kind is None:
            listing = ", ".join(sorted(tunable)) or "none"
            raise OverrideError(f"override key {key!r} is not a tunable key of method {name!r} (tunable: {listing})")
        if isinstance(value, str):
            hint = " (interpolation syntax is never resolved)" if "${" in value else ""
            raise OverrideError(f"override {key!r}: expected a {kind.__name__}, got a string{hint}")
        if kind is bool:
            if not isinstance(value, bool):
                raise OverrideError(f"override {key!r}: expected true or false, got {type(value).__name__}")
            out[key] = value
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OverrideError(f"override {key!r}: expected a {kind.__name__}, got {type(value).__name__}")
        if isinstance(value, int) and abs(value) > MAX_OVERRIDE_INT:  # also keeps float() from overflowing
            raise OverrideError(f"override {key!r}: {value} is out of range (at most {MAX_OVERRIDE_INT})")
        if not math.isfinite(value):
            raise OverrideError(f"override {key!r}: {value!r} is not a finite number")
        if kind is int and not (isinstance(value, int) or float(value).is_integer()):
            raise OverrideError(f"override {key!r}: expected an integer, got {value!r}")
        if value < 0:
            raise OverrideError(f"override {key!r}: must be ≥ 0, got {value!r}")
        out[key] = int(value) if kind is int else float(value)
    return out


def method_config(name: str, overrides: Mapping[str, Any] | None = None, *, label: str | None = None) -> DictConfig:
    """Load ``conf/method/<name>.yaml`` with validated overrides, outside a Hydra app.

    Every override goes through :func:`validate_overrides` first, so nothing
    a caller passes is interpreted as config syntax. ``label`` renames the
    policy (its ``name``, which goes into records), e.g. for an ablation
    variant; any display text without ``$`` (so it can never be an interpolation).
    """
    checked = validate_overrides(name, overrides)
    cfg = _base_config(name)
    for key, value in checked.items():
        OmegaConf.update(cfg, key, value, merge=True)
    if label is not None:
        if not isinstance(label, str) or not label or "$" in label:
            raise OverrideError(f"label {label!r} must be a non-empty string without '$'")
        cfg.name = label
    return cfg


def build_policy(method_cfg: DictConfig | dict[str, Any], *, embedder: Any = None,
                 compactor: Any = None) -> ContextPolicy:
    """Instantiate a policy, passing ``embedder``/``compactor`` only to constructors that accept them.

    Every ``_target_`` of ``conf/method`` builds a :class:`~contextrender.render.ContextPolicy`; a caller
    that needs more than the protocol (ContextRender's ``select``) narrows the type itself.
    """
    cfg = OmegaConf.create(method_cfg) if isinstance(method_cfg, dict) else method_cfg.copy()
    OmegaConf.set_struct(cfg, False)  # a Hydra job's config is in struct mode: the copy may drop keys
    # docs/method.md §15: any method may render cache-aware; the option wraps the policy, it is no constructor's
    aware = bool(cfg.pop("cache_aware", False))
    profile = str(cfg.pop("cache_profile", "anthropic"))
    params = inspect.signature(get_class(cfg._target_)).parameters
    runtime = {k: v for k, v in (("embedder", embedder), ("compactor", compactor))
               if v is not None and k in params}
    policy = instantiate(cfg, **runtime, _convert_="all")
    if aware:
        from contextrender.cache_aware import CacheAware

        return CacheAware(policy, profile=profile)
    return policy
