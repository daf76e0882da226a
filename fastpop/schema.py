"""Typed config fields: YAML reading, coercion to the declared type, range checks, and errors
that name the field, where its value came from (the file or a `--set`) and what is allowed.

`fastpop.config` declares the schema (frozen dataclasses whose fields carry their allowed values
as metadata); this module knows nothing about what the fields mean.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A problem in a user's config: the message says where, what was wrong, what is allowed."""


def field(default: Any, **metadata):
    """A dataclass field with its allowed values: min/max inclusive, gt exclusive, choices."""
    return dataclasses.field(default=default, metadata=metadata)


Specs = dict[str, tuple[Any, Any, Any]]  # field name -> (type, allowed values, default)


class Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-3` (no dot) as a string; here it is a float, as users mean."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
NUMBER = re.compile(r"^\s*[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?\s*$")


def field_specs(cls: type) -> Specs:
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata, _default(f)) for f in dataclasses.fields(cls)}


def _default(f: dataclasses.Field) -> Any:
    if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


class Reader:
    """Where each raw value came from (the file or a --set), for error messages."""

    def __init__(self, source: str | None, origins: dict[str, str]):
        self.source, self.origins = source, origins

    def origin(self, dotted: str) -> str | None:
        for key, origin in reversed(self.origins.items()):  # the last --set touching it
            if _within(dotted, key) or _within(key, dotted):
                return origin
        return self.source

    def fail(self, dotted: str, problem: str) -> typing.NoReturn:
        origin = self.origin(dotted)
        if origin is not None:
            problem += f" ({'from' if origin.startswith('--set') else 'in'} {origin})"
        raise ConfigError(f"{dotted}: {problem}")

    def unknown(self, dotted: str, valid: Sequence[str], context: str = "") -> typing.NoReturn:
        section, _, key = dotted.rpartition(".")
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        hint = f"valid keys{context}: {', '.join(valid)}"
        if close:
            hint = f"did you mean {(f'{section}.' if section else '') + close[0]!r}?"
        origin = self.origin(dotted)
        raise ConfigError(f"unknown key {dotted!r}{f' in {origin}' if origin else ''}; {hint}")


def _within(dotted: str, outer: str) -> bool:
    """`dotted` is the field `outer` or a part of it (population.priors.actor_lr, changes[0])."""
    return dotted == outer or dotted.startswith((f"{outer}.", f"{outer}["))


def show(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return str(value).lower().replace("none", "null")
    return repr(value)


def coerce(r: Reader, dotted: str, value: Any, tp: Any, allowed: Any) -> Any:
    """The value as type `tp`, checked against `allowed` (min, max, gt, choices)."""
    if typing.get_origin(tp) is types.UnionType:  # X | None
        if value is None:
            return None
        tp = next(arg for arg in typing.get_args(tp) if arg is not type(None))
    if typing.get_origin(tp) is tuple and typing.get_args(tp)[0] is str:  # names: may be none
        if not isinstance(value, list | tuple):
            example = '["my_package.module"]'
            r.fail(dotted, f"expected a list of names like {example}, got {show(value)}")
        return tuple(coerce(r, dotted, item, str, allowed) for item in value)
    if typing.get_origin(tp) is tuple:  # tuple[int, ...] or tuple[float, ...]
        item_type = typing.get_args(tp)[0]
        example = "[256, 256]" if item_type is int else "[0.8, 1.2]"
        if not isinstance(value, list | tuple) or not value:
            kind = "integers" if item_type is int else "numbers"
            r.fail(dotted, f"expected a non-empty list of {kind} like {example}, got {show(value)}")
        return tuple(coerce(r, dotted, item, item_type, allowed) for item in value)
    if tp is dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            r.fail(dotted, f"expected a mapping of names to values, got {show(value)}")
        return dict(value)
    if tp is bool and not isinstance(value, bool):
        r.fail(dotted, f"expected true or false, got {show(value)}")
    if tp is str and not isinstance(value, str):
        r.fail(dotted, f"expected a string, got {show(value)}")
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 1e6
        if isinstance(value, bool) or not isinstance(value, int):
            r.fail(dotted, f"expected an integer, got {show(value)}")
    if tp is float:
        if isinstance(value, str) and NUMBER.match(value):
            value = float(value.replace("_", ""))  # '3e-4' from plain YAML 1.1
        if isinstance(value, bool) or not isinstance(value, int | float):
            r.fail(dotted, f"expected a number, got {show(value)}")
        if not math.isfinite(value := float(value)):
            r.fail(dotted, f"expected a finite number, got {value}")
    if "choices" in allowed and value not in allowed["choices"]:
        r.fail(dotted, f"must be one of {', '.join(allowed['choices'])}, got {value!r}")
    low, high = allowed.get("min"), allowed.get("max")
    if low is not None and high is not None and not low <= value <= high:
        r.fail(dotted, f"must be in [{low:g}, {high:g}], got {value}")
    if low is not None and value < low:
        r.fail(dotted, f"must be >= {low:g}, got {value}")
    if "gt" in allowed and value <= allowed["gt"]:
        r.fail(dotted, f"must be > {allowed['gt']:g}, got {value}")
    return value


def read_fields(r: Reader, section: str, raw: Any, specs: Specs, context: str = "") -> dict:
    prefix, raw = f"{section}." if section else "", {} if raw is None else raw
    if not isinstance(raw, dict):
        r.fail(section, f"expected a mapping of keys to values, got {show(raw)}")
    for key in raw:
        if key not in specs:
            r.unknown(f"{prefix}{key}", list(specs), context)
    return {
        name: coerce(r, f"{prefix}{name}", raw[name], tp, allowed) if name in raw else default
        for name, (tp, allowed, default) in specs.items()
    }


def read_yaml(path: Path) -> dict:
    if not path.is_file():
        siblings = [str(p) for p in path.parent.glob("*.y*ml")] if path.parent.is_dir() else []
        close = difflib.get_close_matches(str(path), siblings, n=1, cutoff=0.6)
        raise ConfigError(
            f"config file {path} does not exist{f'; did you mean {close[0]}?' if close else ''}"
        )
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path}: not a UTF-8 text file (byte {error.object[error.start]:#04x} at offset "
            f"{error.start}); a config is YAML text saved as UTF-8"
        ) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    except OSError as error:  # a directory, unreadable
        raise ConfigError(f"config file {path} cannot be read: {error.strerror}") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: expected a mapping of sections (algo, env, ...), got {show(raw)}"
        )
    return raw or {}
