"""Today's plain line-protocol code against what commit 8509a5f's wrote and read, kept as data.

``data/line_protocol_v1_golden.json.gz`` holds 355 samples (seeded random ones: every metric
present or not, NaN, infinities, huge and tiny numbers, names with separators, quotes,
backslashes, newlines and non-ASCII; runs of one presence pattern with non-finite values inside
a run) with the lines that encoder wrote for them through one encoder, in order, and 560 lines
(escaped separators in measurement, tags and string fields) with what its parser read. They were
written by ``tests/line_protocol_v1.py``, the old code kept verbatim, which git history holds
(commit 05ec61d); the plain encoder and parser must give the very same answers."""

from __future__ import annotations

import gzip
import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatt.line_protocol import LineEncoder, LineProtocolError, parse_line
from gpuwatt.model import EnergyMethod, GpuSample, ProcessSample, TflopsMethod

GOLDEN = Path(__file__).parent / "data" / "line_protocol_v1_golden.json.gz"


@cache
def _golden() -> dict[str, Any]:
    golden: dict[str, Any] = json.loads(gzip.decompress(GOLDEN.read_bytes()))
    return golden


def _sample(d: dict[str, Any]) -> GpuSample:
    d = dict(d)
    if "processes" in d:
        d["processes"] = tuple(ProcessSample(pid, used) for pid, used in d["processes"])
    if "xid_errors" in d:
        d["xid_errors"] = tuple(d["xid_errors"])
    if "energy_method" in d:
        d["energy_method"] = EnergyMethod(d["energy_method"])
    if "tflops_method" in d:
        d["tflops_method"] = TflopsMethod(d["tflops_method"])
    return GpuSample(**d)


def test_plain_encoder_writes_what_the_generated_one_wrote() -> None:
    # One encoder over all samples: the patterns seen before must not leak into the next.
    encoded = _golden()["encoded"]
    samples = [_sample(e["sample"]) for e in encoded]
    assert len(samples) >= 300
    assert any(math.isnan(s.power_w) for s in samples if s.power_w is not None)
    assert LineEncoder().encode_many(samples) == [e["line"] for e in encoded]


def test_parser_reads_lines_as_the_old_one_did() -> None:
    parsed = _golden()["parsed"]
    assert len(parsed) >= 500
    for p in parsed:
        expected = (p["measurement"], p["tags"], p["fields"], p["time_ns"])
        assert parse_line(p["line"]) == expected, p["line"]


# Lines of any characters that line protocol's escaping can carry: escaped separators in the
# measurement and tags, quotes and backslashes in string fields.
_PIECE = st.text(st.sampled_from('ab,= "\\xi1.'), min_size=1, max_size=8)
_KEY = st.text(st.sampled_from("ab,= \\xi1."), min_size=1, max_size=8)  # a quote is no key's


def _escape(text: str, chars: str) -> str:
    return "".join(f"\\{c}" if c in chars else c for c in text)


@given(
    measurement=_PIECE,
    tags=st.lists(st.tuples(_KEY, _PIECE), max_size=3),
    strings=st.lists(st.tuples(_KEY, _PIECE), min_size=1, max_size=3),
    number=st.floats(allow_nan=False, allow_infinity=False),
)
@settings(max_examples=300, deadline=None)
def test_parser_keeps_the_escaping_rules(
    measurement: str, tags: list[tuple[str, str]], strings: list[tuple[str, str]], number: float
) -> None:
    key_chars, str_chars = ",= \\", '"\\'
    head = _escape(measurement, ", \\") + "".join(
        f",{_escape(k, key_chars)}={_escape(v, key_chars)}" for k, v in tags
    )
    fields = ",".join(
        [f"x={number!r}", "n=12i", "b=true"]
        + [
            f'{i}{_escape(k, key_chars)}="{_escape(v, str_chars)}"'
            for i, (k, v) in enumerate(strings)
        ]
    )
    line = f"{head} {fields} 1700000000000000000"
    _, got_tags, got_fields, t_ns = parse_line(line)
    assert got_tags == dict(tags)
    assert got_fields["n"] == 12 and got_fields["b"] is True
    assert t_ns == 1_700_000_000_000_000_000
    assert got_fields["x"] == number
    for i, (k, v) in enumerate(strings):
        assert got_fields[f"{i}{k}"] == v


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "m",
        "m f=1",
        "m,t f=1 1",  # a tag without a value
        "m f 1",  # a field without a value
        "m f=1,=2 1",
        'm f="open 1',
        'm f="a" 1 2',
        "m f=1, 1",
        "m f=xyz 1",
        "m f=1 notatime",
        'm f=1"x" 1',
    ],
)
def test_malformed_lines_are_rejected(bad: str) -> None:
    with pytest.raises(LineProtocolError):
        parse_line(bad)
