"""``complexity validate-memory``: the simulator's memory estimate against PyTorch's own
memory tracker, on CPU, without allocating anything.

Each case builds the decoder of ``memcheck_model`` for a ``TransformerSpec``, runs two
training steps of two micro-batches each (gradient accumulation: the gradients exist while
the second micro-batch runs, as in any run with more than one micro-batch) under
``FakeTensorMode`` with ``torch.distributed._tools.mem_tracker.MemTracker`` (FSDP2 cases:
``fully_shard`` over a fake process group and ``FSDPMemTracker``), and reads, in the second
step: parameters, gradients after the last backward, optimizer state after the step,
activations (what the last forward added, loss included) and the peak. The simulator
estimates the same run with ``simulator.engine.memory_fit.estimate_stage_memory`` under the
"pytorch" (single device) or "fsdp2" framework conventions.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator

from simulator.engine.memory_fit import estimate_stage_memory
from simulator.errors import ComplexityError
from simulator.memory.accounting import StageMemory
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.workload.spec import MLP, MoESpec, TransformerSpec

MICROBATCHES = 2        # per step: gradients are alive during the second
STEPS = 2               # the first step creates the optimizer state; the second is measured

# (part, tolerance): the done-when bounds (issue 10)
TOLERANCE = {"params": 0.01, "grads": 0.01, "optimizer": 0.01, "activations": 0.10,
             "peak": 0.05}


@dataclass(frozen=True)
class MemCase:
    """One configuration: a model and how it is trained."""

    name: str
    spec: TransformerSpec
    dtype: str = "bf16"           # parameters and activations (FSDP: compute dtype)
    flash: bool = True            # fused SDPA kernel, else the unfused core attention
    micro_batch: int = 1
    checkpoint: bool = False      # torch.utils.checkpoint around every block
    dropout: float = 0.0
    fsdp_ranks: int = 0           # 0: one device; N: FSDP2 over N fake ranks

    @property
    def foreach(self) -> bool:
        """AdamW's foreach step (torch's GPU default) on one device. FSDP cases step per
        parameter: FSDPMemTracker counts foreach temporaries on DTensors at their global
        size (torch 2.13, fake process group: 3 x the unsharded parameters at the step,
        an accounting artifact), so they would measure the tracker, not the run."""
        return not self.fsdp_ranks


@dataclass(frozen=True)
class MemMeasure:
    """Bytes per rank from the tracker (``peak_parts``: categories at the peak)."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    peak_bytes: float
    peak_parts: dict[str, float]
    wall_s: float


def _spec(name: str, mlp: MLP, heads: int, kv: int, ffn: int, seq: int, vocab: int,
          moe: MoESpec | None = None, layers: int = 2) -> TransformerSpec:
    return TransformerSpec(name, n_layers=layers, hidden=1024, ffn_hidden=ffn, n_heads=heads,
                           n_kv_heads=kv, vocab=vocab, seq_len=seq, mlp=mlp, moe=moe,
                           source="validate-memory test decoder")


GQA = _spec("gqa-swiglu", MLP.SWIGLU, 16, 4, 2816, 2048, 32000)
MHA = _spec("mha-gelu", MLP.GELU, 16, 16, 4096, 2048, 8192)
LONG = _spec("gqa-swiglu-4k", MLP.SWIGLU, 16, 4, 2816, 4096, 8192)
SHORT = _spec("gqa-swiglu-256", MLP.SWIGLU, 16, 4, 2816, 256, 32000)
MOE = _spec("moe-8x2", MLP.SWIGLU, 16, 4, 2816, 2048, 8192,
            moe=MoESpec(experts=8, top_k=2, expert_ffn_hidden=1408, dense_layers=1))

CASES = (
    MemCase("bf16-flash-gqa-swiglu-mb1", GQA),
    MemCase("bf16-flash-gqa-swiglu-mb4", GQA, micro_batch=4),
    MemCase("fp32-flash-mha-gelu-mb2", MHA, dtype="fp32", micro_batch=2),
    MemCase("bf16-materialized-mha-gelu-dropout-mb1", MHA, flash=False, dropout=0.1),
    MemCase("fp32-materialized-mha-gelu-mb1", MHA, dtype="fp32", flash=False),
    MemCase("bf16-flash-gqa-swiglu-ckpt-mb2", LONG, micro_batch=2, checkpoint=True),
    MemCase("fp32-materialized-mha-gelu-ckpt-mb1", MHA, dtype="fp32", flash=False,
            checkpoint=True),
    MemCase("bf16-flash-moe-mb1", MOE),
    MemCase("bf16-flash-gqa-swiglu-seq256-mb1", SHORT),
    MemCase("fsdp2x8-bf16-flash-gqa-swiglu-mb2", LONG, micro_batch=2, fsdp_ranks=8),
    MemCase("fsdp2x8-bf16-flash-moe-ckpt-mb1", MOE, checkpoint=True, fsdp_ranks=8),
)
QUICK = ("bf16-flash-gqa-swiglu-mb1", "fp32-materialized-mha-gelu-mb1",
         "fsdp2x8-bf16-flash-gqa-swiglu-mb2")


# ---- the simulator's side -----------------------------------------------------------------
def case_plan(case: MemCase) -> Plan:
    """The plan the simulator estimates for ``case`` (framework conventions included)."""
    ranks = max(1, case.fsdp_ranks)
    plan = Plan(dp=ranks, micro_batch=case.micro_batch,
                global_batch=case.micro_batch * MICROBATCHES * ranks, precision=case.dtype,
                attention="flash" if case.flash else "materialized",
                recompute="full" if case.checkpoint else "none")
    fw = "fsdp2" if case.fsdp_ranks else "pytorch"
    plan = with_framework(plan, fw, keep={"attention", "sequence_parallel"})
    temp = plan.memory.optimizer_step_temp_bytes_per_param if case.foreach else 0.0
    return replace(plan, memory=replace(plan.memory, dropout=case.dropout > 0,
                                        optimizer_step_temp_bytes_per_param=temp))


def estimate(case: MemCase) -> StageMemory:
    return estimate_stage_memory(case.spec, case_plan(case))[0]


# ---- the tracker's side -------------------------------------------------------------------
def _cat(snapshot: dict, *names: str) -> float:
    """Bytes of the named categories in one device's snapshot (keys are enums or strings)."""
    by = {getattr(k, "value", k): v for k, v in snapshot.items()}
    return float(sum(by.get(n, 0) for n in names))


def _device_snapshot(tracker: Any, kind: str) -> dict:
    snaps = tracker.get_tracker_snapshot(kind)
    return next(iter(snaps.values())) if snaps else {}


def _train(tracker: Any, model: Any, opt: Any, batch: tuple) -> dict[str, float]:
    """Two steps of ``MICROBATCHES`` micro-batches under ``tracker``; what step 2 shows."""
    ids, labels = batch
    seen: dict[str, float] = {}
    for step in range(STEPS):
        for mb in range(MICROBATCHES):
            tracker.reset_mod_stats()           # per-module stats allow one call per reset
            before = _device_snapshot(tracker, "current")
            loss = model(ids, labels)
            after = _device_snapshot(tracker, "current")
            loss.backward()
            if step == STEPS - 1 and mb == MICROBATCHES - 1:
                seen["act"] = _cat(after, "Activation") - _cat(before, "Activation")
                seen["grads"] = _cat(_device_snapshot(tracker, "current"), "Gradient",
                                     "Sharded Grad")
        opt.step()
        opt.zero_grad()
    cur = _device_snapshot(tracker, "current")
    seen["params"] = _cat(cur, "Parameter", "Sharded Param")
    seen["opt"] = _cat(cur, "Optstate", "OptState")
    return seen


def _batch(case: MemCase) -> tuple:
    import torch
    shape = (case.micro_batch, case.spec.seq_len)
    return (torch.randint(0, case.spec.vocab, shape), torch.randint(0, case.spec.vocab, shape))


def _run_single(case: MemCase) -> tuple[dict[str, float], Any]:
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from .memcheck_model import build_decoder
    dtype = torch.float32 if case.dtype == "fp32" else torch.bfloat16
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)             # Module.to(dtype) fails under FakeTensorMode
    try:
        model = build_decoder(case.spec, case.flash, case.dropout, case.checkpoint)
    finally:
        torch.set_default_dtype(prev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=case.foreach)
    batch = _batch(case)
    tracker = MemTracker()
    tracker.track_external(model, opt, *batch)
    with tracker:                              # entered inside FakeTensorMode (else: empty)
        seen = _train(tracker, model, opt, batch)
    return seen, tracker


@contextmanager
def _fake_group(world: int) -> Iterator[Any]:
    """A device mesh over a fake ``world``-rank process group (nothing is communicated),
    torn down afterwards unless the caller had one already."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    mine = not dist.is_initialized()
    if mine:
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    elif dist.get_world_size() != world:
        raise ComplexityError(f"a {dist.get_world_size()}-rank process group is already "
                              f"initialized; the FSDP case needs {world} fake ranks")
    try:
        yield init_device_mesh("cpu", (world,))
    finally:
        if mine:
            dist.destroy_process_group()


def _run_fsdp(case: MemCase, mesh: Any) -> tuple[dict[str, float], Any]:
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from .memcheck_model import build_decoder
    with torch.device("meta"):
        model = build_decoder(case.spec, case.flash, case.dropout, case.checkpoint)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.layers:
        fully_shard(blk, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device="cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=case.foreach)
    batch = _batch(case)
    tracker = FSDPMemTracker(model, opt)
    tracker.track_inputs(batch)
    with tracker:
        seen = _train(tracker, model, opt, batch)
    return seen, tracker


def measure(case: MemCase) -> MemMeasure:
    """Run ``case`` under the tracker (torch imported here)."""
    import time

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    t0 = time.perf_counter()
    torch.manual_seed(0)
    if case.fsdp_ranks:
        with _fake_group(case.fsdp_ranks) as mesh, FakeTensorMode():
            seen, tracker = _run_fsdp(case, mesh)
    else:
        with FakeTensorMode():
            seen, tracker = _run_single(case)
    peak = _device_snapshot(tracker, "peak")
    parts = {getattr(k, "value", k): float(v) for k, v in peak.items() if v}
    return MemMeasure(seen["params"], seen["grads"], seen["opt"], seen["act"],
                      _cat(peak, "Total"), parts, time.perf_counter() - t0)
