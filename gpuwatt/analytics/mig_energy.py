"""MIG devices in the figures (docs/accounting.md, "MIG"): which rows are MIG devices, their
share of the parent GPU, and their energy as a model estimate from the parent's measured energy.

NVML measures power and energy on the whole GPU only. Per (window, parent GPU), a MIG device's
energy is the parent's energy x its share of the GPU's compute slices x its activity (its
utilisation, a fraction); what no device takes (idle slices, idle time, memory and fans) stays
with the parent as its unattributed remainder, so the parent's energy is the sum of its
devices' estimates plus that remainder, and nothing is counted twice.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuwatt.analytics.quality import Quality
from gpuwatt.mig import is_mig_uuid, mig_profile

#: Compute slices of a GPU in MIG mode: 7 on A100, H100, H200, B200; 4 on A30.
_SLICES_DEFAULT = 7
_SLICES_BY_MODEL = {"A30": 4}


def mig_rows(frame: pd.DataFrame) -> np.ndarray:
    """True for the rows of MIG devices (a ``MIG-`` uuid, or a parent uuid said)."""
    uuids = frame["uuid"]
    mig_uuids = [u for u in pd.unique(uuids) if is_mig_uuid(u)]  # a few per GPU, not per row
    mig = uuids.isin(mig_uuids).to_numpy(dtype=bool)
    if "parent_uuid" in frame:
        mig |= frame["parent_uuid"].notna().to_numpy() & (frame["parent_uuid"] != "").to_numpy()
    return mig


def slice_share(name: str) -> float:
    """A MIG device's share of its GPU's compute slices (``3g.40gb`` on an H100: 3/7);
    NaN when the name says no profile."""
    profile = mig_profile(name)
    if profile is None or "g." not in profile:
        return float("nan")
    try:
        g = int(profile.split("g.", 1)[0].split("+")[-1])
    except ValueError:
        return float("nan")
    total = next((n for m, n in _SLICES_BY_MODEL.items() if f" {m} " in f" {name} "), None)
    return g / (total or _SLICES_DEFAULT)


def split_parent_energy(gw: pd.DataFrame) -> pd.DataFrame:
    """Give the MIG device rows of the per (window, GPU) table (``gpuwatt.analytics.windows``)
    their energy estimate, in place: ``energy_delta_j`` and ``idle_energy_j`` of a MIG row become
    the parent's x slice share x activity (NaN where the parent's energy or the device's
    activity is not known). Adds ``mig`` (bool), ``gpu_share`` (1 for a whole GPU, the slice
    share for a MIG device) and, on parent rows, ``mig_estimate_j`` (the sum of its devices'
    estimates in that window). Returns ``gw``."""
    mig = mig_rows(gw)
    gw["mig"] = mig
    gw["gpu_share"] = 1.0
    gw["mig_estimate_j"] = 0.0
    if not mig.any():
        return gw
    shares = {n: slice_share(str(n)) for n in pd.unique(gw.loc[mig, "name"])}
    share = gw.loc[mig, "name"].map(shares).to_numpy(dtype=float)
    gw.loc[mig, "gpu_share"] = share
    key = ["window_start_ns", "host", "gpu_index"]
    parents = gw.loc[~mig, [*key, "energy_delta_j"]].drop_duplicates(key)
    parents = parents.rename(columns={"energy_delta_j": "parent_j"})
    devices = gw.loc[mig, key].merge(parents, on=key, how="left")
    util = gw.loc[mig, "utilization_gpu_pct"] if "utilization_gpu_pct" in gw else np.nan
    activity = np.clip(np.asarray(util, dtype=float) / 100.0, 0.0, 1.0)
    estimate = devices["parent_j"].to_numpy(dtype=float) * share * activity
    gw.loc[mig, "energy_delta_j"] = estimate
    gw.loc[mig, "idle_energy_j"] = np.where(gw.loc[mig, "idle"].to_numpy(dtype=bool), estimate, 0.0)
    sums = (
        pd.DataFrame({k: gw.loc[mig, k].to_numpy() for k in key} | {"e": estimate})
        .groupby(key, sort=False)["e"]
        .sum(min_count=1)
    )
    at = pd.MultiIndex.from_frame(gw.loc[~mig, key])
    gw.loc[~mig, "mig_estimate_j"] = sums.reindex(at).fillna(0.0).to_numpy()
    return gw


def add_mig_columns(per_gpu: pd.DataFrame, gw: pd.DataFrame) -> pd.DataFrame:
    """Per GPU (indexed by ``gpu_code``): ``mig``, ``gpu_share`` and, for a GPU split into MIG
    devices, ``unattributed_energy_j`` (its energy less its devices' estimates; NaN for other
    rows). A MIG device's energy quality becomes ``model_estimate`` where it has an estimate."""
    if not gw["mig"].any() and (gw["gpu_share"] == 1.0).all():  # no MIG device: no grouping
        per_gpu["mig"] = np.zeros(len(per_gpu), dtype=bool)
        per_gpu["gpu_share"] = np.ones(len(per_gpu))
        per_gpu["unattributed_energy_j"] = np.full(len(per_gpu), np.nan)
        return per_gpu
    g = gw.groupby("gpu_code", sort=True)
    per_gpu["mig"] = g["mig"].any().reindex(per_gpu.index).fillna(False).to_numpy(dtype=bool)
    per_gpu["gpu_share"] = g["gpu_share"].first().reindex(per_gpu.index).to_numpy(dtype=float)
    split = g["mig_estimate_j"].sum().reindex(per_gpu.index).to_numpy(dtype=float)
    mig = per_gpu["mig"].to_numpy(dtype=bool)
    parents = set(zip(gw.loc[gw["mig"], "host"], gw.loc[gw["mig"], "gpu_index"], strict=True))
    is_parent = ~mig & np.fromiter(
        ((h, i) in parents for h, i in zip(per_gpu["host"], per_gpu["gpu_index"], strict=True)),
        dtype=bool,
        count=len(per_gpu),
    )
    energy = per_gpu["energy_j"].to_numpy(dtype=float)
    per_gpu["unattributed_energy_j"] = np.where(is_parent, energy - split, np.nan)
    estimated = mig & np.isfinite(energy)
    if estimated.any():
        per_gpu.loc[estimated, "energy_quality"] = Quality.MODEL_ESTIMATE.value
        per_gpu.loc[estimated, "energy_reason"] = (
            "MIG device: the parent GPU's measured energy x its share of the compute slices x "
            "its activity (power is measured on the whole GPU only)"
        )
    return per_gpu
