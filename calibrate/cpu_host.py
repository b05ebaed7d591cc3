"""The measured CPU's host model (``Profile.host``) from ``OUT/measurements/host.parquet``
(``calibrate.bench_host``), and what it changes in the kernel models.

On a CPU the host thread runs the kernels itself (``HostModel.synchronous``): an op costs
its dispatch (Python, dispatcher, autograd; measured per op-graph op by the host probe,
where the kernels are nearly free) plus its kernel's work. The kernel sweeps
(``calibrate.bench``, ``bench_mem``) time each kernel cold, after rewriting a buffer of up to
256 MiB; their fitted per-call intercepts (tens to hundreds of microseconds) are the cost of
refilling caches and TLB after that flush, which a training step does not pay between
consecutive ops (measured here: a 64x64x64 GEMM 8 us hot, 60-110 us after the flush; inside a
tiny-2l-128 step its GEMMs ran within 15-40% of the hot time). So with a host model the
kernels' fixed per-call cost is the host's, and ``gemm.launch_us`` / ``memory.launch_us``
are 0; the intercepts stay in the notes. Without ``host.parquet`` (older calibrations) the
profile is as before: no host model, fitted intercepts.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from simulator.hardware.profile import Coefficient, GemmModel, HostModel, MemoryModel

from .hygiene import mark, select_rows
from .store import read_rows


def load_host_rows(out_dir: Path, strict: bool = False):
    """Selected rows of the host probe, or None when it was not measured."""
    path = Path(out_dir) / "measurements" / "host.parquet"
    if not path.exists():
        return None
    return select_rows("host", read_rows(path), path, strict)


def host_model(rows: Sequence[Mapping[str, Any]], threads: int, dirty: bool) -> HostModel:
    from .bench_host import HOST_LAYERS, per_op_us
    us = per_op_us(rows, threads)
    sel = [r for r in rows if int(r["threads"]) == threads]
    aten = {int(r["layers"]): int(r["aten_kernel_ops_fwd"]) for r in sel
            if r["kind"] == "decoder" and r["pass"] == "fwd"}
    lo, hi = HOST_LAYERS
    src = (f"fit to measurements/host.parquet ({len(sel)} points at {threads} thread(s), "
           f"fastest of 40 trials, thread CPU time): tiny decoders (calibrate.torch_model, hidden 32, seq 8) "
           f"with {hi} vs {lo} layers; time difference / op-graph ops of the extra layers "
           f"(the layers issue {(aten[hi] - aten[lo]) / (hi - lo):.0f} non-view aten ops per "
           f"layer forward against the op graph's {_graph(sel, hi, lo, 'fwd')}); a "
           f"torch.nn.Linear forward on the same input costs {us['linear']:.1f} us")
    fwd = Coefficient(round(us["fwd"], 2), "us", "host time per op-graph op, forward with "
                      "autograd recording; " + src)
    bwd = Coefficient(round(us["bwd"], 2), "us", "host time per op-graph op, backward "
                      "(autograd engine); " + src)
    h = HostModel(op_fwd_us=fwd, op_bwd_us=bwd, synchronous=True)
    return mark(h) if dirty else h


def step_overhead(rows: Sequence[Mapping[str, Any]], threads: int, host: HostModel
                  ) -> Coefficient | None:
    """Host time of one training step that does not grow with the layers and that the op
    graph does not price: the decoder probes' intercepts (1-layer time less one layer's
    worth, from the 1- vs 5-layer difference) of the forward, backward, ``optimizer.step()``
    and ``zero_grad`` calls, less what ``host`` charges for the probe's ops outside its
    layers (embedding, final norm, logits, loss: ``cost.host.eager_host_us``'s count). It
    is Python, module calls, autograd graph set-up and teardown, the loss call and the
    optimizer's and zero_grad's Python around their kernels. ``None`` where the probe did
    not time the optimizer (older ``host.parquet``)."""
    from .bench_host import HOST_LAYERS, probe_spec
    sel = {(int(r["layers"]), r["pass"]): r for r in rows
           if int(r["threads"]) == threads and r["kind"] == "decoder"}
    lo, hi = HOST_LAYERS
    if (lo, "opt") not in sel or (hi, "opt") not in sel:
        return None

    def t(layers: int, pas: str) -> float:
        r = sel[(layers, pas)]
        return r.get("min_s") or r.get("p10_s") or r["median_s"]
    icept = {pas: t(lo, pas) - lo * (t(hi, pas) - t(lo, pas)) / (hi - lo)
             for pas in ("fwd", "bwd", "opt", "zero")}
    priced_f, priced_b = _probe_head_ops(probe_spec(lo))
    priced = (priced_f * host.op_fwd_us.value + priced_b * host.op_bwd_us.value) * 1e-6
    total = max(0.0, sum(icept.values()) - priced)
    parts = ", ".join(f"{k} {v * 1e6:.1f}" for k, v in icept.items())
    return Coefficient(round(total, 7), "s", (
        f"measured: decoder probe intercepts at {threads} thread(s) (thread CPU time, "
        f"fastest of 40 trials; {lo}- vs {hi}-layer hidden-32 decoders, "
        f"measurements/host.parquet): {parts} us, less {priced * 1e6:.1f} us the host model "
        f"charges for the probe's {priced_f} forward and {priced_b} backward op-graph ops "
        f"outside its layers. Charged once per step: with gradient accumulation the "
        f"forward and backward calls' share recurs per micro-batch and is under-counted"))


def _probe_head_ops(spec) -> tuple[int, int]:
    """(forward, backward) op-graph ops outside the layers of the probe decoder (the
    count ``cost.host.eager_host_us`` charges)."""
    from simulator.cost.host import op_count
    from simulator.workload.ops import backward_ops, embedding_ops, head_ops

    from .bench_host import probe_shape
    sh = probe_shape(spec)
    extra = embedding_ops(spec, sh) + head_ops(spec, sh)
    return sum(op_count(o) for o in extra), sum(op_count(o) for o in backward_ops(extra))


def _graph(sel, hi: int, lo: int, pas: str) -> str:
    g = {int(r["layers"]): int(r["graph_ops"]) for r in sel
         if r["kind"] == "decoder" and r["pass"] == pas}
    return f"{(g[hi] - g[lo]) / (hi - lo):.0f}"


def host_launch(gemm: GemmModel, memory: MemoryModel) -> tuple[GemmModel, MemoryModel, str]:
    """Kernel models whose per-call fixed cost is left to the host model (see module doc),
    and a note with the fitted intercepts they replace."""
    why = ("0: on a CPU the per-op fixed cost is the host's dispatch (Profile.host, measured "
           "by the host probe); the cold-sweep intercept {:.1f} us is the cost of refilling "
           "caches after the benchmark's flush, not paid between the ops of a step")
    g = replace(gemm, launch_us=Coefficient(0.0, "us", why.format(gemm.launch_us.value)))
    m = replace(memory, launch_us=Coefficient(0.0, "us", why.format(memory.launch_us.value)))
    note = (f" Kernel fixed costs are left to the host model; the cold-sweep intercepts were "
            f"GEMM {gemm.launch_us.value:.1f} us, memory-bound {memory.launch_us.value:.1f} us.")
    return g, m, note
