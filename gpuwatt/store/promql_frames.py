"""PromQL answers as the store's shapes: long frames (``Store.series``) and samples
(``Store.latest``), built column-wise with numpy (``promql``)."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any

from gpuwatt.line_protocol import decode_name
from gpuwatt.model import EnergyMethod, GpuSample, GpuSeen, TflopsMethod
from gpuwatt.schema import FIELD_ENERGY_METHOD, FIELD_PARENT_UUID, FIELD_TFLOPS_METHOD, Kind
from gpuwatt.store.base import KEY_COLUMNS
from gpuwatt.store.promql_dialects import KIND, NS_PER_MS, PRESENCE, Dialect

if TYPE_CHECKING:
    import pandas as pd


def instant_as_matrix(result: list[dict[str, Any]], bucket_ns: int) -> list[dict[str, Any]]:
    """Instant-query results as one-point matrices at ``bucket_ns``."""
    return [{"metric": r["metric"], "values": [[bucket_ns / 1e9, r["value"][1]]]} for r in result]


def shift(result: list[dict[str, Any]], by_ns: int) -> list[dict[str, Any]]:
    """Range results with each point moved from its evaluation time to its bucket's start."""
    for r in result:
        r["values"] = [
            [(round(float(t) * 1000) * NS_PER_MS - by_ns) / 1e9, v] for t, v in r["values"]
        ]
    return result


def gpu_ident(dialect: Dialect, labels: dict[str, str]) -> tuple[str, int, str, str]:
    try:
        index = int(labels.get(dialect.index, "-1"))
    except ValueError:
        index = -1
    names = (
        labels.get(dialect.host, ""),
        labels.get(dialect.uuid, ""),
        labels.get(dialect.model, ""),
    )
    if dialect.encoded_names:  # gpuwatt's line protocol (``line_protocol.encode_name``)
        names = tuple(map(decode_name, names))  # type: ignore[assignment]
    return (names[0], index, names[1], names[2])


Ident = tuple[str, int, str, str]


def ident_reader(dialect: Dialect) -> Callable[[dict[str, str]], tuple[str, int, str, str]]:
    """``gpu_ident`` of series labels, remembering each GPU's: the series of one answer are a
    few per GPU (one per metric), and decoding their labels was much of reading them (with
    ``_latest_older``'s plain key, the newest samples of 1,024 GPUs on VictoriaMetrics, ~20,000
    series: 70 -> 51 ms of CPU)."""
    host, index, uuid, model = dialect.host, dialect.index, dialect.uuid, dialect.model
    known: dict[tuple[str | None, ...], tuple[str, int, str, str]] = {}

    def ident(labels: dict[str, str]) -> tuple[str, int, str, str]:
        raw = (labels.get(host), labels.get(index), labels.get(uuid), labels.get(model))
        found = known.get(raw)
        if found is None:
            found = known[raw] = gpu_ident(dialect, labels)
        return found

    return ident


@dataclass(frozen=True)
class Points:
    """One metric's answer as arrays: each series' labels and length, its points' times (s) and
    values, in series order. Made in the worker thread that fetched it, so that the engine's
    JSON (lists of small lists) is dropped at once."""

    labels: list[dict[str, str]]
    lengths: list[int]
    t_s: Any  # numpy float64
    values: Any  # numpy float64


def points(matrix: list[dict[str, Any]]) -> Points:
    import numpy as np

    lengths = [len(series.get("values") or ()) for series in matrix]
    flat = [pt for series in matrix for pt in series.get("values") or ()]
    return Points(
        [series["metric"] for series in matrix],
        lengths,
        np.array([pt[0] for pt in flat], dtype=np.float64),
        np.array([pt[1] for pt in flat], dtype=np.float64),
    )


@dataclass(frozen=True)
class Exported:
    """Series of VictoriaMetrics' export, column-wise: each series' metric name, its other
    labels (an index into ``label_sets``: the series of one GPU share theirs, each parsed once)
    and point count, and the points of all of them in series order (times in ms, values)."""

    names: list[str]
    label_sets: list[dict[str, str]]
    label_set: Any  # numpy int64, one per series
    lengths: Any  # numpy int64, one per series
    t_ms: Any  # numpy int64
    values: Any  # numpy float64


def exported(lines: list[dict[str, Any]]) -> Exported:
    """Parsed export lines as one ``Exported``: the points gathered into two arrays at once
    (``numpy.fromiter`` over the lists, no array per series: 16,000 series of an hour of a
    1,024-GPU cluster's minute rollups, ``bench/dashboard.py --store victoriametrics``)."""
    import numpy as np

    lengths = np.fromiter((len(x["timestamps"]) for x in lines), np.int64, len(lines))
    total = int(lengths.sum())
    t_ms = np.fromiter(chain.from_iterable(x["timestamps"] for x in lines), np.int64, total)
    try:
        values = np.fromiter(chain.from_iterable(x["values"] for x in lines), np.float64, total)
    except (TypeError, ValueError):  # a value that is not a number (null): NaN, as np.asarray
        values = np.array(list(chain.from_iterable(x["values"] for x in lines)), np.float64)
    labels = [x["metric"] for x in lines]
    names = [m.get("__name__", "") for m in labels]
    return Exported(names, labels, np.arange(len(labels), dtype=np.int64), lengths, t_ms, values)


_VALUES = b',"values":['
_TIMES = b'],"timestamps":['


def joined_exports(parts: Sequence[Exported]) -> Exported:
    """Several exports' series as one ``Exported`` (the series of each part in turn)."""
    import numpy as np

    if len(parts) == 1:
        return parts[0]
    offsets = np.cumsum([0] + [len(p.label_sets) for p in parts[:-1]])
    return Exported(
        [n for p in parts for n in p.names],
        [m for p in parts for m in p.label_sets],
        np.concatenate([p.label_set + k for p, k in zip(parts, offsets.tolist(), strict=True)]),
        np.concatenate([np.asarray(p.lengths, dtype=np.int64) for p in parts]),
        np.concatenate([p.t_ms for p in parts]),
        np.concatenate([p.values for p in parts]),
    )


#: How VictoriaMetrics starts each export line: its metric name first, then its other labels.
_NAME = b'{"metric":{"__name__":"'


def exported_text(body: bytes) -> Exported | None:
    """An export body read as text: each distinct set of labels but the metric name parsed as
    JSON once, and the numbers cut out and parsed by numpy in one call for all lines
    (``numpy.fromstring``), which is ~2x faster
    than building a Python number per point (``bench/dashboard.py --store victoriametrics``: an
    hour of 1,024 GPUs' minute rollups, 19 MB, ~110 against ~250 ms of CPU). None where a line
    is not in the shape VictoriaMetrics writes (``{"metric":{"__name__":"...",...},"values":
    [...],"timestamps":[...]}``, numbers only): the caller parses it as JSON."""
    import numpy as np

    values: list[bytes] = []
    times: list[bytes] = []
    lengths: list[int] = []
    #: Each distinct timestamps text: its number and its count of times. The series of one
    #: range mostly share theirs (every GPU's rollups, every field of a GPU's samples), and
    #: each is counted and parsed once.
    distinct: dict[bytes, tuple[int, int]] = {}
    #: Each distinct text of the labels but the name (a GPU's, shared by its metrics' series):
    #: its label set. Parsing each once, not a JSON object per series, made reading 1,024
    #: GPUs' newest minute (15,360 series) ~40 ms less CPU.
    label_set_of: dict[bytes, int] = {}
    name_of: dict[bytes, str] = {}
    names: list[str] = []
    label_set: list[int] = []
    for line in body.split(b"\n"):
        if not line:
            continue
        a = line.find(_VALUES)
        b = line.find(_TIMES, a + 1)
        if a < 0 or b < 0 or not line.endswith(b"]}") or not line.startswith(_NAME):
            return None
        c = line.find(b'"', len(_NAME), a)  # the name's end (a metric name holds no quote)
        if c < 0 or line[c + 1 : c + 2] not in (b",", b"}"):
            return None
        raw_name, rest = line[len(_NAME) : c], line[c + 1 : a]  # rest: ',"k":"v",...}' or '}'
        name = name_of.get(raw_name)
        if name is None:
            if b"\\" in raw_name:
                return None
            name = name_of[raw_name] = raw_name.decode()
        names.append(name)
        k = label_set_of.get(rest)
        if k is None:
            k = label_set_of[rest] = len(label_set_of)
        label_set.append(k)
        v, t = line[a + len(_VALUES) : b], line[b + len(_TIMES) : -2]
        n = v.count(b",") + 1 if v else 0
        known = distinct.get(t)
        if known is None:
            known = distinct[t] = (len(distinct), t.count(b",") + 1 if t else 0)
        if known[1] != n:
            return None
        values.append(v)
        times.append(t)
        lengths.append(n)
    total = sum(lengths)
    try:
        v_all = _numbers(b",".join(x for x in values if x), np.float64)
        t_all = _times_parsed(times, distinct)
    except ValueError:  # something other than numbers
        return None
    if len(v_all) != total or len(t_all) != total:
        return None
    objects = (b"{" + rest[1:] if rest != b"}" else b"{}" for rest in label_set_of)
    label_sets = json.loads(b"[" + b",".join(objects) + b"]")
    return Exported(
        names,
        label_sets,
        np.array(label_set, dtype=np.int64),
        np.array(lengths, dtype=np.int64),
        t_all,
        v_all,
    )


def _times_parsed(times: list[bytes], distinct: dict[bytes, tuple[int, int]]) -> Any:
    """The series' timestamps texts as one int64 array, each distinct text parsed once. An hour
    of 1,024 GPUs' minute rollups is 20 MB, half of it timestamps, all one text: with this,
    ``exported_text`` reads it in ~106 instead of ~125 ms."""
    import numpy as np

    if len(distinct) * 2 > len(times):  # mostly different: one parse of them all
        return _numbers(b",".join(x for x in times if x), np.int64)
    empty = np.zeros(0, dtype=np.int64)
    parsed = [_numbers(x, np.int64) for x in distinct]
    return np.concatenate([parsed[distinct[x][0]] for x in times]) if times else empty


def _numbers(text: bytes, dtype: Any) -> Any:
    """Comma-separated numbers as an array, read by pandas' C reader: ~3x faster than
    ``numpy.fromstring`` (an hour of 1,024 GPUs' minute rollups, 737,000 values: ~20 against
    ~56 ms) and correctly rounded since pandas 3 (the same doubles as ``float()``, tested on
    random ones, ``tests/test_promql_export.py``). ValueError where one is not a number."""
    import numpy as np
    import pandas as pd

    if not text:
        return np.zeros(0, dtype=dtype)
    read = pd.read_csv(
        io.BytesIO(text),
        header=None,
        lineterminator=",",
        dtype=dtype,
        na_filter=False,  # "null", "NaN": not numbers here, refused
        engine="c",
    )
    if read.shape[1] != 1:
        raise ValueError("not one number per item")
    return read.iloc[:, 0].to_numpy()


def pivot_exported(
    series: Exported, dialect: Dialect, names: Sequence[str], ids: Any
) -> tuple[Any, Any, Any]:
    """Exported series of the metrics ``names`` as times (ns), GPU ids (``ids.of``) and a
    float64 matrix with a column per name and a row per (time, GPU) (NaN where a name has no
    point), the rows in no particular order."""
    import numpy as np

    width = len(names)
    column_of = {n: i for i, n in enumerate(names)}
    series_col = np.fromiter(
        (column_of.get(n, -1) for n in series.names), np.int64, len(series.names)
    )
    # a GPU id per label set that a series of the metrics asked for has
    set_gid = np.full(len(series.label_sets), -1, dtype=np.int64)
    for k in np.unique(series.label_set[series_col >= 0]).tolist():
        set_gid[k] = ids.of(gpu_ident(dialect, series.label_sets[k]))
    series_gid = np.where(series_col >= 0, set_gid[series.label_set], -1)
    aligned = _pivot_aligned(series, series_gid, series_col, width)
    if aligned is not None:
        return aligned
    gids = np.repeat(series_gid, series.lengths)
    cols = np.repeat(series_col, series.lengths)
    kept = cols >= 0
    if not kept.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, width))
    gids, cols, t_ms, values = gids[kept], cols[kept], series.t_ms[kept], series.values[kept]
    n_gpus = int(gids.max()) + 1
    if int(t_ms.max()) < np.iinfo(np.int64).max // n_gpus and int(t_ms.min()) >= 0:
        # one code per (time, GPU), in time then GPU order: a single sort of the points
        codes, row = np.unique(t_ms * n_gpus + gids, return_inverse=True)
        times_ms = codes // n_gpus
    else:
        times, t_index = np.unique(t_ms, return_inverse=True)
        codes, row = np.unique(t_index * n_gpus + gids, return_inverse=True)
        times_ms = times[codes // n_gpus]
    matrix = np.full((len(codes), width), np.nan)
    matrix[row, cols] = values
    return times_ms * NS_PER_MS, codes % n_gpus, matrix


def _pivot_aligned(
    series: Exported, series_gid: Any, series_col: Any, width: int
) -> tuple[Any, Any, Any] | None:
    """``pivot_exported`` where every GPU's series have the same times (a point's fields are
    written together: the case of gpuwatt's samples and rollups), without sorting the points:
    a row per point of each GPU's first series, GPU by GPU. None where they differ. (An hour of
    a 1,024-GPU cluster's minute rollups, 660,000 points: ~15 ms, against ~100 ms for the
    sort, ``bench/dashboard.py --store victoriametrics``.)"""
    import numpy as np

    sel = np.flatnonzero(series_col >= 0)  # the series of the metrics asked for
    if not len(sel):
        return None
    lengths = np.asarray(series.lengths, dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths  # each series' first point
    gid = series_gid[sel]
    gpus, first = np.unique(gid, return_index=True)
    ref_of = np.zeros(int(gpus[-1]) + 1, dtype=np.int64)
    ref_of[gpus] = sel[first]  # each GPU's first series: its rows
    ref = ref_of[gid]
    n = lengths[sel]
    if not np.array_equal(n, lengths[ref]):
        return None
    pos = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    points = np.repeat(offsets[sel], n) + pos
    t_ms = series.t_ms
    if not np.array_equal(t_ms[points], t_ms[np.repeat(offsets[ref], n) + pos]):
        return None
    rows_of_gpu = lengths[sel[first]]
    row_base = np.zeros(len(ref_of), dtype=np.int64)
    row_base[gpus] = np.cumsum(rows_of_gpu) - rows_of_gpu
    matrix = np.full((int(rows_of_gpu.sum()), width), np.nan)
    matrix[np.repeat(row_base[gid], n) + pos, np.repeat(series_col[sel], n)] = series.values[points]
    ref_points = np.repeat(offsets[sel[first]] - row_base[gpus], rows_of_gpu) + np.arange(
        len(matrix), dtype=np.int64
    )
    return t_ms[ref_points] * NS_PER_MS, np.repeat(gpus, rows_of_gpu), matrix


def frame(
    dialect: Dialect,
    attrs: Sequence[str],
    results: list[tuple[str, Points]],
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> pd.DataFrame:
    """Long-form rows (``KEY_COLUMNS`` + ``attrs``, sorted by time then GPU) from per-attribute
    answers; ``start_ns``/``end_ns`` keep only raw samples inside the range.

    Built column-wise: a row is one (time, GPU) code, so that 1,000 GPUs x 60 buckets x a dozen
    metrics take one sort, not a Python loop per point (``bench/promql_read.py``).
    """
    import numpy as np
    import pandas as pd

    idents: dict[tuple[str, int, str, str], int] = {}
    gid_parts: list[Any] = []
    t_parts: list[Any] = []
    v_parts: list[Any] = []
    col_parts: list[Any] = []
    col_of = {a: i for i, a in enumerate(attrs)}
    names = dialect.by_attr()
    for attr, points in results:
        if not len(points.t_s):
            continue
        scale = 1.0 if attr == PRESENCE else names[attr].scale
        series_gids = [idents.setdefault(gpu_ident(dialect, m), len(idents)) for m in points.labels]
        gid_parts.append(np.repeat(np.array(series_gids, dtype=np.int64), points.lengths))
        t_parts.append(points.t_s)
        v_parts.append(points.values * scale)
        # -1: the presence metric, keys only
        col_parts.append(np.full(len(points.t_s), col_of.get(attr, -1), dtype=np.int64))
    columns = [*KEY_COLUMNS, *attrs]
    if not gid_parts:
        dtypes = {"time_ns": "int64", "gpu_index": "int64", **dict.fromkeys(attrs, "float64")}
        return pd.DataFrame(columns=columns).astype(dtypes)
    gids = np.concatenate(gid_parts)
    t_ns = np.rint(np.concatenate(t_parts) * 1000).astype(np.int64) * NS_PER_MS
    vals = np.concatenate(v_parts)
    cols = np.concatenate(col_parts)
    if start_ns is not None and end_ns is not None:
        inside = (t_ns >= start_ns) & (t_ns < end_ns)
        gids, t_ns, vals, cols = gids[inside], t_ns[inside], vals[inside], cols[inside]
    # Rank GPUs by (host, index, uuid): a row's code then sorts by time, then GPU.
    ident_list = list(idents)
    order = sorted(range(len(ident_list)), key=lambda g: ident_list[g][:3])
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    times, t_index = np.unique(t_ns, return_inverse=True)
    codes, row = np.unique(t_index * len(order) + rank[gids], return_inverse=True)
    data = np.full((len(codes), len(attrs)), np.nan)
    valued = cols >= 0
    data[row[valued], cols[valued]] = vals[valued]
    by_rank = [ident_list[g] for g in order]
    gpu_of_row = codes % len(order)
    df = pd.DataFrame(
        {
            "time_ns": times[codes // len(order)],
            "host": np.array([i[0] for i in by_rank], dtype=object)[gpu_of_row],
            "gpu_index": np.array([i[1] for i in by_rank], dtype=np.int64)[gpu_of_row],
            "uuid": np.array([i[2] for i in by_rank], dtype=object)[gpu_of_row],
            "name": np.array([i[3] for i in by_rank], dtype=object)[gpu_of_row],
        }
    )
    for i, a in enumerate(attrs):
        df[a] = data[:, i]
    return df


def _newest_per_gpu(
    times: list[dict[str, Any]], gpu_of: Callable[[dict[str, str]], Ident]
) -> dict[Ident, tuple[int, dict[str, str]]]:
    """Each GPU's newest time and the labels of the series that holds it, from an answer of
    times (``promql_latest``'s sample-times query: a value per series)."""
    out: dict[Ident, tuple[int, dict[str, str]]] = {}
    for r in times:
        key = gpu_of(r["metric"])
        t = round(float(r["value"][1]) * 1000) * NS_PER_MS
        if key not in out or t > out[key][0]:
            out[key] = (t, r["metric"])
    return out


def _seen_times(
    dialect: Dialect,
    times: list[dict[str, Any]],
    gpu_of: Callable[[dict[str, str]], Ident],
    info: list[dict[str, Any]] | None = None,
) -> tuple[dict[Ident, dict[str, Any]], dict[Ident, dict[str, str]]]:
    """Each GPU's newest sample time (``{"time_ns": t}``) and the labels that name its job at
    that sample, from the answers of ``promql_latest``'s sample-times queries. A GPU has a
    series per job it ran in the window (a job is a label): the newest one names its job; with
    the dialect's ``info`` series, the info series of that very sample (none: no job, as a lost
    GPU's marker has none)."""
    newest = _newest_per_gpu(times, gpu_of)
    by_gpu = {k: {"time_ns": t} for k, (t, _) in newest.items()}
    if info is None:
        return by_gpu, {k: labels for k, (_, labels) in newest.items()}
    named = _newest_per_gpu(info, gpu_of)
    return by_gpu, {
        k: named[k][1] if k in named and named[k][0] == t else {} for k, (t, _) in newest.items()
    }


def job_of(dialect: Dialect, labels: dict[str, str]) -> str | None:
    """The job a series' labels name: the first of the dialect's job labels that is set."""
    for label in dialect.jobs:
        if job := labels.get(label):
            return decode_name(job) if dialect.encoded_names else job
    return None


def _methods_of(dialect: Dialect, labels: dict[str, str]) -> dict[str, Any]:
    """How a sample's energy and TFLOPS were obtained, where its labels say it (gpuwatt's line
    protocol in VictoriaMetrics: ``line_protocol.with_info_line``)."""
    if not dialect.encoded_names:
        return {}
    out: dict[str, Any] = {}
    for attr, label, kind in (
        ("energy_method", FIELD_ENERGY_METHOD, EnergyMethod),
        ("tflops_method", FIELD_TFLOPS_METHOD, TflopsMethod),
    ):
        with contextlib.suppress(ValueError):  # a value this version does not know: left out
            if value := labels.get(label):
                out[attr] = kind(value)
    if parent := labels.get(FIELD_PARENT_UUID):
        out["parent_uuid"] = decode_name(parent)
    return out


def seen_gpus(
    dialect: Dialect, times: list[dict[str, Any]], info: list[dict[str, Any]] | None = None
) -> list[GpuSeen]:
    """The GPUs of the sample-times answer, in ``latest_samples``' order."""
    by_gpu, newest = _seen_times(dialect, times, ident_reader(dialect), info)
    out = []
    for k, v in by_gpu.items():
        kept = _methods_of(dialect, newest[k])  # as ``latest_samples`` gives them
        out.append(
            GpuSeen(
                v["time_ns"],
                *k,
                job_id=job_of(dialect, newest[k]),
                parent_uuid=kept.get("parent_uuid"),
                energy_method=kept.get("energy_method"),
            )
        )
    out.sort(key=lambda s: (s.host, s.gpu_index, s.uuid))
    return out


def latest_samples(
    dialect: Dialect,
    times: list[dict[str, Any]],
    results: dict[str, list[dict[str, Any]]],
    info: list[dict[str, Any]] | None = None,
) -> list[GpuSample]:
    names = dialect.by_attr()
    gpu_of = ident_reader(dialect)
    by_gpu, newest = _seen_times(dialect, times, gpu_of, info)
    jobs = {k: job_of(dialect, labels) for k, labels in newest.items()}
    split = bool(dialect.jobs) and dialect.info is None  # a metric's series per job

    def of_newest_job(r: dict[str, Any]) -> bool:
        return not split or job_of(dialect, r["metric"]) == jobs.get(gpu_of(r["metric"]))

    for r in results.pop("lost", []):
        key = gpu_of(r["metric"])
        if key in by_gpu and of_newest_job(r):
            by_gpu[key]["lost"] = float(r["value"][1]) == dialect.lost_value
    for attr, result in results.items():
        # a GPU that changed jobs in the window has a series per job: its newest job's last,
        # so that its value wins (an older job's stands only where the newest has none)
        for r in sorted(result, key=of_newest_job) if split else result:
            key = gpu_of(r["metric"])
            if key not in by_gpu or by_gpu[key].get("lost"):
                continue  # a lost GPU's newest sample is its marker: no metrics
            value = float(r["value"][1])
            if math.isnan(value):
                continue
            value *= names[attr].scale
            kind = KIND.get(attr)
            by_gpu[key][attr] = (
                round(value) if kind is Kind.INT else bool(value) if kind is Kind.BOOL else value
            )
    out = [
        GpuSample(
            host=k[0],
            gpu_index=k[1],
            uuid=k[2],
            name=k[3],
            job_id=jobs.get(k),
            **(v if v.get("lost") else v | _methods_of(dialect, newest[k])),
        )
        for k, v in by_gpu.items()
    ]
    out.sort(key=lambda s: (s.host, s.gpu_index, s.uuid))
    return out


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while an engine's answer is parsed.

    A 1,000-GPU answer is ~100,000 small lists and strings, all alive until the parse ends: they
    trigger full collections that walk every object of the process (seen: 40 ms parses taking
    600 ms, one in three). Parsed JSON holds no reference cycles, so pausing collection is safe.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def loads_without_gc(data: bytes) -> Any:
    """``json.loads`` with the cyclic garbage collector paused (``gc_paused``)."""
    with gc_paused():
        return json.loads(data)


def seconds(ns: int) -> str:
    """``ns`` as the HTTP API's seconds with milliseconds."""
    return f"{ns // 1_000_000_000}.{(ns % 1_000_000_000) // NS_PER_MS:03d}"
