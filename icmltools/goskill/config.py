"""Resolving and checking a configuration: a preset plus overrides (`options` holds the dataclass, the presets
and every choice list; they are re-exported here for older imports)."""
from __future__ import annotations

import dataclasses

from icmltools.core.errors import BadInputError

from .options import CONDITIONINGS, DECODERS, PRESETS, SPLITS, GoSkillConfig

__all__ = ["FIELDS", "PRESETS", "GoSkillConfig", "config_from_dict", "make_config", "validate", "with_overrides"]

FIELDS = {f.name: f for f in dataclasses.fields(GoSkillConfig)}
_AT_LEAST_ONE = ("H", "episodes", "max_steps", "n_codes", "eval_episodes", "envs_per_task", "context", "prompt_len")
_CHOICES = {"decoder": DECODERS, "conditioning": CONDITIONINGS, "split": SPLITS}


def make_config(preset: str = "quick", **overrides) -> GoSkillConfig:
    """The preset's configuration with the overrides that are not None applied, checked."""
    if preset not in PRESETS:
        raise BadInputError(f"{preset!r}: use one of {', '.join(PRESETS)}", param="preset")
    kw = dict(PRESETS[preset])
    for k, v in overrides.items():
        if v is None:
            continue
        if k not in FIELDS:
            raise BadInputError(f"unknown configuration key {k!r}")
        kw[k] = v
    cfg = GoSkillConfig(preset=preset, **kw)
    validate(cfg)
    return cfg


def config_from_dict(d: dict, path: str = "pipeline.json") -> GoSkillConfig:
    """The configuration stored in a run folder's state file `path`, checked (errors name the file)."""
    if not isinstance(d, dict):
        raise BadInputError(f"{path}: the configuration is not an object")
    unknown = set(d) - set(FIELDS)
    if unknown:
        raise BadInputError(f"{path}: unknown keys {sorted(unknown)}")
    for k, v in d.items():
        want = type(FIELDS[k].default)
        ok = isinstance(v, want) or (want is float and isinstance(v, int))
        if not ok or (isinstance(v, bool) and want is not bool):
            raise BadInputError(f"{path}: configuration field {k!r} is {v!r}; expected {want.__name__}")
    cfg = GoSkillConfig(**d)
    try:
        validate(cfg)
    except BadInputError as e:
        raise BadInputError(f"{path}: configuration field {e.param!r}: {e.message}") from None
    return cfg


def with_overrides(cfg: GoSkillConfig, overrides: dict) -> GoSkillConfig:
    """`cfg` with the overrides that are not None applied, checked (errors name the overridden field)."""
    kw = {k: v for k, v in overrides.items() if v is not None}
    for k in kw:
        if k not in FIELDS or k == "preset":
            raise BadInputError(f"unknown configuration key {k!r}")
    out = dataclasses.replace(cfg, **kw)
    validate(out)
    return out


def validate(cfg: GoSkillConfig) -> None:
    """Errors name the configuration field (the command shows the option that sets it)."""
    for k, allowed in _CHOICES.items():
        if getattr(cfg, k) not in allowed:
            raise BadInputError(f"{getattr(cfg, k)!r}: use {' or '.join(allowed)}", param=k)
    for k in _AT_LEAST_ONE:
        if getattr(cfg, k) < 1:
            raise BadInputError(f"must be >= 1 (got {getattr(cfg, k)})", param=k)
    if cfg.enhance_per_code < 0:
        raise BadInputError(f"must be >= 0 (0 = automatic; got {cfg.enhance_per_code})", param="enhance_per_code")
    if cfg.episodes < 2 and cfg.split == "sub":
        raise BadInputError("the sub split needs at least 2 episodes per task", param="episodes")
    if cfg.max_steps >= cfg.max_ep_len:
        raise BadInputError(f"{cfg.max_steps} must be below max_ep_len = {cfg.max_ep_len}", param="max_steps")
