"""Today's plain line-protocol code against commit 8509a5f's (``line_protocol_v1``): the encoder
writes the very same text for any sample, and the parser reads any line the same way."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from line_protocol_v1 import GeneratedLineEncoder, parse_line_v1

from gpuwatt.line_protocol import LineEncoder, LineProtocolError, parse_line
from gpuwatt.model import EnergyMethod, GpuSample, ProcessSample, TflopsMethod
from gpuwatt.schema import FIELDS, Kind

NAMES = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20)
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
)
INTS = st.one_of(
    st.integers(min_value=0, max_value=2**40),
    st.floats(min_value=0, max_value=1e9, allow_nan=False),  # NVML integers arrive as floats too
    st.sampled_from([math.nan, math.inf]),
)


def _value(kind: Kind) -> st.SearchStrategy[object]:
    if kind is Kind.INT:
        return st.one_of(st.none(), INTS)
    if kind is Kind.FLOAT:
        return st.one_of(st.none(), FLOATS)
    return st.one_of(st.none(), st.booleans())


SAMPLES = st.builds(
    lambda host, name, job, lost, values, energy, tflops, xids, procs: GpuSample(
        time_ns=1_700_000_000_000_000_000,
        host=host,
        gpu_index=3,
        uuid="GPU-1",
        name=name,
        lost=lost,
        energy_method=energy,
        tflops_method=tflops,
        xid_errors=tuple(xids),
        processes=procs,
        job_id=job,
        **values,
    ),
    NAMES,
    NAMES,
    st.one_of(st.none(), NAMES),
    st.booleans(),
    st.fixed_dictionaries({spec.attr: _value(spec.kind) for spec in FIELDS}),
    st.one_of(st.none(), st.sampled_from(EnergyMethod)),
    st.one_of(st.none(), st.sampled_from(TflopsMethod)),
    st.lists(st.integers(min_value=0, max_value=200), max_size=3),
    st.one_of(
        st.none(),
        st.lists(
            st.builds(
                ProcessSample,
                st.integers(min_value=1, max_value=2**22),
                st.one_of(st.none(), st.integers(min_value=0, max_value=2**40)),
            ),
            max_size=3,
        ).map(tuple),
    ),
)


@given(st.lists(SAMPLES, min_size=1, max_size=6))
@settings(max_examples=300, deadline=None)
def test_plain_encoder_writes_what_the_generated_one_wrote(samples: list[GpuSample]) -> None:
    # One encoder over several samples: the patterns seen before must not leak into the next.
    assert LineEncoder().encode_many(samples) == GeneratedLineEncoder().encode_many(samples)


def test_same_output_on_a_pattern_seen_before_with_a_non_finite_value() -> None:
    base = GpuSample(1, "h", 0, "u", "n", power_w=300.5, energy_j=5.0, memory_used_bytes=2**30)
    seq = [
        base,
        dataclasses.replace(base, power_w=math.nan),
        dataclasses.replace(base, memory_used_bytes=math.inf),
        dataclasses.replace(base, power_w=1e308, energy_j=1e308),
        base,
    ]
    assert LineEncoder().encode_many(seq) == GeneratedLineEncoder().encode_many(seq)


@given(st.lists(SAMPLES, min_size=1, max_size=3))
@settings(max_examples=200, deadline=None)
def test_parser_reads_encoded_lines_as_the_old_one_did(samples: list[GpuSample]) -> None:
    for line in LineEncoder().encode_many(samples):
        assert parse_line(line) == parse_line_v1(line)


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
    if not any("=" in k for k, _ in tags + strings):
        # the old parser split a key at an escaped "=" (a bug: the key came back cut short)
        assert parse_line(line) == parse_line_v1(line)
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
