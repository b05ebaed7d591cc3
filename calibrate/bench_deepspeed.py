"""Host cost of DeepSpeed's ZeRO engine hooks, measured on this CPU
(``python -m calibrate.bench_framework --only deepspeed_zero1_grad_hooks,
deepspeed_zero2_grad_hooks,deepspeed_zero3_hooks``).

The probe decoder of ``calibrate.bench_host`` (``calibrate.torch_model.build_model``, hidden
32, 8 tokens) is wrapped by ``deepspeed.initialize`` at ZeRO stage 1, 2 and 3 (fp32: the
engine runs the same Python in bf16, the ``deepspeed`` framework's usual dtype, but on this
CPU bf16 GEMMs are not nearly free and only add noise, ``BF16``; ``overlap_comm`` off; a
client ``torch.optim.AdamW``, never stepped) on the fake 2-rank process group the other
wrappers' benches use (every collective is a no-op: what is timed is the engine's Python and
its ops), and timed interleaved, forward (``engine(tokens, targets)``) and backward
(``engine.backward(loss)``), against the same model bare and against the host probe, so the
difference is in eager ops of the same host and load. With 1 and 5 layers, and with blocks
of 6 (fused qkv and up projections) and 9 (one Linear per projection) parameter tensors, the
extra per layer is charged per parameter tensor (pooled over both shapes; the slope and the
per-layer intercept through the two shapes are stored as a check that a layer's paramless
module adds little); what the 1-layer model costs beyond its tensors' is the engine's
per-micro-batch constant. Every backward is a gradient-accumulation boundary
(``gradient_accumulation_steps`` 1); ZeRO-1 is also timed off the boundary (2 steps, never
stepped), where its hooks only count the gradients.

ZeRO-3 runs with the sizes HF Trainer's ``"auto"`` derives from the hidden size (``hidden^2``
reduce bucket, ``0.9 hidden^2`` prefetch bucket, ``10 hidden`` persistence threshold) so that,
as in a real model, the Linear weights are partitioned and gathered and the norms persist
(DeepSpeed's absolute defaults would keep every tensor of this tiny model whole). Its
module hooks are timed with ``memory_efficient_linear`` off; the memory-efficient linear
that replaces ``F.linear`` by default is timed alone, per call, against torch's, and the
default engine's whole layer is stored as a check. DeepSpeed is not a dependency of this
project: ``pip install deepspeed``; without it the bench is skipped with a message.

ZeRO-3 under full recompute (``STAGE3_RECOMPUTE``, ``python -m calibrate.bench_framework
--only deepspeed_zero3_recompute``): the same ZeRO-3 engine (memory_efficient_linear off)
with every layer checkpointed as transformers 5.x's ``gradient_checkpointing_enable()`` does
(``checkpoint_layers``), against the bare model under the same checkpointing, and against
ZeRO-3 without recompute timed alongside: when backward unpacks a layer's first saved
tensor, torch re-runs the layer's ``forward`` inside the backward graph task, and the
pre-forward (fetch) and post-forward (release) hooks of the layer's submodules fire again
(zero/parameter_offload.py ``_pre_forward_module_hook``, ``_post_forward_module_hook``).
``collectives_per_layer`` counts what the fake group is asked for meanwhile.

ZeRO-3 re-gathering in backward (``STAGE3_REGATHER``, ``python -m calibrate.bench_framework
--only deepspeed_zero3_regather``): the same ZeRO-3 engine (memory_efficient_linear off) with
``stage3_max_live_parameters`` and ``stage3_max_reuse_distance`` 0 (``REGATHER``), against
the bare model and against ZeRO-3 as timed above: this tiny model is far below DeepSpeed's
1e9 defaults, so there every partitioned parameter stays gathered from its forward use to
its backward use, where a model larger than those limits releases it after forward and
fetches it again in backward. DeepSpeed 0.19.8, runtime/zero/partitioned_param_coordinator.py:
``__params_to_release`` (634-664) keeps a module's parameters whenever they are used again
within ``max_reuse_distance`` numel of the trace (655-662: 0 ends the scan before the first
module) or when the prefetcher marked a later use as skipped (649-651); the prefetcher scans
at most ``max_live_parameters`` minus the gathered numel (453: 0 stops it, so it marks
nothing). With both 0 every partitioned tensor is released after its forward use and
all-gathered again in its backward (``collectives_per_layer``: per layer 4 / 7 all-gathers in
backward, none before); the forward's all-gathers are unchanged.
"""
from __future__ import annotations

import os

from .bench_host import HOST_LAYERS, loss_backward, probe_spec

STAGES = (1, 2, 3)
BLOCKS = (False, True)                  # build_model(split=...): 6 / 9 tensors per layer
STAGE1_ACCUMULATING = "1acc"            # ZeRO-1 off the accumulation boundary
STAGE3_PLAIN_LINEAR = "3plain"          # ZeRO-3 with memory_efficient_linear off
STAGE3_RECOMPUTE = "3rc"                # the same, every layer checkpointed (full recompute)
BARE_RECOMPUTE = "bare_rc"              # the bare model, every layer checkpointed
STAGE3_REGATHER = "3rg"                 # 3plain, parameters released after forward
KINDS = STAGES + (STAGE1_ACCUMULATING, STAGE3_PLAIN_LINEAR, STAGE3_RECOMPUTE, STAGE3_REGATHER)
REGATHER = {"stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0}
PLAIN_LINEAR = (STAGE3_PLAIN_LINEAR, STAGE3_RECOMPUTE, STAGE3_REGATHER)
BF16 = False                            # True: the engines in bf16, the bare model cast to it


def available() -> str:
    """'' when DeepSpeed imports (on its CPU accelerator), else why not."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        import deepspeed  # noqa: F401
    except Exception as exc:                     # ImportError, or its accelerator failing
        return f"deepspeed not importable ({type(exc).__name__}: {exc})"
    return ""


def version() -> str:
    import deepspeed
    return deepspeed.__version__


def config(kind: int | str, hidden: int) -> dict:
    """The DeepSpeed config of one case ``kind``: a ZeRO stage, ``STAGE1_ACCUMULATING``
    (stage 1, 2 accumulation steps), ``STAGE3_PLAIN_LINEAR`` (stage 3 without
    ``memory_efficient_linear``), ``STAGE3_RECOMPUTE`` (the same config; the model's
    layers checkpointed) or ``STAGE3_REGATHER`` (the same, with ``REGATHER``'s limits);
    ``BF16``, no overlap, ZeRO-3 sizes as HF's "auto" at ``hidden``."""
    stage = 1 if kind == STAGE1_ACCUMULATING else 3 if kind in PLAIN_LINEAR else kind
    zero: dict = {"stage": stage, "overlap_comm": False}
    if stage == 3:
        zero.update(reduce_bucket_size=hidden * hidden,
                    stage3_prefetch_bucket_size=int(0.9 * hidden * hidden),
                    stage3_param_persistence_threshold=10 * hidden,
                    memory_efficient_linear=kind not in PLAIN_LINEAR)
    if kind == STAGE3_REGATHER:
        zero.update(REGATHER)
    return {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": BF16},
            "gradient_accumulation_steps": 2 if kind == STAGE1_ACCUMULATING else 1,
            "zero_optimization": zero, "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False, "wall_clock_breakdown": False}


def _quiet() -> None:
    import logging
    import warnings

    from deepspeed.utils import logger
    logger.setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


def checkpoint_layers(model) -> None:
    """Full recompute of every layer of ``model`` as transformers 5.x applies it
    (``gradient_checkpointing_enable()``: modeling_layers.GradientCheckpointingLayer): the
    layer's ``forward``, not its ``__call__`` (so the layer module's own hooks stay outside),
    runs under torch's non-reentrant ``checkpoint`` (its default early stop on) in training
    with gradients on, and backward re-runs it."""
    from functools import partial

    import torch
    from torch.utils.checkpoint import checkpoint
    for blk in model.blocks:
        def forward(x, blk=blk, fwd=type(blk).forward):
            if blk.training and torch.is_grad_enabled():
                return checkpoint(partial(fwd, blk), x, use_reentrant=False)
            return fwd(blk, x)
        blk.forward = forward


def _case(layers: int, split: bool, kind: int | str | None, zero: dict | None = None):
    """(forward, backward) of the probe decoder of ``layers`` layers, bare (``kind`` None or
    ``BARE_RECOMPUTE``; in bf16 under ``BF16``) or wrapped by a DeepSpeed engine
    (``config(kind)``, its ``zero_optimization`` updated by ``zero``); its layers
    checkpointed (``checkpoint_layers``) for ``BARE_RECOMPUTE`` and ``STAGE3_RECOMPUTE``.
    ZeRO-3's engine replaces ``torch.nn.functional.linear`` process-wide with its
    memory-efficient autograd Function (``memory_efficient_linear``, on by default;
    zero/partition_parameters.py _enable_mem_efficient_linear): put back here, and swapped
    in around this engine's forward only, so that the bare models and the probe keep
    torch's."""
    import torch
    import torch.nn.functional as F

    from .torch_model import build_model, synthetic_batch
    spec = probe_spec(layers)
    model = build_model(spec, split=split)
    if kind in (BARE_RECOMPUTE, STAGE3_RECOMPUTE):
        checkpoint_layers(model)
    tokens, targets = synthetic_batch(spec, 1)
    if kind in (None, BARE_RECOMPUTE):
        model = model.to(torch.bfloat16 if BF16 else torch.float32)
        return (lambda: model(tokens, targets)), loss_backward(model)
    import deepspeed
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    own = F.linear
    cfg = config(kind, spec.hidden)
    cfg["zero_optimization"].update(zero or {})
    eng, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    linear, F.linear = F.linear, own

    def fwd():
        F.linear = linear
        try:
            return eng(tokens, targets)
        finally:
            F.linear = own
    return fwd, loss_backward(eng.module, eng.backward)


def _launcher_env() -> None:
    """What a launcher sets (rank 0 of the fake group); LOCAL_SIZE spares the CPU
    accelerator's device_count() a `numactl --hardware` subprocess per call (a GPU's is
    cached), 1 so that DeepSpeed's shared-memory allreduce does not wait for a peer."""
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_SIZE", "1")):
        os.environ.setdefault(k, v)
    _quiet()


def timed_kinds(kinds=KINDS) -> tuple:
    """The case kinds ``kinds`` need timed: ``STAGE3_RECOMPUTE`` also needs the bare model
    under the same checkpointing and ZeRO-3 without recompute, ``STAGE3_REGATHER`` ZeRO-3
    as timed without its limits."""
    extra = (STAGE3_PLAIN_LINEAR, BARE_RECOMPUTE) if STAGE3_RECOMPUTE in kinds else ()
    extra += (STAGE3_PLAIN_LINEAR,) if STAGE3_REGATHER in kinds else ()
    return tuple(kinds) + tuple(k for k in extra if k not in kinds)


def cases(kinds=KINDS) -> dict:
    """Timing cases for ``bench_host.time_interleaved``: (kind, split, layers) with kind
    ``bare`` or one of ``timed_kinds(kinds)``, for both block shapes and ``HOST_LAYERS``.
    Needs the fake process group up (``bench_framework._init_fake_pg``)."""
    _launcher_env()
    out = {}
    for split in BLOCKS:
        for n in HOST_LAYERS:
            out[("bare", split, n)] = _case(n, split, None)
            for kind in timed_kinds(kinds):
                out[(kind, split, n)] = _case(n, split, kind)
    return out


def tensors_per_layer(split: bool) -> int:
    return 9 if split else 6


def edge_tensors() -> int:
    """Parameter tensors outside the probe's layers as the simulator counts them
    (``cost.host.param_tensors`` of the embedding and head ops: embedding, final norm,
    logits), the same as the model's (untied)."""
    from simulator.cost.host import param_tensors
    from simulator.workload.ops import embedding_ops, head_ops

    from .bench_host import probe_shape
    spec = probe_spec(1)
    sh = probe_shape(spec)
    return param_tensors(embedding_ops(spec, sh) + head_ops(spec, sh))


def _extras(t: dict, kind: int | str, pas: int, bare: str = "bare") -> tuple[dict, dict]:
    """The case ``kind``'s microseconds over the bare model (cases ``bare``) in pass
    ``pas``, by (block shape, layers), and per layer (the difference between the two sizes)
    by block shape."""
    lo, hi = HOST_LAYERS
    ex = {(s, n): t[(kind, s, n)][pas] - t[(bare, s, n)][pas] for s in BLOCKS for n in (lo, hi)}
    return ex, {s: (ex[(s, hi)] - ex[(s, lo)]) / (hi - lo) for s in BLOCKS}


def split_costs(t: dict, stage: int | str, pas: int, bare: str = "bare") -> dict[str, float]:
    """Microseconds of ``stage``'s extra over the bare model in pass ``pas`` (0 forward, 1
    backward), from timings ``t`` keyed as ``cases``: per layer for each block shape
    (``layer6``, ``layer9``); per parameter tensor pooled over both shapes (``tensor``: the
    mechanisms' charge); the slope through the two shapes (``slope``) and the per-layer
    intercept (``layer``: a layer's hooks beside its tensors', the paramless block module's
    under ZeRO-3); ``rest``: the 1-layer model's extra beyond its tensors' (its layer's and
    the ``edge_tensors`` outside the layers) at the pooled rate, averaged over the two
    shapes: the engine's per-micro-batch constant. ``bare``: the bare cases' kind."""
    lo, _ = HOST_LAYERS
    ex, per = _extras(t, stage, pas, bare)
    k = {s: tensors_per_layer(s) for s in BLOCKS}
    slope = (per[True] - per[False]) / (k[True] - k[False])
    tensor = sum(per.values()) / sum(k.values())
    rest = sum(ex[(s, lo)] - (lo * k[s] + edge_tensors()) * tensor for s in BLOCKS) / len(BLOCKS)
    return {"layer6": per[False], "layer9": per[True], "tensor": tensor, "slope": slope,
            "layer": per[False] - k[False] * slope, "rest": rest}


def linear_wrapper_costs(t: dict, pas: int) -> dict[str, float]:
    """ZeRO-3 in pass ``pas``, microseconds: per layer for each block shape (``layer6``,
    ``layer9``), its memory-efficient linear's extra per call over torch's ``F.linear``
    (``call``: the ``linear_cases``, keyed ``("linear", ...)``), and the 1-layer model's extra beyond its
    tensors' hooks (``split_costs`` of ``STAGE3_PLAIN_LINEAR``) and its layer's Linear
    calls (``rest``: the engine's per-micro-batch constant, the logits' call in it),
    averaged over the two shapes."""
    lo, _ = HOST_LAYERS
    plain = split_costs(t, STAGE3_PLAIN_LINEAR, pas)["tensor"]
    ex, per = _extras(t, 3, pas)
    call = t[("linear", "zero3")][pas] - t[("linear", "torch")][pas]
    rest = sum(ex[(s, lo)] - (lo * tensors_per_layer(s) + edge_tensors()) * plain
               - lo * linears_per_layer(s) * call for s in BLOCKS) / len(BLOCKS)
    return {"layer6": per[False], "layer9": per[True], "call": call, "rest": rest}


def linear_cases() -> dict:
    """(forward, backward) of one Linear call on the probe's shapes (fp32: on this CPU bf16
    GEMMs are not nearly free, and the wrapper's Python does not depend on the dtype),
    through torch's
    ``F.linear`` and through ZeRO-3's ``zero3_linear_wrap`` (deepspeed/runtime/zero/linear.py:
    ``LinearFunctionForZeroStage3``, an autograd Function with autocast bookkeeping). Timed
    apart from the engines: interleaved with them, a tiny case runs from cold caches."""
    import torch
    import torch.nn.functional as F
    from deepspeed.runtime.zero.linear import zero3_linear_wrap

    from .bench_host import HOST_SHAPE
    h = HOST_SHAPE["hidden"]
    w = torch.randn(h, h, requires_grad=True)
    x = torch.randn(1, HOST_SHAPE["seq_len"], h, requires_grad=True)
    grad = torch.ones_like(x)

    def bwd(out):
        out.backward(grad)
        w.grad = x.grad = None
    return {("linear", "torch"): ((lambda: F.linear(x, w)), bwd),
            ("linear", "zero3"): ((lambda: zero3_linear_wrap(x, w)), bwd)}


def linears_per_layer(split: bool) -> int:
    return 7 if split else 4


OVER = ("layer6", "layer9", "tensor", "slope", "rest")


def recompute_costs(t: dict, pas: int) -> dict[str, float]:
    """ZeRO-3 (memory_efficient_linear off) with every layer checkpointed, in pass ``pas``,
    microseconds: its extra over the bare model under the same checkpointing
    (``split_costs`` against ``BARE_RECOMPUTE``) and, ``over_*``, the part of it beyond
    ZeRO-3's extra without recompute (``STAGE3_PLAIN_LINEAR``'s): what recompute adds to
    the engine's hooks, per layer of 6 / 9 tensors, per tensor of a recomputed layer
    (pooled), the slope and the per-micro-batch rest (the 1-layer model's beyond its
    layer's tensors: the ``edge_tensors`` are not recomputed)."""
    rc = split_costs(t, STAGE3_RECOMPUTE, pas, BARE_RECOMPUTE)
    plain = split_costs(t, STAGE3_PLAIN_LINEAR, pas)
    over = {f"over_{k}": rc[k] - plain[k] for k in OVER}
    over["over_rest"] += edge_tensors() * over["over_tensor"]
    return {**rc, **over}


def regather_costs(t: dict, pas: int) -> dict[str, float]:
    """ZeRO-3 (memory_efficient_linear off) releasing every partitioned parameter after
    forward and gathering it again in backward (``STAGE3_REGATHER``), in pass ``pas``,
    microseconds: its ``split_costs`` over the bare model and, ``over_*``, the part beyond
    ZeRO-3 keeping them gathered (``STAGE3_PLAIN_LINEAR``'s): per layer of 6 / 9 tensors,
    per tensor (pooled), the slope and the per-micro-batch rest (the ``edge_tensors`` are
    released and gathered again too, so each rest is left at its own pooled rate)."""
    rg = split_costs(t, STAGE3_REGATHER, pas)
    plain = split_costs(t, STAGE3_PLAIN_LINEAR, pas)
    return {**rg, **{f"over_{k}": rg[k] - plain[k] for k in OVER}}


RECOMPUTE_MECHANISM = "deepspeed_zero3_recompute"
REGATHER_MECHANISM = "deepspeed_zero3_regather"
MECHANISMS = {1: "deepspeed_zero1_grad_hooks", STAGE1_ACCUMULATING: "deepspeed_zero1_grad_hooks",
              2: "deepspeed_zero2_grad_hooks", 3: "deepspeed_zero3_hooks",
              STAGE3_PLAIN_LINEAR: "deepspeed_zero3_hooks", STAGE3_RECOMPUTE: RECOMPUTE_MECHANISM,
              STAGE3_REGATHER: REGATHER_MECHANISM}
TAGS = {STAGE1_ACCUMULATING: "ZeRO-1 off the accumulation boundary",
        STAGE3_PLAIN_LINEAR: "ZeRO-3 without memory_efficient_linear",
        STAGE3_RECOMPUTE: "ZeRO-3 under full recompute without memory_efficient_linear",
        STAGE3_REGATHER: "ZeRO-3 re-gathering in backward (max live parameters and reuse "
                         "distance 0) without memory_efficient_linear"}
BEYOND = "beyond ZeRO-3 without recompute"
BEYOND_REGATHER = "beyond ZeRO-3 keeping parameters gathered to backward"


def _kind_rows(t: dict, kind: int | str, pas: str, i: int) -> list[tuple[str, float]]:
    """(metric, us) rows of one case kind and pass: ZeRO-3's whole layer, its linear
    wrapper per call and its per-micro-batch rest; the others' ``split_costs``."""
    if kind == 3:
        c = linear_wrapper_costs(t, i)
        return [(f"per layer of 6 tensors, {pas}", c["layer6"]),
                (f"per layer of 9 tensors, {pas}", c["layer9"]),
                (f"memory-efficient linear, per Linear call, {pas}", c["call"]),
                (f"per micro-batch, rest, {pas}", c["rest"])]
    over = {STAGE3_RECOMPUTE: (recompute_costs, BEYOND,
                               "per parameter tensor of a recomputed layer"),
            STAGE3_REGATHER: (regather_costs, BEYOND_REGATHER, "per parameter tensor")}
    if kind in over:
        costs, beyond, per_tensor = over[kind]
        c = costs(t, i)
        return _split_rows(c, pas) + [
            (f"per layer of 6 tensors, {beyond}, {pas}", c["over_layer6"]),
            (f"per layer of 9 tensors, {beyond}, {pas}", c["over_layer9"]),
            (f"{per_tensor}, {beyond}, {pas}", c["over_tensor"]),
            (f"per parameter tensor, 6 vs 9 slope, {beyond}, {pas}", c["over_slope"]),
            (f"per micro-batch, rest, {beyond}, {pas}", c["over_rest"])]
    return _split_rows(split_costs(t, kind, i), pas)


def _split_rows(c: dict, pas: str) -> list[tuple[str, float]]:
    """(metric, us) rows of one ``split_costs`` result in pass ``pas``."""
    return [(f"per layer of 6 tensors, {pas}", c["layer6"]),
            (f"per layer of 9 tensors, {pas}", c["layer9"]),
            (f"per parameter tensor, {pas}", c["tensor"]),
            (f"per parameter tensor, 6 vs 9 slope, {pas}", c["slope"]),
            (f"per layer beside its tensors, {pas}", c["layer"]),
            (f"per micro-batch, rest, {pas}", c["rest"])]


def metric_rows(t: dict, kinds=KINDS) -> list[tuple[str, str, float]]:
    """(mechanism, metric, us) of the case ``kinds`` (``MECHANISMS``; ZeRO-3's need
    ``STAGE3_PLAIN_LINEAR``'s), forward and backward."""
    rows = []
    for kind in kinds:
        tag = TAGS.get(kind, f"ZeRO-{kind}")
        for pas, i in (("fwd", 0), ("bwd", 1)):
            rows += [(MECHANISMS[kind], f"{tag}, {m}", v) for m, v in _kind_rows(t, kind, pas, i)]
    return rows


COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "all_gather",
               "all_gather_coalesced", "all_gather_base", "reduce_scatter", "broadcast",
               "all_to_all_single")
NO_PREFETCH_NO_REUSE = {"stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}


def collective_counts(layers: int, split: bool, kind: int | str, zero: dict | None = None,
                      steps: int = 6) -> dict[tuple[str, str], tuple[int, int]]:
    """What DeepSpeed's communication backend (``deepspeed.comm.comm.cdb``, over the fake
    group, where nothing moves) is asked for in the last of ``steps`` micro-batches of the
    case ``kind`` (``_case``; the coordinator's trace is complete from the third):
    {(pass, collective): (calls, bytes of each call's largest tensor: the whole gathered
    or reduced tensor)}."""
    import torch
    from deepspeed.comm import comm
    fwd, bwd = _case(layers, split, kind, zero)
    cdb, seen, phase = comm.cdb, {}, [""]

    def counting(name, fn):
        def call(*a, **k):
            size = max((x.numel() * x.element_size() for x in (*a, *k.values())
                        if torch.is_tensor(x)), default=0)
            n, b = seen.get((phase[0], name), (0, 0))
            seen[(phase[0], name)] = (n + 1, b + size)
            return fn(*a, **k)
        return call
    own = {n: cdb.__dict__.get(n) for n in COLLECTIVES if hasattr(cdb, n)}
    for n in own:
        setattr(cdb, n, counting(n, getattr(cdb, n)))
    try:
        for _ in range(steps):
            seen.clear()
            phase[0] = "fwd"
            out = fwd()
            phase[0] = "bwd"
            bwd(out)
    finally:
        for n, f in own.items():
            setattr(cdb, n, f) if f is not None else delattr(cdb, n)
    return dict(seen)


def collectives_per_layer(split: bool, kind: int | str, zero: dict | None = None
                          ) -> dict[tuple[str, str], tuple[float, float]]:
    """``collective_counts`` per layer: the difference between the ``HOST_LAYERS`` models
    over the layers between them."""
    lo, hi = HOST_LAYERS
    a, b = (collective_counts(n, split, kind, zero) for n in (lo, hi))
    return {k: tuple((y - x) / (hi - lo) for x, y in zip(a.get(k, (0, 0)), b.get(k, (0, 0))))
            for k in set(a) | set(b)}


def recompute_collectives() -> str:
    """All-gathers and reduce-scatters per layer in backward, without and with recompute,
    at the timed settings and with ``NO_PREFETCH_NO_REUSE``, as text for the rows."""
    _launcher_env()
    parts = []
    for how, zero in (("as timed", None), ("with stage3_prefetch_bucket_size 0 and "
                                           "stage3_max_reuse_distance 0", NO_PREFETCH_NO_REUSE)):
        for op in ("all_gather_into_tensor", "reduce_scatter_tensor"):
            cells = []
            for kind in (STAGE3_PLAIN_LINEAR, STAGE3_RECOMPUTE):
                c = [collectives_per_layer(s, kind, zero).get(("bwd", op), (0, 0)) for s in BLOCKS]
                cells.append(" / ".join(f"{n:g} ({b / 1024:g} KiB)" for n, b in c))
            parts.append(f"{op} {how}: {cells[0]} without recompute, {cells[1]} with")
    return ("per layer of 6 / 9 tensors in backward, calls (bytes) to deepspeed.comm: "
            + "; ".join(parts))


def regather_collectives() -> str:
    """All-gathers per layer, forward and backward, of ZeRO-3 as timed and with
    ``REGATHER``'s limits (``collectives_per_layer``), as text for the rows."""
    _launcher_env()
    parts = []
    for pas in ("fwd", "bwd"):
        cells = []
        for kind in (STAGE3_PLAIN_LINEAR, STAGE3_REGATHER):
            c = [collectives_per_layer(s, kind).get((pas, "all_gather_into_tensor"), (0, 0))
                 for s in BLOCKS]
            cells.append(" / ".join(f"{n:g} ({b / 1024:g} KiB)" for n, b in c))
        parts.append(f"{pas} {cells[0]} keeping, {cells[1]} re-gathering")
    return ("all_gather_into_tensor per layer of 6 / 9 tensors, calls (bytes) to "
            "deepspeed.comm: " + "; ".join(parts))


def collective_notes(kinds) -> dict[str, str]:
    """The counted collectives' text of the mechanisms among ``kinds`` that store it."""
    notes = {}
    if STAGE3_RECOMPUTE in kinds:
        notes[RECOMPUTE_MECHANISM] = recompute_collectives()
    if STAGE3_REGATHER in kinds:
        notes[REGATHER_MECHANISM] = regather_collectives()
    return notes


def _regather_method(op: dict[str, float], pressure: float, note: str) -> str:
    lo, hi = HOST_LAYERS
    return (f"DeepSpeed {version()} ZeRO-3 engine (DS_ACCELERATOR=cpu, fake pg x2, "
            f"{'bf16' if BF16 else 'fp32'}, overlap_comm off, gradient_accumulation_steps 1, "
            "buckets and persistence as HF auto at hidden 32, memory_efficient_linear off, "
            "stage3_max_live_parameters 0 and stage3_max_reuse_distance 0: every partitioned "
            "parameter released after forward and all-gathered again in backward, "
            "partitioned_param_coordinator.py __params_to_release) - the bare model, "
            f"{lo} vs {hi} layers, blocks of 6 and 9 tensors; '{BEYOND_REGATHER}' = that - "
            "(ZeRO-3 without memory_efficient_linear at the 1e9 defaults - the bare model), "
            f"timed interleaved with the host probe (bwd op {op['bwd']:.2f} us, CPU pressure "
            f"{pressure:.2f}); {note}")


def method(op: dict[str, float], pressure: float, mechanism: str = "", note: str = "") -> str:
    """The CSV rows' method text, with the probe's backward cost and the CPU pressure
    (``mechanism`` ``RECOMPUTE_MECHANISM`` or ``REGATHER_MECHANISM``: its own, with
    ``note``)."""
    lo, hi = HOST_LAYERS
    if mechanism == REGATHER_MECHANISM:
        return _regather_method(op, pressure, note)
    if mechanism == RECOMPUTE_MECHANISM:
        return (f"DeepSpeed {version()} ZeRO-3 engine (DS_ACCELERATOR=cpu, fake pg x2, "
                f"{'bf16' if BF16 else 'fp32'}, overlap_comm off, gradient_accumulation_steps "
                "1, buckets and persistence as HF auto at hidden 32, memory_efficient_linear "
                "off), every layer's forward under torch.utils.checkpoint (use_reentrant=False,"
                " torch's early stop: transformers 5.x gradient_checkpointing_enable()) - the "
                f"bare model under the same checkpointing, {lo} vs {hi} layers, blocks of 6 "
                f"and 9 tensors; '{BEYOND}' = that - (ZeRO-3 without memory_efficient_linear "
                "- the bare model, both without checkpointing), timed interleaved with the "
                f"host probe (bwd op {op['bwd']:.2f} us, CPU pressure {pressure:.2f}); {note}")
    return (f"DeepSpeed {version()} engine (DS_ACCELERATOR=cpu, fake pg x2, "
            f"{'bf16' if BF16 else 'fp32'}, overlap_comm off, gradient_accumulation_steps 1 "
            "(ZeRO-1 off the boundary: 2, never stepped), ZeRO-3 buckets and persistence as HF "
            "auto at hidden 32, memory_efficient_linear on (default) and off) - bare model, "
            f"{lo} vs {hi} layers, blocks of 6 and 9 tensors, timed interleaved with the host "
            f"probe (bwd op {op['bwd']:.2f} us, CPU pressure {pressure:.2f}); ZeRO-3's "
            "zero3_linear_wrap - F.linear per call (fp32, 1x8x32 @ 32x32) timed alone with "
            "its own probe, rescaled to this one")
