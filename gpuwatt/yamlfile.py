"""Load YAML while remembering the line of every value, so errors can name file and line.

Config, scenario and rules files all go through here: a value is validated against what the
caller expects and any problem becomes a ``ConfigError(file, line, reason)``.

The loader is bounded, so that no file can exhaust the machine or end in a traceback: at most
``MAX_FILE_BYTES`` read, ``MAX_DEPTH`` levels of nesting, ``MAX_ALIASES`` aliases and
``MAX_NODES`` values once aliases are expanded (a "billion laughs" file stops there), and only
YAML's standard tags (``!foo``, ``!!python/...`` and ``!!binary`` are refused). Numbers must be
finite (``.nan`` and ``.inf`` are refused where a number is expected).
"""

from __future__ import annotations

import math
import os
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
        self, allowed: set[str] | frozenset[str], required: set[str] | frozenset[str] = frozenset()
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
        return self._bounded(self._finite(float(self.value)), minimum, maximum)

    def _finite(self, v: float) -> float:
        if not math.isfinite(v):
            raise self.error(f"expected a finite number, got {v}")
        return v

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            raise self.error(f"expected true or false, got {type_name(self.value)}")
        return self.value

    def duration_s(self, minimum: float | None = 0.0) -> float:
        """A duration: a number of seconds or a string like ``90s``, ``5m``, ``2h``, ``1d``."""
        v = self.value
        if isinstance(v, int | float) and not isinstance(v, bool):
            return self._bounded(self._finite(float(v)), minimum, MAX_DURATION_S)
        if isinstance(v, str):
            seconds = parse_duration_s(v)
            if seconds is None:
                raise self.error(f"bad duration {v!r} (use e.g. 30s, 5m, 2h, 1d)")
            return self._bounded(self._finite(seconds), minimum, MAX_DURATION_S)
        raise self.error(f"expected a duration, got {type_name(v)}")

    def writable_path(self, what: str) -> Path:
        """A path this process can write, or create (its nearest existing folder writable).

        Checked when the file is loaded, so that ``check-config`` ok means the command that
        writes there will start; ``what`` names it in the error ("spool directory")."""
        path = Path(self.string()).expanduser()
        probe = path
        while not probe.exists():
            if probe.parent == probe:
                break
            probe = probe.parent
        if probe.exists() and not probe.is_dir() and probe != path:
            raise self.error(f"{what} {str(path)!r}: {str(probe)!r} is a file, not a folder")
        if not os.access(probe, os.W_OK | (os.X_OK if probe.is_dir() else 0)):
            raise self.error(f"{what} {str(path)!r}: {str(probe)!r} is not writable by this user")
        return path

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


#: Bounds of the loader (see the module's docstring).
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_ALIASES = 200
MAX_NODES = 20_000
#: The longest duration any setting takes (about 10 years).
MAX_DURATION_S = 10 * 366 * 86400.0
_STANDARD_TAGS = frozenset(
    f"tag:yaml.org,2002:{t}"
    for t in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp", "merge")
)

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


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the nesting depth and the number of aliases bounded while the
    document is composed (PyYAML's composer recurses once per level)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} aliases", mark
                )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels", mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Converter:
    """Nodes to ``Located`` values, counting every value made (aliases expand here).

    Its depth is bounded as the composer's is: aliases can nest a document deeper than it is
    written, and ``&a [*a]`` makes a collection that holds itself. Those are refused here, with
    their line, long before Python's recursion limit (which, reached under a tracer or while the
    garbage collector runs, can end in "Exception ignored" noise rather than a clean error)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.made = 0
        self._open: list[yaml.Node] = []  # the collections being converted, outermost first

    def convert(self, node: yaml.Node) -> Located:
        line = node.start_mark.line + 1
        self.made += 1
        if self.made > MAX_NODES:
            raise ConfigError(self.path, line, f"more than {MAX_NODES} values (aliases expanded)")
        if node.tag not in _STANDARD_TAGS:
            raise ConfigError(self.path, line, f"unsupported tag {node.tag!r}")
        if not isinstance(node, yaml.CollectionNode):
            return Located(self._scalar(node), self.path, line)
        if any(node is held for held in self._open):
            raise ConfigError(self.path, line, "an alias refers to a collection that holds it")
        if len(self._open) >= MAX_DEPTH:
            raise ConfigError(
                self.path, line, f"nested deeper than {MAX_DEPTH} levels (aliases expanded)"
            )
        self._open.append(node)
        try:
            return self._collection(node, line)
        finally:
            self._open.pop()

    def _collection(self, node: yaml.CollectionNode, line: int) -> Located:
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Located] = {}
            for key_node, value_node in node.value:
                key = self._scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
                if not isinstance(key, str):
                    raise ConfigError(
                        self.path, key_node.start_mark.line + 1, "keys must be strings"
                    )
                if key in out:
                    raise ConfigError(
                        self.path, key_node.start_mark.line + 1, f"duplicate key {key!r}"
                    )
                out[key] = self.convert(value_node)
            return Located(out, self.path, line)
        return Located([self.convert(n) for n in node.value], self.path, line)

    def _scalar(self, node: yaml.Node) -> Any:
        if node.tag not in _STANDARD_TAGS:
            raise ConfigError(self.path, node.start_mark.line + 1, f"unsupported tag {node.tag!r}")
        try:
            return _LOADER.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
            reason = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(
                self.path, node.start_mark.line + 1, f"bad {node.tag.rsplit(':', 1)[-1]}: {reason}"
            ) from None


_LOADER = yaml.SafeLoader("")


#: What the flow-depth check looks at, in one pass of the regex engine: a double-quoted string
#: (backslash escapes), a single-quoted one, a comment (``#`` at the start or after a blank), or a
#: bracket. Anything unclosed runs to the end, as a quote does in YAML.
_FLOW_TOKENS = re.compile(
    r"""("(?:[^"\\]|\\.)*"?)|('[^']*'?)|((?:^|(?<=[ \t\n]))#[^\n]*)|([\[{\]}])""", re.S
)


def _flow_too_deep(text: str) -> int | None:
    """The line where ``[``/``{`` nesting outside quotes and comments passes ``MAX_DEPTH``.

    PyYAML's scanner looks ahead across a whole nested flow collection before the composer sees
    its first level (quadratic: 1,000 levels take seconds, 10,000 minutes), so the depth of flow
    collections is checked on the text first. Balanced brackets in plain scalars (``node-[0-3]``)
    never add up. The regex skips quotes and comments whole, so the Python loop turns once per
    bracket, quote or comment, not once per character."""
    depth = 0
    for m in _FLOW_TOKENS.finditer(text):
        bracket = m.group(4)
        if bracket is None:
            continue
        if bracket in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return text.count("\n", 0, m.start()) + 1
        else:
            depth = max(0, depth - 1)
    return None


def load_text(text: str, path: str) -> Located:
    """Parse YAML text (bounded, see the module's docstring); every problem is a
    ``ConfigError`` with the line."""
    line: int | None
    if len(text) > MAX_FILE_BYTES:
        line = text.count("\n", 0, MAX_FILE_BYTES) + 1
        raise ConfigError(path, line, f"file larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    if (line := _flow_too_deep(text)) is not None:
        raise ConfigError(path, line, f"invalid YAML: nested deeper than {MAX_DEPTH} levels")
    try:
        loader = _BoundedLoader(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        reason = " ".join(filter(None, [exc.problem, exc.context])) or "invalid YAML"
        reason = " ".join(reason.split())  # one line, whatever PyYAML wrote
        raise ConfigError(path, line, f"invalid YAML: {reason}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise ConfigError(
            path, line, f"invalid YAML: character #x{exc.character:04x} is not allowed in YAML"
        ) from None
    except yaml.YAMLError as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(path, 1, f"invalid YAML: {reason}") from None
    except RecursionError:
        raise ConfigError(path, 1, "invalid YAML: nested too deeply") from None
    if node is None:
        return Located({}, path, 1)
    return _Converter(path).convert(node)


def load_file(path: str | Path) -> Located:
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)  # never more than the bound, whatever the size
    except FileNotFoundError:
        raise ConfigError(str(p), None, "no such file") from None
    except OSError as exc:
        raise ConfigError(str(p), None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        line = data.count(b"\n", 0, MAX_FILE_BYTES) + 1  # where the bound was crossed
        raise ConfigError(str(p), line, f"file larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(str(p), line, "not UTF-8 text (a binary file?)") from None
    return load_text(text, str(p))


Validator = Callable[[Located], Any]
