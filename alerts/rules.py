"""Alert rules: the YAML model and its validation.

A rules file is ``rules:`` followed by a list of rules. Every problem is a ``ConfigError`` naming
the file, the line and the reason, raised before the evaluator starts. Example::

    rules:
      - name: GpuMemoryNearlyFull
        kind: threshold
        metric: memory_used_bytes
        relative_to: memory_total_bytes     # value = used / total (the GPU's own limit)
        aggregation: min
        window: 5m
        op: ">"
        threshold: 0.95
        recovery_threshold: 0.90            # once firing, stays firing until below 0.90
        for: 5m
        keep_firing_for: 2m
        severity: warning
        labels: {team: ml-platform}
        summary: "{host} GPU {gpu}: memory {value:.0%} full"
        description: "..."
        runbook_url: https://runbooks.example.org/gpu-memory

Kinds: ``threshold`` (an aggregation of one metric over a window), ``deadman`` (a collector/node or
a GPU silent or lost), ``increase`` (a counter grew over a window: ECC double-bit errors),
``event`` (an XID code in the newest sample) and ``analytics`` (straggler, idle allocated GPU,
load imbalance, low TFLOPS/W: the same ``gpuwatt.analytics.analyze`` the dashboard calls).
"""

from __future__ import annotations

import difflib
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuwatt.schema import FIELD_BY_ATTR
from gpuwatt.yamlfile import Located, load_file

DEFAULT_RULES_PATH = Path(__file__).with_name("default_rules.yaml")

KINDS = ("threshold", "deadman", "increase", "event", "analytics")
SEVERITIES = ("critical", "warning", "info")
OPS = (">", ">=", "<", "<=")
AGGREGATIONS = ("avg", "min", "max", "last", "fraction")
ANALYSES = ("straggler", "idle_allocated", "imbalance", "low_tflops_per_w")
SCOPES = ("host", "gpu")
METRICS: tuple[str, ...] = tuple(FIELD_BY_ATTR)

#: Labels every GPU alert carries (template placeholders too).
TARGET_LABELS = ("host", "gpu", "uuid", "gpu_name")
_TEMPLATE_VALUES = ("value", "threshold", "window", "detail", "alertname", "severity", "cluster")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_COMMON = {
    "name",
    "kind",
    "severity",
    "for",
    "keep_firing_for",
    "labels",
    "summary",
    "description",
    "runbook_url",
    "enabled",
}
_KIND_KEYS: dict[str, set[str]] = {
    "threshold": {
        "metric",
        "relative_to",
        "aggregation",
        "mask",
        "window",
        "op",
        "threshold",
        "recovery_threshold",
    },
    "deadman": {"scope", "silent_for", "interval", "missed_intervals"},
    "increase": {"metric", "window", "threshold"},
    "event": {"codes", "window"},
    "analytics": {"analysis", "window", "op", "threshold", "recovery_threshold"},
}
_KIND_REQUIRED: dict[str, set[str]] = {
    "threshold": {"metric", "window", "op", "threshold"},
    "deadman": {"scope"},
    "increase": {"metric", "window"},
    "event": {"codes"},
    "analytics": {"analysis", "window"},
}


@dataclass(frozen=True, slots=True)
class ThresholdQuery:
    metric: str
    window_s: float
    op: str
    threshold: float
    aggregation: str = "avg"
    relative_to: str | None = None
    mask: int | None = None  # with aggregation "fraction": share of samples with these bits set
    recovery_threshold: float | None = None


@dataclass(frozen=True, slots=True)
class DeadmanQuery:
    scope: str  # "host": the node's collector is silent; "gpu": one GPU lost or missing
    silent_for_s: float


@dataclass(frozen=True, slots=True)
class IncreaseQuery:
    metric: str
    window_s: float
    threshold: float = 0.0  # fires when the increase over the window is above this


#: How far back an event rule looks for XIDs when it sets no ``window``: several evaluation
#: intervals, so that an evaluation late or missed (a restart) loses no event.
EVENT_WINDOW_S = 300.0


@dataclass(frozen=True, slots=True)
class EventQuery:
    codes: frozenset[int]  # XID codes that fire; empty: any
    window_s: float = EVENT_WINDOW_S  # fires for an XID raised within it


@dataclass(frozen=True, slots=True)
class AnalyticsQuery:
    analysis: str
    window_s: float
    op: str = ">"
    threshold: float | None = None  # imbalance (CV) and low_tflops_per_w need one
    recovery_threshold: float | None = None


Query = ThresholdQuery | DeadmanQuery | IncreaseQuery | EventQuery | AnalyticsQuery


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    query: Query
    severity: str
    summary: str
    description: str = ""
    runbook_url: str = ""
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    path: str = ""
    line: int = 0

    @property
    def kind(self) -> str:
        return _KIND_OF[type(self.query)]


_KIND_OF: dict[type, str] = {
    ThresholdQuery: "threshold",
    DeadmanQuery: "deadman",
    IncreaseQuery: "increase",
    EventQuery: "event",
    AnalyticsQuery: "analytics",
}


def compare(value: float, op: str, threshold: float) -> bool:
    if op == ">":
        return value > threshold
    if op == ">=":
        return value >= threshold
    if op == "<":
        return value < threshold
    return value <= threshold


# --- parsing ------------------------------------------------------------------------------------


def load_rules(path: str | Path | None = None) -> list[Rule]:
    """Load and validate a rules file (None: the shipped default rules)."""
    return parse_rules(load_file(DEFAULT_RULES_PATH if path is None else path))


def validate_rules_file(path: str | Path) -> str:
    """For ``gpuwatt check-config``: raises ``ConfigError`` or returns a one-line summary."""
    rules = load_rules(path)
    return f"alert rules: {len(rules)}"


def looks_like_rules(value: object) -> bool:
    """Whether a loaded YAML document is a rules file (``check-config`` dispatch)."""
    return isinstance(value, dict) and "rules" in value


def parse_rules(doc: Located) -> list[Rule]:
    doc.check_keys({"rules"}, required={"rules"})
    rules: list[Rule] = []
    seen: set[str] = set()
    for node in doc.get("rules").sequence("a list of rules"):  # type: ignore[union-attr]
        rule = parse_rule(node)
        if rule is None:
            continue
        if rule.name in seen:
            raise _req(node, "name").error(f"duplicate rule name {rule.name!r}")
        seen.add(rule.name)
        rules.append(rule)
    return rules


def parse_rule(node: Located) -> Rule | None:
    """One rule, or None when it says ``enabled: false``."""
    node.mapping("a rule (a mapping with name, kind, severity, summary)")
    kind_node = _req(node, "kind")
    kind = kind_node.choice(KINDS)
    node.check_keys(_COMMON | _KIND_KEYS[kind], required={"name", "kind", "summary"})
    missing = sorted(_KIND_REQUIRED[kind] - set(node.mapping()))
    if missing:
        raise node.error(f"a {kind} rule needs {missing[0]!r}")
    enabled = node.get("enabled")
    if enabled is not None and not enabled.boolean():
        return None
    name_node = _req(node, "name")
    name = name_node.string()
    if not _NAME.match(name):
        raise name_node.error(f"rule name {name!r} must be letters, digits and _")
    labels = _labels(node.get("labels"))
    query = _QUERY_PARSERS[kind](node)
    rule = Rule(
        name=name,
        query=query,
        severity=node.get("severity").choice(SEVERITIES) if node.get("severity") else "warning",  # type: ignore[union-attr]
        summary=_req(node, "summary").string(),
        description=_opt_str(node, "description"),
        runbook_url=_opt_str(node, "runbook_url"),
        for_s=_opt_duration(node, "for"),
        keep_firing_for_s=_opt_duration(node, "keep_firing_for"),
        labels=labels,
        path=node.path,
        line=node.line,
    )
    for key in ("summary", "description", "runbook_url"):
        if (t := node.get(key)) is not None:
            _check_template(t, set(labels))
    return rule


def _threshold(node: Located) -> ThresholdQuery:
    metric = _metric(_req(node, "metric"))
    relative_to = _metric(node.get("relative_to")) if node.get("relative_to") else None
    aggregation = node.get("aggregation").choice(AGGREGATIONS) if node.get("aggregation") else "avg"  # type: ignore[union-attr]
    mask_node = node.get("mask")
    mask = mask_node.integer(minimum=1) if mask_node is not None else None
    if (aggregation == "fraction") != (mask is not None):
        raise (mask_node or node).error("aggregation 'fraction' and 'mask' go together")
    threshold = _req(node, "threshold").number()
    op = _req(node, "op").choice(OPS)
    recovery = _recovery(node, op, threshold)
    return ThresholdQuery(
        metric=metric,
        window_s=_req(node, "window").duration_s(minimum=1.0),
        op=op,
        threshold=threshold,
        aggregation=aggregation,
        relative_to=relative_to,
        mask=mask,
        recovery_threshold=recovery,
    )


def _deadman(node: Located) -> DeadmanQuery:
    scope = _req(node, "scope").choice(SCOPES)
    silent = node.get("silent_for")
    interval = node.get("interval")
    if (silent is None) == (interval is None):
        raise node.error("a deadman rule needs either 'silent_for' or 'interval'")
    if silent is not None:
        return DeadmanQuery(scope, silent.duration_s(minimum=1.0))
    missed_node = node.get("missed_intervals")
    missed = missed_node.integer(minimum=1) if missed_node is not None else 3
    return DeadmanQuery(scope, interval.duration_s(minimum=0.05) * missed)  # type: ignore[union-attr]


def _increase(node: Located) -> IncreaseQuery:
    t = node.get("threshold")
    return IncreaseQuery(
        metric=_metric(_req(node, "metric")),
        window_s=_req(node, "window").duration_s(minimum=1.0),
        threshold=t.number(minimum=0.0) if t is not None else 0.0,
    )


def _event(node: Located) -> EventQuery:
    codes_node = _req(node, "codes")
    w = node.get("window")
    window_s = w.duration_s(minimum=1.0) if w is not None else EVENT_WINDOW_S
    if codes_node.value == "any":
        return EventQuery(frozenset(), window_s)
    codes = [c.integer(minimum=1, maximum=1000) for c in codes_node.sequence("a list of XIDs")]
    return EventQuery(frozenset(codes), window_s)


def _analytics(node: Located) -> AnalyticsQuery:
    analysis = _req(node, "analysis").choice(ANALYSES)
    t = node.get("threshold")
    if analysis in ("imbalance", "low_tflops_per_w") and t is None:
        raise node.error(f"analysis {analysis!r} needs a 'threshold'")
    default_op = "<" if analysis == "low_tflops_per_w" else ">"
    op = node.get("op").choice(OPS) if node.get("op") else default_op  # type: ignore[union-attr]
    threshold = t.number() if t is not None else None
    return AnalyticsQuery(
        analysis=analysis,
        window_s=_req(node, "window").duration_s(minimum=180.0),
        op=op,
        threshold=threshold,
        recovery_threshold=_recovery(node, op, threshold) if threshold is not None else None,
    )


_QUERY_PARSERS: dict[str, Callable[[Located], Query]] = {
    "threshold": _threshold,
    "deadman": _deadman,
    "increase": _increase,
    "event": _event,
    "analytics": _analytics,
}


def _recovery(node: Located, op: str, threshold: float) -> float | None:
    r = node.get("recovery_threshold")
    if r is None:
        return None
    value = r.number()
    if (op in (">", ">=") and value > threshold) or (op in ("<", "<=") and value < threshold):
        raise r.error(
            f"recovery_threshold {value:g} must be on the safe side of threshold {threshold:g}"
        )
    return value


def _metric(node: Located | None) -> str:
    assert node is not None
    name = node.string()
    if name not in FIELD_BY_ATTR:
        close = difflib.get_close_matches(name, METRICS, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise node.error(f"unknown metric {name!r}{hint}; metrics are GpuSample attribute names")
    return name


def _labels(node: Located | None) -> dict[str, str]:
    if node is None:
        return {}
    out: dict[str, str] = {}
    for key, value in node.mapping("a mapping of label names to values").items():
        if not _LABEL.match(key):
            raise value.error(f"bad label name {key!r}")
        if key in (*TARGET_LABELS, "alertname", "severity"):
            raise value.error(f"label {key!r} is set by gpuwatt")
        if not isinstance(value.value, str | int | float) or isinstance(value.value, bool):
            raise value.error("a label value must be a string")
        out[key] = str(value.value)
    return out


MAX_TEMPLATE_WIDTH = 200


def _check_template(node: Located, label_names: set[str]) -> None:
    allowed = {*TARGET_LABELS, *_TEMPLATE_VALUES, *label_names}
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(node.string()) if f is not None]
    except ValueError as exc:
        raise node.error(f"bad template: {exc}") from None
    for f in fields:
        base = re.split(r"[.\[]", f, maxsplit=1)[0]
        if base not in allowed:
            raise node.error(f"unknown placeholder {{{f}}} (use: {', '.join(sorted(allowed))})")
    for _, name, spec, _ in string.Formatter().parse(node.string()):
        # A width or precision is expanded by every render: {value:>50000000} would make each
        # notification 50 MB. Digits in a format spec are widths and precisions.
        if spec and any(int(d) > MAX_TEMPLATE_WIDTH for d in re.findall(r"\d+", spec)):
            raise node.error(
                f"format spec {{{name}:{spec}}} asks for more than {MAX_TEMPLATE_WIDTH} characters"
            )


def render_template(text: str, values: dict[str, object]) -> str:
    """Fill a validated template; a value of the wrong type for its format spec stays raw."""
    try:
        return text.format_map(_Defaulting(values))
    except (ValueError, TypeError):
        return text.format_map(_Defaulting({k: str(v) for k, v in values.items()}))


class _Defaulting(dict[str, object]):
    def __missing__(self, key: str) -> str:
        return ""


def _req(node: Located, key: str) -> Located:
    child = node.get(key)
    if child is None:
        raise node.error(f"missing required field {key!r}")
    return child


def _opt_str(node: Located, key: str) -> str:
    child = node.get(key)
    return child.string() if child is not None else ""


def _opt_duration(node: Located, key: str) -> float:
    child = node.get(key)
    return child.duration_s(minimum=0.0) if child is not None else 0.0


def rule_names(rules: Sequence[Rule]) -> list[str]:
    return [r.name for r in rules]
