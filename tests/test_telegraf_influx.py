"""Telegraf side by side, in one real InfluxDB (Debian's influxd 1.6.7, ``conftest.influx_db``).

The GPUs are the twelve of Telegraf's own test expectations (eleven GPUs: the RTX 3080 is in them
twice, under schema v12 and v13, with one uuid), written as Telegraf's InfluxDB output writes
them: every 10 s for six minutes, the ``pstate`` tag flipping between P0 and P8 on each point.
One GPU reports hardware slowdown from minute two, another a failed row remapping. Then, alone
and with gpuwatt writing the same GPUs through its own write path: nothing is rejected, each GPU
is counted once, both reason rules fire, and no rule errors.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from telegraf_data import CASES, gpu_metric, telegraf_line
from test_cli import gpuwatt

from gpuwatt.alerts.clock import ManualClock
from gpuwatt.alerts.db import open_db
from gpuwatt.alerts.rules import load_rules
from gpuwatt.alerts.service import Evaluator
from gpuwatt.analytics import analyze
from gpuwatt.analytics.inputs import read_analysis_input
from gpuwatt.line_protocol import decode_line
from gpuwatt.model import GpuSample, GpuSeen
from gpuwatt.store.base import SEEN_COLUMN
from gpuwatt.store.influx import InfluxStore, telegraf_mig_devices, telegraf_processes

pytestmark = pytest.mark.servers

NS = 1_000_000_000
T0_NS = 1_750_000_000 * NS
MINUTES = 6
SLOW = "A100-SXM4 schema v12"  # reports HW slowdown from minute 2
REMAP = "RTX 4000 SFF Ada schema v13"  # reports a failed row remapping from minute 2
SWAP = {"RTX 3080 schema v12": (0, 180), "RTX 3080 schema v13": (180, MINUTES * 60)}


def _host(case: dict) -> str:
    return "ws-" + re.sub(r"[^a-z0-9]+", "-", gpu_metric(case)["tags"]["uuid"].lower())[4:12]


def _telegraf_lines(domain: str = "") -> list[str]:
    """Telegraf's points for the whole timeline (its process and MIG points included); its
    ``host`` tag ends in ``domain`` (an agent configured with the FQDN)."""
    lines = []
    for case in CASES:
        lo, hi = SWAP.get(case["name"], (0, MINUTES * 60))
        for t_s in range(lo, hi, 10):
            t_ns = T0_NS + t_s * NS
            extra: dict[str, tuple[str, object]] = {}
            if case["name"] == SLOW and t_s >= 120:
                extra["clocks_event_reason_hw_slowdown"] = ("int", 1)
            if case["name"] == REMAP and t_s >= 120:
                extra["remapped_rows_failure"] = ("str", "Yes")
            pstate = {"pstate": "P0" if t_s % 20 else "P8"}
            for m in case["metrics"]:
                is_gpu = m["measurement"] == "nvidia_smi"
                lines.append(
                    telegraf_line(
                        m,
                        _host(case) + domain,
                        t_ns,
                        tags=pstate if is_gpu else None,
                        fields=extra if is_gpu else None,
                    )
                )
    return lines


def _gpuwatt_samples(telegraf: list[str], domain: str = "") -> list[GpuSample]:
    """gpuwatt's own samples of the same GPUs at the same moments + 5 s (as its collector would
    sample them: the same readings, its own extra fields)."""
    out = []
    for line in telegraf:
        if not line.startswith("nvidia_smi,"):
            continue
        s = decode_line(line)
        out.append(
            GpuSample(
                time_ns=s.time_ns + 5 * NS,
                host=s.host.removesuffix(domain),
                gpu_index=s.gpu_index,
                uuid=s.uuid,
                name=s.name,
                utilization_gpu_pct=s.utilization_gpu_pct,
                power_w=s.power_w,
                temperature_gpu_c=s.temperature_gpu_c,
                clock_event_reasons=s.clock_event_reasons,
                remapped_rows_pending=s.remapped_rows_pending,
                remapped_rows_failure=s.remapped_rows_failure,
                energy_j=1000.0 + s.time_ns / NS,
            )
        )
    return out


def _uuids() -> set[str]:
    return {gpu_metric(c)["tags"]["uuid"] for c in CASES}


@pytest.fixture
def alerts_con(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    con = open_db(tmp_path / "alerts.db")
    try:
        yield con
    finally:
        con.close()


def _evaluate(store: InfluxStore, con: sqlite3.Connection) -> tuple[dict[str, set[str]], dict]:
    """Every shipped rule every 15 s over the last three minutes: rule -> uuids that fired."""
    clock = ManualClock(T0_NS)
    ev = Evaluator(load_rules(), store, con, channels={}, routes=[], clock=clock)
    errors: dict[str, str] = {}
    for t_s in range((MINUTES - 3) * 60, MINUTES * 60, 15):
        clock.set_ns(T0_NS + t_s * NS)
        errors.update(ev.evaluate().errors)
    fired: dict[str, set[str]] = {}
    for rule, labels in con.execute(
        "SELECT rule, labels FROM history WHERE to_state = 'firing'"
    ).fetchall():
        fired.setdefault(rule, set()).add(re.search(r'"uuid": "([^"]*)"', labels).group(1))  # type: ignore[union-attr]
    return fired, errors


def _host_of(name: str) -> str:
    (case,) = [c for c in CASES if c["name"] == name]
    return _host(case)


def _uuid_of(name: str) -> str:
    (case,) = [c for c in CASES if c["name"] == name]
    return gpu_metric(case)["tags"]["uuid"]


def _check_reads(store: InfluxStore) -> None:
    end_ns = T0_NS + MINUTES * 60 * NS
    latest = store.latest()
    assert sorted(s.uuid for s in latest) == sorted(_uuids())  # 11 GPUs, each once
    # the GPUs seen (a few fields of the newest points) are those, whoever writes them
    assert store.gpus_seen() == [GpuSeen.of(s) for s in latest]
    # a node's newest samples, and two metrics of every GPU from a few fields (latest_of)
    host = _host_of(SLOW)
    assert store.latest_of([host]) == [s for s in latest if s.host == host] != []
    part = store.latest_of(attrs=("power_w", "temperature_gpu_c"))

    def shown(samples: list) -> list:
        return [(s.key, s.time_ns, s.lost, s.power_w, s.temperature_gpu_c) for s in samples]

    assert shown(part) == shown(latest)
    assert any(s.power_w for s in part) and any(s.temperature_gpu_c for s in part)
    raw = store.series(T0_NS, end_ns, ["utilization_gpu_pct", "clock_event_reasons"])
    per_gpu = raw.groupby(["host", "gpu_index", "uuid", "name"]).size()
    assert len(per_gpu) == len(_uuids())
    # (the GTX 1070 Ti reports neither reasons nor power: utilisation keeps its rows)
    fields = ["clock_event_reasons", "power_w", "utilization_gpu_pct"]
    rolled = store.series(T0_NS, end_ns, fields, step_s=60)
    assert rolled["uuid"].nunique() == len(_uuids())
    slow = rolled.loc[rolled["uuid"] == _uuid_of(SLOW)].set_index("time_ns")
    assert (slow.loc[slow.index >= T0_NS + 120 * NS, "clock_event_reasons"].astype(int) & 0x8).all()
    # a node's rows (the node page) are the cluster's rows of that node, whoever writes them
    # (memory: Telegraf's alone where gpuwatt writes the same GPUs)
    fields = [*fields, "memory_used_bytes"]
    for step_s in (None, 60):
        every = store.series(T0_NS, end_ns, fields, step_s=step_s)
        mine = every.loc[every["host"] == host].reset_index(drop=True)
        node = store.series(T0_NS, end_ns, fields, step_s=step_s, hosts=[host])
        assert mine["memory_used_bytes"].notna().any()
        pd.testing.assert_frame_equal(node, mine, obj=f"host {host}, step {step_s}")


def _check_rules(fired: dict[str, set[str]], errors: dict) -> None:
    assert errors == {}
    assert fired.get("GpuHardwareSlowdown") == {_uuid_of(SLOW)}
    assert fired.get("GpuRowRemapFailure") == {_uuid_of(REMAP)}
    assert "GpuLostOrMissing" not in fired and "CollectorDown" not in fired


def test_telegraf_alone(influx_db, alerts_con) -> None:
    server, db = influx_db
    server.write_lines(db, _telegraf_lines())  # raises on any rejected point
    with InfluxStore(server.url, "", db) as store:
        _check_reads(store)
        assert store.shared_writers == {}
        _check_rules(*_evaluate(store, alerts_con))
        # the analytics (dashboard, reports) decode Telegraf's reasons, and count 11 GPUs
        end_ns = T0_NS + MINUTES * 60 * NS
        data = read_analysis_input(store, T0_NS, end_ns)
        summary = analyze(data.frame, now_ns=end_ns, start_ns=T0_NS, jobs=data.jobs)
        assert summary.gpus == len(_uuids())
        gw = summary.gpu_windows
        late = gw.loc[gw["window_start_ns"] >= T0_NS + 180 * NS]
        slowed = late.groupby("uuid")["frac_hw_slowdown"].max()
        assert set(slowed[slowed > 0.5].index) == {_uuid_of(SLOW)}
        # Telegraf's process and MIG measurements beside its GPUs
        since = T0_NS + (MINUTES - 1) * 60 * NS
        mig = telegraf_mig_devices(store, since)
        assert [(d.gpu_uuid, d.mig_index) for d in mig] == [(_uuid_of(SLOW), i) for i in range(4)]
        procs = telegraf_processes(store, since)
        by_host = {p.host: sorted(x.pid for x in procs if x.host == p.host) for p in procs}
        (case,) = [c for c in CASES if c["name"] == REMAP]  # the RTX 3080 v12 stopped at 3 min
        pids = sorted(m["fields"]["pid"][1] for m in case["metrics"] if "pid" in m["fields"])
        assert by_host == {_host_of(REMAP): pids}


@pytest.mark.parametrize("domain", ["", ".example.org"], ids=["same-host", "telegraf-fqdn"])
def test_telegraf_and_gpuwatt_on_the_same_gpus(
    influx_db, alerts_con, domain: str, tmp_path: Path
) -> None:
    server, db = influx_db
    telegraf = _telegraf_lines(domain)
    half = len(telegraf) // 2
    with InfluxStore(server.url, "", db) as store:
        # interleaved: Telegraf first into a fresh shard, then gpuwatt, then Telegraf again
        server.write_lines(db, telegraf[:half])
        # gpuwatt's own write path: raises StoreRejected on a field type conflict
        store.write_samples(_gpuwatt_samples(telegraf, domain))
        server.write_lines(db, telegraf[half:])
        _check_reads(store)
        assert store.shared_writers == dict.fromkeys(_uuids(), ("gpuwatt", "telegraf"))
        # one GPU's power once, not twice: latest() equals the newest gpuwatt point
        end_ns = T0_NS + MINUTES * 60 * NS
        power = store.series(end_ns - 60 * NS, end_ns, ["power_w"])
        latest = {s.uuid: s.power_w for s in store.latest()}
        for uuid, p in latest.items():
            if p is not None:
                assert power.loc[power["uuid"] == uuid, "power_w"].max() == pytest.approx(p)
        _check_rules(*_evaluate(store, alerts_con))
        # once gpuwatt's collectors roll their hosts, a bucketed read (the dashboard's) is
        # served from the rollups, each GPU once under gpuwatt's host: Telegraf's points of the
        # same GPUs, under an FQDN too, are not read beside them
        from gpuwatt.store import engine_rollups

        hosts = sorted({s.host for s in _gpuwatt_samples(telegraf, domain)})
        assert engine_rollups.roll_range(store.rollups, T0_NS, end_ns, hosts=hosts) > 0
        assert store.rollups.unrolled_hosts(None) == []
        rolled = store.series(T0_NS, end_ns, ["power_w"], step_s=60)
        assert rolled.groupby("uuid")["host"].unique().map(list).to_dict() == {
            s.uuid: [s.host] for s in store.latest()
        }
        assert not rolled.duplicated(["time_ns", "uuid"]).any()
    # ``gpuwatt status`` counts each GPU once and says who writes them
    url = server.url.replace("http://", "influxdb://") + f"/{db}"
    result = gpuwatt("status", "--store", url, home=tmp_path)
    footer = result.stdout.strip().splitlines()[-2:]
    assert footer[0].startswith(f"{len(_uuids())} GPUs, "), result.stdout + result.stderr
    assert footer[1] == f"{len(_uuids())} GPUs written by gpuwatt and telegraf: each counted once"


def test_the_conflict_is_real(influx_db) -> None:
    """What gpuwatt wrote before: a boolean where Telegraf has a string. InfluxDB refuses it."""
    server, db = influx_db
    case = next(gpu_metric(c) for c in CASES if "remapped_rows_failure" in gpu_metric(c)["fields"])
    server.write_lines(db, [telegraf_line(case, "x", T0_NS)])
    line = f"nvidia_smi,host=y,index=0,uuid=GPU-1 remapped_rows_failure=false {T0_NS}"
    with pytest.raises(RuntimeError, match="field type conflict"):
        server.write_lines(db, [line])


def test_telegraf_only_hosts_are_read_beside_the_rollups(influx_db) -> None:
    """A bucketed read served from gpuwatt's rollups still shows the GPUs that only Telegraf
    writes (hosts no gpuwatt collector rolls), with the values a raw ``GROUP BY`` gives."""
    from gpuwatt.store import engine_rollups
    from gpuwatt.store.engine_rollups import MINUTE_NS

    server, db = influx_db
    server.write_lines(db, _telegraf_lines())
    end_ns = T0_NS + MINUTES * MINUTE_NS
    ours = [
        GpuSample(
            time_ns=t_ns,
            host="gw-node",
            gpu_index=0,
            uuid="GPU-gpuwatt-0",
            name="NVIDIA H100 80GB HBM3",
            utilization_gpu_pct=float(t_ns // NS % 89),
            power_w=200.0 + t_ns // NS % 53,
            energy_j=float(t_ns // NS - T0_NS // NS) * 250.0,
        )
        for t_ns in range(T0_NS, end_ns, 10 * NS)
    ]
    fields = ["power_w", "utilization_gpu_pct"]
    with (
        InfluxStore(server.url, "", db) as store,
        InfluxStore(server.url, "", db, use_rollups=False) as raw,
    ):
        store.write_samples(ours)
        # gw-node's collector rolls its own host; nothing rolls Telegraf's hosts
        assert engine_rollups.roll_range(store.rollups, T0_NS, end_ns, hosts=["gw-node"]) > 0
        assert store.rollups.rollup_span(MINUTE_NS) is not None
        assert store.rollups.unrolled_hosts(None) == sorted({_host(c) for c in CASES})
        for lo_ns, step_s in ((T0_NS, 60), (T0_NS + 25 * NS, 120), (T0_NS, 3600)):
            got = store.series(lo_ns, end_ns, fields, step_s=step_s)
            assert set(got["uuid"]) == _uuids() | {"GPU-gpuwatt-0"}
            want = raw.series(lo_ns, end_ns, fields, step_s=step_s)
            # the rollups know each bucket's seen time (SEEN_COLUMN), raw GROUP BY does not:
            # gpuwatt's host has it, the Telegraf hosts read raw beside it do not
            seen = got.pop(SEEN_COLUMN)
            assert (seen[got["host"] == "gw-node"] > 0).all()
            assert seen[got["host"] != "gw-node"].isna().all()
            pd.testing.assert_frame_equal(got, want, rtol=1e-9, obj=f"{lo_ns, step_s}")
        one = _host_of(SLOW)
        only = store.series(T0_NS, end_ns, fields, step_s=60, hosts=[one, "gw-node"])
        assert set(only["uuid"]) == {_uuid_of(SLOW), "GPU-gpuwatt-0"}
