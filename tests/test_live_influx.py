"""The InfluxDB backend end to end against a real InfluxDB 2.x/3.x (the docker-compose stack).

Runs when ``INFLUXDB_V2_URL`` is set (with ``INFLUXDB_V2_ORG``, ``INFLUXDB_V2_BUCKET`` and
``INFLUXDB_V2_TOKEN`` or ``INFLUXDB_V2_TOKEN_FILE``; the token needs write and read access to the
bucket); skipped otherwise. Writes a few points under a unique host name, reads them back.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from gpuwatt.store.influx import InfluxStore, influx_settings_from_env

pytestmark = [
    pytest.mark.live_influx,
    pytest.mark.skipif(
        not os.environ.get("INFLUXDB_V2_URL"),
        reason="INFLUXDB_V2_URL is not set (no live InfluxDB 2.x/3.x to test against)",
    ),
]

S = 1_000_000_000


def test_write_then_read_back(make_sample) -> None:
    settings = influx_settings_from_env(os.environ)
    host = f"live-{uuid.uuid4().hex[:10]}"
    t0 = time.time_ns() // S * S - 120 * S
    samples = [make_sample(t0 + i * S, host, g) for i in range(5) for g in range(2)]
    with InfluxStore.from_settings(settings, timeout_s=10) as store:
        store.write_samples(samples)
        deadline = time.monotonic() + 30  # 3.x makes writes queryable within about a second
        while store.count_samples(t0, t0 + 10 * S) < 10 and time.monotonic() < deadline:
            time.sleep(0.5)
        df = store.series(t0, t0 + 10 * S, ["power_w", "memory_used_bytes"], hosts=[host])
        assert len(df) == 10
        assert df["memory_used_bytes"].tolist() == [float(s.memory_used_bytes) for s in samples]
        latest = [s for s in store.latest(since_ns=t0) if s.host == host]
        assert latest == samples[-2:]
        minute = store.series(t0, t0 + 60 * S, ["power_w"], step_s=60, hosts=[host])
        assert minute["power_w"].tolist()[:2] == [s.power_w for s in samples[:2]]
