"""`complexity calibrate --device cuda`: discover the GPUs, plan within the budget, measure
(compute on GPU 0, collectives over all visible GPUs), leaving the fit to
``calibrate.cli.run_fit`` (which reads the rows and builds ``calibrate.gpu_profile``).

``--dry-run`` prints the plan without measuring; with ``--gpu KEY --gpus N`` it plans for a
node other than this one (e.g. an 8 x H200 node from a laptop) and needs no GPU or torch
CUDA build here. Without ``--gpu`` the GPU is named from what NVML / torch report
(``calibrate.device.gpu_key_for``); a GPU hardware_db does not list needs ``--gpu KEY``
naming the datasheet to measure against.
"""
from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from typing import Any

from simulator.errors import ComplexityError, InvalidInputError

from .budget import make_plan, plan_lines, target_for
from .discover import DeviceInfo, discover

NO_CUDA = "--device cuda: no CUDA GPU is visible to torch on this host ({why}); {hint}"
CALIBRATE_HINT = ("calibrate the CPU with --device cpu, or plan for another node with "
                  "--dry-run --gpu KEY --gpus N")


def cuda_missing_reason() -> str | None:
    """Why torch cannot use a GPU here, or None when it can."""
    import os
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.backends.cuda.is_built():
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        return "torch.cuda.is_available() is False" + (
            f" (CUDA_VISIBLE_DEVICES={vis!r})" if vis is not None else "")
    return None


def require_cuda(hint: str = CALIBRATE_HINT) -> DeviceInfo:
    """The visible GPUs, or one ``ComplexityError`` line saying why there are none."""
    why = cuda_missing_reason()
    if why is None and discover().kind != "cuda":
        why = "no GPU discovered"
    if why is not None:
        raise ComplexityError(NO_CUDA.format(why=why, hint=hint))
    return discover()


def resolve_gpu(info: DeviceInfo | None, gpu: str | None) -> str:
    """hardware_db key of the GPU measured (``--gpu`` overrides the reported name)."""
    import hardware_db

    from .device import gpu_key_for
    if gpu:
        return hardware_db.resolve_gpu_key(gpu)
    if info is None:
        raise InvalidInputError("gpu", None, "a GPU key (--gpu KEY) when this host has no GPU")
    key = gpu_key_for(info.name, info.mem_bytes)
    if key is None:
        raise InvalidInputError("gpu", info.name, "a GPU listed in hardware_db (complexity "
                                "list gpus); pass --gpu KEY naming the datasheet to measure "
                                "against")
    return key


def stored_keys(out: Path, device: str | None = None) -> set[str]:
    """Point keys already in ``OUT/measurements`` (any benchmark; only rows measured on
    ``device`` when given, as ``store.Store`` resumes only those)."""
    from .store import read_rows
    keys: set[str] = set()
    for path in sorted((Path(out) / "measurements").glob("*.parquet")):
        keys |= {r["point"] for r in read_rows(path) if device in (None, r.get("device"))}
    return keys


def _budget(budget_s: float | None) -> float | None:
    if budget_s is not None and not budget_s > 0:
        raise InvalidInputError("budget_s", budget_s, "a positive number of seconds")
    return budget_s


def dry_run(out: Path, budget_s: float | None, gpu: str | None, gpus: int | None) -> list[str]:
    """The plan's text; plans for ``gpu`` x ``gpus`` when given, else for this host."""
    info = None
    if gpu is None or gpus is None:
        info = require_cuda()
    key = resolve_gpu(info, gpu)
    n = gpus if gpus is not None else len(info.gpus)
    done = stored_keys(out, info.key if info else None) if Path(out).is_dir() else set()
    return plan_lines(make_plan(target_for(key, n), _budget(budget_s), done))


def gpu_environment(info: DeviceInfo, key: str) -> dict[str, str]:
    """The fingerprint of every GPU row: the CPU one plus what identifies the GPU run."""
    import torch

    from .store import environment
    env = environment(info.key)
    try:
        nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:          # noqa: BLE001 - a build without NCCL
        nccl = ""
    sms = info.gpus[0].sm_count if info.gpus else 0
    return {**env, "gpu_key": key, "gpu_name": info.name, "gpus": str(len(info.gpus)),
            "sm_count": str(sms), "host": socket.gethostname(), "driver": info.driver,
            "cuda": str(torch.version.cuda or ""), "nccl": nccl}


def measure_gpu(out: Path, budget_s: float | None = None, gpu: str | None = None,
                quiet: bool = False, strict: bool = False) -> list[str]:
    """Measure this host's GPUs into ``OUT/measurements``; returns notes (skipped groups,
    budget reached, collectives skipped) for the caller to print."""
    from .bench_comm import BenchmarkError
    from .bench_gpu import run_compute
    from .bench_nccl import run_collectives
    from .device import cuda_device
    from .discover import describe
    info = require_cuda()
    t0 = time.perf_counter()
    key = resolve_gpu(info, gpu)
    plan = make_plan(target_for(key, len(info.gpus)), _budget(budget_s),
                     stored_keys(out, info.key))
    env = gpu_environment(info, key)
    if not quiet:
        print(describe(info), file=sys.stderr)
        print("\n".join(plan_lines(plan)), file=sys.stderr, flush=True)
    deadline = t0 + budget_s if budget_s is not None else float("inf")
    rep = run_compute(out, env, plan, cuda_device(0), deadline, quiet)
    notes = rep.notes()
    comm = [p for p in plan.points if p.bench in ("collectives", "interference")]
    if comm:
        try:
            left = run_collectives(out, env, comm, len(info.gpus), deadline, "nccl", quiet)
            if left:
                notes.append(f"time budget reached: {left} collective points not measured")
        except BenchmarkError as exc:
            if strict:
                raise
            notes.append(f"{exc}; the profile transfers the link coefficients instead")
    elif len(info.gpus) < 2:
        notes.append("1 GPU: NCCL collectives and interference skipped (the profile transfers "
                     "its link coefficients and overlap slowdown from the reference profile)")
    return notes


def headline(prof: Any) -> str:
    """One line about a GPU profile: bf16 GEMM, HBM, scale-up link efficiencies."""
    e = prof.gemm.eff_max
    parts = [f"{d} GEMM eff {e[d].value:.3f}" for d in ("bf16", "fp8") if d in e]
    parts.append(f"HBM bw_eff {prof.memory.bw_eff.value:.3f}")
    if "bf16" in prof.attention.fwd_eff:
        parts.append(f"attention bf16 fwd {prof.attention.fwd_eff['bf16'].value:.3f}")
    nv = prof.links.get("nvlink")
    if nv is not None:
        parts.append(f"nvlink bw_eff {nv.bw_eff.value:.3f}"
                     + (" (transferred)" if nv.bw_eff.source.startswith("transferred") else ""))
    return ", ".join(parts)
