"""A quick CPU profile measured under data-parallel load (all ranks busy at once).

Complement to ``complexity calibrate`` (which times kernels in one process): on a small
host, two DDP ranks share caches, memory bandwidth and cores with each other and with
gloo's threads, so the rates that predict a 2-rank step are the rates measured while every
rank runs the same kernel. ``loaded_profile`` spawns ``world`` processes (``threads``
intra-op threads each), runs after a barrier, on every rank at once: matmuls over shapes
typical of training (square, activation x weight with a small batch dimension, and
weight-gradient shapes with a small ``k``), 3x3 / 1x1 convolutions forward and backward,
element-wise / normalisation kernels, gloo all-reduces, and a matmul while an all-reduce
is in flight. It fits the closed forms of ``simulator.cost.kernels`` (scipy ``least_squares`` on
log time) into a ``Profile`` whose ``gemm.eff_max['conv:fp32']`` carries the measured
convolution efficiency and ``gemm.eff_max['membw:<class>']`` the bandwidth of each class of
bandwidth-bound kernel relative to the device's (copy, add, relu, gelu, layer_norm,
batch_norm, max_pool: a CPU runs a normalisation ten times slower per byte than a copy);
``simulator.modules.op_report`` uses them, other readers ignore them.
Nothing here uses the model being predicted. torch is imported inside functions only.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from ..cost.kernels import gemm_time_core_s
from ..hardware.profile import (
    AttentionModel,
    Coefficient,
    GemmModel,
    LinkCoefficients,
    MemoryModel,
    Profile,
)
from ..hardware.specs import GPUSpec, LinkKind, LinkSpec, NodeSpec
from ..network.collectives import Collective, alpha_beta_time_s, ring_steps_and_traffic

GEMMS = [(512, 512, 512), (1024, 1024, 1024), (2048, 1024, 1024), (64, 4096, 1024),
         (64, 1024, 4096), (256, 1024, 1024), (4096, 1024, 64), (1024, 4096, 64),
         (128, 2048, 2048), (2048, 2048, 128), (32, 512, 512), (16, 256, 256)]
CONVS = [(16, 64, 32, 64, 3), (16, 128, 16, 128, 3), (16, 256, 8, 256, 3), (16, 512, 4, 512, 3),
         (8, 64, 56, 256, 1), (8, 256, 14, 256, 3)]              # (N, C_in, HW, C_out, k)
MEM_SIZES = [1 << 16, 1 << 19, 1 << 22]
MEM_KERNELS = ("copy", "add", "relu", "gelu", "layer_norm", "batch_norm", "max_pool")
AR_SIZES = [1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24, 1 << 25]


def _timed(dist: Any, fn: Callable[[], Any], target_s: float) -> float:
    """Seconds per call: all ranks start together and make the same number of calls (so
    ``fn`` may be a collective); the fastest of five timed batches (a shared host's stalls
    only ever add time)."""
    import torch
    fn()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    fn()
    per = (time.perf_counter() - t0) / 2
    reps = torch.tensor([max(1, int(target_s / 5 / max(per, 1e-7)))])
    dist.all_reduce(reps, op=dist.ReduceOp.MIN)
    out = []
    for _ in range(5):
        dist.barrier()
        t = time.perf_counter()
        for _ in range(int(reps)):
            fn()
        out.append((time.perf_counter() - t) / int(reps))
    return min(out)


def _mem_fn(torch: Any, kernel: str, n: int):
    """A kernel of class ``kernel`` on ``n`` fp32 elements and the bytes the tracer would
    charge it (every tensor read + every tensor written, as ``trace_torch`` counts)."""
    import torch.nn.functional as F
    x, y = torch.randn(n), torch.randn(n)
    img = torch.randn(8, max(1, n // (8 * 256)), 16, 16)
    img_g = img.clone().requires_grad_(True)
    w, b = torch.ones(img.shape[1]), torch.zeros(img.shape[1])
    lw, lb = torch.ones(1024), torch.zeros(1024)
    fns = {"copy": lambda: torch.clone(x), "add": lambda: torch.add(x, y),
           "relu": lambda: F.relu(x), "gelu": lambda: F.gelu(x),
           "layer_norm": lambda: F.layer_norm(x.view(-1, 1024), (1024,), lw, lb),
           "batch_norm": lambda: F.batch_norm(img, None, None, w, b, training=True),
           "max_pool": lambda: F.max_pool2d(img_g, 2)}
    moved = {"copy": 8, "add": 12, "relu": 8, "gelu": 8, "layer_norm": 8, "batch_norm": 8,
             "max_pool": 7}
    return fns[kernel], moved[kernel] * n


def _bench_compute(torch: Any, dist: Any, res: dict, target: float) -> None:
    import torch.nn.functional as F
    for m, n, k in GEMMS:
        a, b = torch.randn(m, k), torch.randn(k, n)
        res["gemm"].append((m, n, k, _timed(dist, lambda: a @ b, target)))
    for nb, cin, hw, cout, ks in CONVS:
        x = torch.randn(nb, cin, hw, hw, requires_grad=True)
        w = torch.randn(cout, cin, ks, ks, requires_grad=True)
        t_f = _timed(dist, lambda: F.conv2d(x, w, padding=ks // 2), target)
        t_fb = _timed(dist, lambda: F.conv2d(x, w, padding=ks // 2).sum().backward(), target)
        res["conv"].append((nb, cin, hw, cout, ks, t_f, t_fb))
    for kern in MEM_KERNELS:
        for n in MEM_SIZES:
            fn, moved = _mem_fn(torch, kern, n)
            res["mem"].append((kern, moved, _timed(dist, fn, target)))


def _bench_comm(torch: Any, dist: Any, res: dict, target: float) -> None:
    for size in AR_SIZES:
        t = torch.ones(size // 4)
        res["ar"].append((size, _timed(dist, lambda: dist.all_reduce(t), target)))
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    big = torch.ones((1 << 26) // 4)
    alone = _timed(dist, lambda: a @ b, target)
    during = []
    for _ in range(3):
        dist.barrier()
        work = dist.all_reduce(big, async_op=True)
        t0, n = time.perf_counter(), 0
        while not work.is_completed():
            a @ b
            n += 1
        during.append((time.perf_counter() - t0) / max(1, n))
        work.wait()
    res["interf"].append((alone, sorted(during)[1]))


def _worker(rank: int, world: int, threads: int, port: int, out: str, target: float) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        res: dict[str, list] = {"gemm": [], "conv": [], "mem": [], "ar": [], "interf": []}
        _bench_compute(torch, dist, res, target)
        _bench_comm(torch, dist, res, target)
        if rank == 0:
            Path(out).write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()


def measure_loaded(world: int = 2, threads: int = 1, target_s: float = 0.15,
                   repeat: int = 3) -> dict:
    """Raw timings (seconds per call) of every benchmark, all ranks busy; ``repeat`` full
    passes, each point keeping its fastest pass (a shared host's stalls only add time)."""
    from .run import _free_port, spawn_workers
    runs = []
    for _ in range(max(1, repeat)):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "calib.json")
            runs.append(spawn_workers(_worker, (world, threads, _free_port(), out, target_s),
                                      world, out))
    return combine_runs(runs)


def combine_runs(runs: list[dict]) -> dict:
    """Per point, the fastest of several passes (interference: the median ratio)."""
    def fastest(key: str, tcols: tuple[int, ...]) -> list:
        out = []
        for rows in zip(*(r[key] for r in runs)):
            best = list(rows[0])
            for c in tcols:
                best[c] = min(row[c] for row in rows)
            out.append(best)
        return out
    ratios = sorted((r["interf"][0][1] / r["interf"][0][0], r["interf"][0]) for r in runs)
    return {"gemm": fastest("gemm", (3,)), "conv": fastest("conv", (5, 6)),
            "mem": fastest("mem", (2,)), "ar": fastest("ar", (1,)),
            "interf": [ratios[len(ratios) // 2][1]]}


# ---- fits --------------------------------------------------------------------------------------
def _lsq(fn: Callable, x0: list[float], rows: list, meas: list[float]) -> list[float]:
    import numpy as np
    from scipy.optimize import least_squares
    y = np.log(np.asarray(meas))
    def resid(logp):
        p = [float(v) for v in np.exp(logp)]
        return np.log(np.maximum([fn(p, r) for r in rows], 1e-12)) - y
    sol = least_squares(resid, np.log(x0), loss="soft_l1", f_scale=0.1)
    return [float(v) for v in np.exp(sol.x)]


def _conv_gemm(nb: int, cin: int, hw: int, cout: int, ks: int) -> tuple[int, int, int, float]:
    m, n, k = nb * hw * hw, cout, cin * ks * ks
    return m, n, k, 4.0 * (nb * cin * hw * hw + cout * cin * ks * ks + nb * cout * hw * hw)


def _fit_memory(rows: list) -> tuple[float, float, dict[str, float]]:
    """(bandwidth GB/s, launch us) over every kernel, and each class's own bandwidth with
    the shared launch cost."""
    mem = _lsq(lambda p, r: p[1] * 1e-6 + r[1] / (p[0] * 1e9), [20.0, 5.0], rows, [r[2] for r in rows])
    classes = {}
    for kern in MEM_KERNELS:
        sub = [r for r in rows if r[0] == kern]
        classes[kern] = _lsq(lambda p, r: mem[1] * 1e-6 + r[1] / (p[0] * 1e9), [mem[0]], sub,
                             [r[2] for r in sub])[0]
    return mem[0], mem[1], classes


def fit_loaded(raw: dict) -> dict[str, float]:
    """Fitted coefficients (GFLOP/s, GB/s, us, fractions) from ``measure_loaded`` output."""
    bw, mem_launch, classes = _fit_memory(raw["mem"])

    def gemm(p, r):
        m, n, k = r[0], r[1], r[2]
        return gemm_time_core_s(m, n, k, 4.0 * (m * k + k * n + m * n), p[0] * 1e9, 1.0, p[1],
                                p[2] * 1e-6, 1.0, bw * 1e9)
    peak, k_half, launch = _lsq(gemm, [100.0, 16.0, 5.0], raw["gemm"], [r[3] for r in raw["gemm"]])
    ratios = []
    for nb, cin, hw, cout, ks, t_f, t_fb in raw["conv"]:
        m, n, k, _ = _conv_gemm(nb, cin, hw, cout, ks)
        model = gemm([peak, k_half, launch], (m, n, k))
        ratios += [model / t_f, 2 * model / max(t_fb - t_f, 1e-9)]
    conv_eff = sorted(ratios)[len(ratios) // 2]
    link = _fit_link(raw["ar"])
    alone, during = raw["interf"][0]
    return {"peak_gflops": peak, "k_half": k_half, "launch_us": launch, "conv_eff": conv_eff,
            "mem_bw_gbytes_per_s": bw, "mem_launch_us": mem_launch, **link,
            **{f"membw:{k}": v for k, v in classes.items()},
            "overlap_slowdown": max(1.0, during / alone)}


def _fit_link(ar: list) -> dict[str, float]:
    def model(p, r):
        steps, wire = ring_steps_and_traffic(Collective.ALL_REDUCE, 2, r[0])
        c = LinkCoefficients(*(Coefficient(v, "", "") for v in (p[1], p[2], p[3], 1.0)))
        return alpha_beta_time_s(steps, wire, p[0] * 1e9, 0.0, c)
    bw, alpha, small_eff, base = _lsq(model, [2.0, 50.0, 0.5, 200.0], ar, [r[1] for r in ar])
    return {"link_gbytes_per_s": bw, "alpha_us": alpha, "small_bw_eff": min(small_eff, 1.0),
            "base_us": base}


def build_profile(fit: dict[str, float], world: int, threads: int, name: str = "") -> Profile:
    src = (f"measured by simulator.modules.calib: {world} ranks x {threads} thread(s), all ranks "
           "running each kernel at once")
    c = lambda v, unit: Coefficient(float(v), unit, src)
    peak = fit["peak_gflops"] / 1e3
    dev = GPUSpec(key="cpu-loaded", name="this CPU under DDP load", vendor="cpu",
                  peak_tflops={"fp32": peak}, mem_bytes=0.0,
                  mem_bw_gbytes_per_s=fit["mem_bw_gbytes_per_s"], tdp_w=0.0, sm_count=0,
                  source=src)
    host = LinkSpec("host-gloo", LinkKind.HOST, fit["link_gbytes_per_s"], 0.0, src)
    nic = LinkSpec("none", LinkKind.ETHERNET, 0.0, 0.0, "single host")
    node = NodeSpec("cpu-loaded-host", dev.key, world, host, world, False, 0, nic, src)
    eff = {"fp32": c(1.0, "fraction"), "conv:fp32": c(fit["conv_eff"], "fraction")}
    eff.update({k: c(v / fit["mem_bw_gbytes_per_s"], "fraction of mem bandwidth")
                for k, v in fit.items() if k.startswith("membw:")})
    gemm = GemmModel(eff_max=eff,
                     k_half=c(fit["k_half"], "elements"), launch_us=c(fit["launch_us"], "us"),
                     tile_m=0, tile_n=0)
    attn = AttentionModel(fwd_eff={"fp32": c(0.3, "fraction")}, bwd_eff={"fp32": c(0.3, "fraction")})
    link = LinkCoefficients(c(fit["alpha_us"], "us"), c(fit["small_bw_eff"], "fraction"),
                            c(fit["base_us"], "us"), c(1.0, "fraction"))
    return Profile(name=name or f"cpu-loaded-{world}x{threads}t", device_key=dev.key, gemm=gemm,
                   memory=MemoryModel(c(1.0, "fraction"), c(fit["mem_launch_us"], "us")),
                   attention=attn, links={"host": link},
                   overlap_slowdown=c(fit["overlap_slowdown"], "multiplier"),
                   step_overhead_s=Coefficient(0.0, "s", "assumed"), device=dev, node=node,
                   notes=json.dumps({k: round(v, 6) for k, v in sorted(fit.items())}))


def loaded_profile(world: int = 2, threads: int = 1, target_s: float = 0.15,
                   repeat: int = 3) -> Profile:
    """Measure and fit (about 15 s per pass on a 2-core host)."""
    return build_profile(fit_loaded(measure_loaded(world, threads, target_s, repeat)), world, threads)


__all__ = ["loaded_profile", "measure_loaded", "fit_loaded", "build_profile"]
