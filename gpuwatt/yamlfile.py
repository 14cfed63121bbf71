"""Load YAML while remembering the line of every value, so errors can name file and line.

Config, scenario and rules files all go through here: a value is validated against what the
caller expects and any problem becomes a ``ConfigError(file, line, reason)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuwatt.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Located:
    """A YAML node turned into Python, with where it came from."""

    value: Any  # dict[str, Located] | list[Located] | scalar
    path: str
    line: int

    def error(self, message: str) -> ConfigError:
        return ConfigError(self.path, self.line, message)

    # --- mappings -------------------------------------------------------------------------------
    def mapping(self, what: str = "a mapping") -> dict[str, Located]:
        if not isinstance(self.value, dict):
            raise self.error(f"expected {what}, got {type_name(self.value)}")
        return self.value

    def check_keys(
        self, allowed: set[str] | frozenset[str], required: set[str] = frozenset()
    ) -> None:
        m = self.mapping()
        for key, node in m.items():
            if key not in allowed:
                raise node.error(
                    f"unknown field {key!r} (expected one of: {', '.join(sorted(allowed))})"
                )
        missing = sorted(set(required) - set(m))
        if missing:
            raise self.error(f"missing required field {missing[0]!r}")

    def get(self, key: str) -> Located | None:
        return self.mapping().get(key)

    def items(self) -> Iterator[tuple[str, Located]]:
        return iter(self.mapping().items())

    # --- lists and scalars ----------------------------------------------------------------------
    def sequence(self, what: str = "a list") -> list[Located]:
        if not isinstance(self.value, list):
            raise self.error(f"expected {what}, got {type_name(self.value)}")
        return self.value

    def string(self) -> str:
        if not isinstance(self.value, str) or not self.value:
            raise self.error(f"expected a non-empty string, got {type_name(self.value)}")
        return self.value

    def integer(self, minimum: int | None = None, maximum: int | None = None) -> int:
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise self.error(f"expected an integer, got {type_name(self.value)}")
        return self._bounded(self.value, minimum, maximum)

    def number(self, minimum: float | None = None, maximum: float | None = None) -> float:
        if isinstance(self.value, bool) or not isinstance(self.value, int | float):
            raise self.error(f"expected a number, got {type_name(self.value)}")
        return self._bounded(float(self.value), minimum, maximum)

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            raise self.error(f"expected true or false, got {type_name(self.value)}")
        return self.value

    def duration_s(self, minimum: float | None = 0.0) -> float:
        """A duration: a number of seconds or a string like ``90s``, ``5m``, ``2h``, ``1d``."""
        v = self.value
        if isinstance(v, int | float) and not isinstance(v, bool):
            return self._bounded(float(v), minimum, None)
        if isinstance(v, str):
            seconds = parse_duration_s(v)
            if seconds is None:
                raise self.error(f"bad duration {v!r} (use e.g. 30s, 5m, 2h, 1d)")
            return self._bounded(seconds, minimum, None)
        raise self.error(f"expected a duration, got {type_name(v)}")

    def choice(self, options: Iterator[str] | list[str] | tuple[str, ...] | set[str]) -> str:
        opts = list(options)
        s = self.string()
        if s not in opts:
            raise self.error(f"{s!r} is not one of: {', '.join(opts)}")
        return s

    def _bounded(self, v: Any, minimum: Any, maximum: Any) -> Any:
        if minimum is not None and v < minimum:
            raise self.error(f"must be at least {minimum}, got {v}")
        if maximum is not None and v > maximum:
            raise self.error(f"must be at most {maximum}, got {v}")
        return v

    def plain(self) -> Any:
        """The value with all location wrappers removed."""
        if isinstance(self.value, dict):
            return {k: v.plain() for k, v in self.value.items()}
        if isinstance(self.value, list):
            return [v.plain() for v in self.value]
        return self.value


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}


def parse_duration_s(text: str) -> float | None:
    """``'90s' -> 90.0``, ``'5m' -> 300.0``; None when it is not a duration."""
    m = _DURATION.match(text)
    if not m:
        return None
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def type_name(v: Any) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, bool):
        return f"a boolean ({v})"
    if isinstance(v, int | float):
        return f"a number ({v})"
    return f"a string ({v!r})" if isinstance(v, str) else type(v).__name__


def _convert(node: yaml.Node, path: str) -> Located:
    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Located] = {}
        for key_node, value_node in node.value:
            key = yaml.SafeLoader.construct_scalar(_LOADER, key_node)  # type: ignore[arg-type]
            if not isinstance(key, str):
                raise ConfigError(path, key_node.start_mark.line + 1, "keys must be strings")
            if key in out:
                raise ConfigError(path, key_node.start_mark.line + 1, f"duplicate key {key!r}")
            out[key] = _convert(value_node, path)
        return Located(out, path, line)
    if isinstance(node, yaml.SequenceNode):
        return Located([_convert(n, path) for n in node.value], path, line)
    return Located(_LOADER.construct_object(node, deep=True), path, line)


_LOADER = yaml.SafeLoader("")


def load_text(text: str, path: str) -> Located:
    """Parse YAML text; syntax errors become ``ConfigError`` with the line."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        reason = " ".join(filter(None, [exc.problem, exc.context])) or "invalid YAML"
        raise ConfigError(path, line, f"invalid YAML: {reason}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, f"invalid YAML: {exc}") from None
    if node is None:
        return Located({}, path, 1)
    return _convert(node, path)


def load_file(path: str | Path) -> Located:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(p), None, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(p), None, f"cannot read: {exc}") from None
    return load_text(text, str(p))


Validator = Callable[[Located], Any]
