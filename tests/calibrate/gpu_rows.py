"""A synthetic GPU calibration: the rows ``complexity calibrate --device cuda`` writes, made on
a CPU from known coefficients with the simulator's own formulas (plus noise).

The points are the plan's (``calibrate.budget.make_plan`` for an 8 x H200 node), the derived
columns are ``calibrate.bench_gpu.point_params``'s, the fingerprint is
``calibrate.gpu_run.gpu_environment``'s keys: the fixture has the format of real GPU rows,
so ``calibrate.gpu_profile`` can be tested end to end without a GPU. The truth is a set of
plausible H200 numbers, not a measurement.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from calibrate.budget import make_plan, target_for
from calibrate.device import BenchDevice, WallTimer
from calibrate.reference_gemm import tile_for
from simulator.cost.kernels import gemm_time_core_s, wave_efficiency
from simulator.hardware.profile import Coefficient, LinkCoefficients
from simulator.network.collectives import (
    Collective,
    alpha_beta_time_s,
    ring_steps_and_traffic,
)

TRUTH = {"eff": {"bf16": 0.72, "fp16": 0.70, "tf32": 0.60, "fp8": 0.58}, "k_half": 300.0,
         "launch_us": 6.0, "bw_eff": 0.88, "mem_launch_us": 4.0,
         "kernel_eff": {"layernorm": 0.70, "gelu": 0.80, "add": 0.85},
         "attn": {("bf16", "flash"): (0.40, 0.33), ("fp16", "flash"): (0.41, 0.34),
                  ("bf16", "cudnn"): (0.55, 0.42)},
         "link": {"alpha_us": 2.0, "small_bw_eff": 0.30, "base_us": 60.0, "bw_eff": 0.80},
         "speedup": 1.30, "overlap": 1.15}
ENV = {"device": "cuda-nvidia-h200", "gpu_key": "h200-sxm", "gpu_name": "NVIDIA H200",
       "gpus": "8", "sm_count": "132", "host": "synthetic-node", "driver": "000.00",
       "cuda": "12.x", "nccl": "2.x", "torch_version": "synthetic", "date": "2025-01-01",
       "git_revision": "x", "python": "3", "gloo": "yes", "cpu_pressure_avg60_pct": ""}


class _EventKind(WallTimer):
    kind = "cuda_event"


FAKE_DEV = BenchDevice("cuda", 0, _EventKind(), 256 * 2 ** 20)


def _coefs(d):
    return LinkCoefficients(**{k: Coefficient(v, "", "") for k, v in d.items()})


def _time(p, t) -> float:
    """Seconds of one point from TRUTH with the simulator's formulas."""
    q, gpu = p.p, t.gpu
    if p.bench == "gemm":
        d, tile = q["dtype"], tile_for(t.gpu.key)
        elem = {"fp8": 1, "bf16": 2, "fp16": 2, "tf32": 4}[d]
        m, n, k = q["m"], q["n"], q["k"]
        return gemm_time_core_s(m, n, k, elem * (m * k + k * n + m * n), gpu.peak(d) * 1e12,
                                TRUTH["eff"][d], TRUTH["k_half"], TRUTH["launch_us"] * 1e-6,
                                wave_efficiency(m, n, tile, tile, gpu.sm_count),
                                gpu.mem_bw_gbytes_per_s * 1e9 * TRUTH["bw_eff"])
    if p.bench == "memory":
        from calibrate.bench_gpu import point_params
        pp = point_params(p, FAKE_DEV)
        eff = TRUTH["bw_eff"] if q["kernel"] == "copy" else TRUTH["kernel_eff"][q["kernel"]]
        return pp["kernels"] * TRUTH["mem_launch_us"] * 1e-6 + pp["bytes_moved"] / (
            gpu.mem_bw_gbytes_per_s * 1e9 * eff)
    if p.bench == "attention":
        from calibrate.bench import attention_flops
        fl = attention_flops(q["batch"], q["heads"], q["seq"], q["head_dim"])
        ef, eb = TRUTH["attn"][(q["dtype"], q["backend"])]
        launch, peak = TRUTH["mem_launch_us"] * 1e-6, gpu.peak(q["dtype"]) * 1e12
        fwd = launch + fl / (peak * ef)
        return fwd + (launch + 2.5 * fl / (peak * eb) if q["pass"] == "fwd_bwd" else 0.0)
    return _comm_time(q["op"], q["size_bytes"], q["n_ranks"], q["algo"], t)


def _comm_time(op, size, n, algo, t) -> float:
    steps, wire = ring_steps_and_traffic(Collective(op), n, size)
    scale = TRUTH["speedup"] if op == "all_reduce" and algo == "default" else 1.0
    return alpha_beta_time_s(steps, wire, t.node.scale_up.bandwidth_gbytes_per_s * 1e9,
                             t.node.scale_up.latency_us * 1e-6, _coefs(TRUTH["link"]), scale)


def _row(p, t, rng, noise: float) -> dict:
    from calibrate.bench_gpu import point_params
    from calibrate.fit import busbw_factor
    x = float(np.exp(rng.normal(0, noise)))
    if p.bench == "interference":
        comm = _comm_time("all_reduce", p.p["allreduce_bytes"], t.gpus, "default", t)
        alone = 2.0 * comm
        med = (alone + (TRUTH["overlap"] - 1.0) * min(comm, alone)) * x
        extra = {"mode": "span", "alone_s": alone, "alone_iqr_s": 0.0, "comm_alone_s": comm,
                 "gemm_reps": 10, "backend": "nccl", "timer": "cuda_event"}
    else:
        med = _time(p, t) * x
        extra = point_params(p, FAKE_DEV) if p.bench in ("gemm", "memory", "attention") else {
            "backend": "nccl", "timer": "cuda_event", "size_bytes": float(p.p["size_bytes"])}
        if p.bench == "collectives":
            alg = p.p["size_bytes"] / med / 1e9
            extra.update(algbw_gbytes_per_s=alg, busbw_gbytes_per_s=alg * busbw_factor(
                Collective(p.p["op"]), t.gpus))
        else:
            extra.update(sm_clock_mhz=1755, power_w=690.0, clock_reasons="sw_power_cap")
    return {"point": p.key, **p.p, **extra, "median_s": med, "p25_s": med, "p75_s": med,
            "iqr_s": 0.0, "mean_s": med, "p10_s": med, "n_samples": 20, "cpu_pressure": 0.0,
            "suspect": False, **ENV, "gpus": str(t.gpus)}


def write_gpu_calibration(out: Path, gpus: int = 8, noise: float = 0.02, seed: int = 0,
                          budget_s: float | None = None) -> Path:
    """``out/measurements/*.parquet`` as a GPU calibration of ``gpus`` H200s writes them."""
    t = target_for("h200-sxm", gpus)
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {}
    for p in make_plan(t, budget_s).points:
        rows.setdefault(p.bench, []).append(_row(p, t, rng, noise))
    (out / "measurements").mkdir(parents=True, exist_ok=True)
    for bench, rs in rows.items():
        keys = list(dict.fromkeys(k for r in rs for k in r))
        pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rs]),
                       out / "measurements" / f"{bench}.parquet")
    return out
