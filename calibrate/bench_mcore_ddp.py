"""Host cost of Megatron-Core's DistributedDataParallel hooks and distributed optimizer step,
measured on this CPU (``calibrate.bench_framework --only mcore_ddp_hooks,mcore_dist_optimizer``).

What runs: megatron-core's ``GPTModel`` of the local spec (as ``calibrate.bench_mcore_host``
builds it: hidden 32, 16 tokens, rope, labels) in bf16 inside ``Float16Module`` (``--bf16``),
wrapped in ``megatron.core.distributed.DistributedDataParallel`` with the 2024 README runs'
flags (``DistributedDataParallelConfig(use_distributed_optimizer=True, overlap_grad_reduce=
True, overlap_param_gather=True, grad_reduce_in_fp32=True)``), with ``get_megatron_optimizer(
OptimizerConfig(optimizer='adam', bf16=True, use_distributed_optimizer=True, clip_grad=1.0))``,
on a fake 2-rank process group (data parallel 2: every bucket sharded over 2 ranks; the
collectives are calls into the fake backend). A timed step does what ``training.py``
``train_step`` and the no-pipelining schedule do: ``zero_grad_buffer()``, ``optimizer.
zero_grad()``, ``MICRO`` micro-batches (all but the last under ``no_sync()``),
``finalize_model_grads``, the optimizer step; every phase timed alone (thread CPU time), two
steps per round. Forward pre-hooks (on every module; in steady state they find nothing to
wait for): the middle micro-batch's forward with them off (``disable_forward_pre_hook(
param_sync=False)``) against the last one's with them on, in the same model, and their body
called alone. Per-parameter backward hooks (``main_grad.add_``; counting nothing under
``no_sync``): DDP's steady backward against the bare ``Float16Module(GPTModel)``'s.
Transformer Engine's gradient-accumulation fusion (its wgrad GEMM adds into ``main_grad`` and
sets ``grad_added_to_main_grad``; the hook skips ``main_grad.add_``): that flag set on the
linear weights for the middle micro-batch's backward. The first micro-batch (its pre-hooks
dispatch and wait for the parameter all-gathers): against the same forward with the gathers
done beforehand (the first of the two steps). The last backward (the hooks count gradients
ready and dispatch each full bucket's reduce-scatter): against a steady one. 1 vs 5 layers
give per-layer slopes; a bucket per layer (``bucket_size`` one layer's elements) per-bucket.

The optimizer step in ``ChainedOptimizer.step``'s pieces: ``prepare_grads``
(``_copy_model_grads_to_main_grads``), ``get_main_grads_for_grad_norm``,
``get_grad_norm_fp32`` (Megatron's CPU fallback ``local_multi_tensor_l2_norm``, a norm per
tensor, and a one-call stand-in for the GPU's ``multi_tensor_l2norm``),
``clip_grad_by_total_norm_fp32`` (no scaling: norm < 1), the inner ``step`` (on this CPU
``torch.optim.AdamW`` single-tensor; on a GPU TE's or apex's ``FusedAdam``),
``_copy_main_params_to_model_params``; one setup runs ``optimizer.step()`` whole as a check.
Fixed and per local parameter tensor (those the local rank's optimizer holds a shard of):
the least-squares line over 1, 5 and 17 layers, with and without linear biases.

CPU stand-ins (besides ``bench_mcore_host``'s): the Megatron modules that create tensors on
``device='cuda'`` get a copy of the ``torch`` namespace whose factories map that device to the
CPU; ``clip_grad_by_total_norm_fp32`` is recompiled with its ``'torch.cuda.FloatTensor'``
assertion reading ``'torch.FloatTensor'``; while the optimizer is built ``Tensor.type()``
answers CUDA type names. Megatron-Core is not a dependency: without it the cases are skipped.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import time

LAYERS = (1, 5)                  # per-layer slopes of the hooks
BIG = 17                         # a third size for the optimizer's per-tensor line
HIDDEN, TOKENS, VOCAB = 32, 16, 128
MICRO = 3                        # micro-batches per step: first, middle, last
CLIP = 1.0
LOSS_SCALE = 1e-3                # keeps the gradient norm below CLIP (no clip scaling)
TRIALS, REPEATS = 30, 3
HOOK_CALLS = 100                 # forward pre-hook body calls per timed phase
HOOKS, OPT = "mcore_ddp_hooks", "mcore_dist_optimizer"
OPT_PARTS = ("prepare_grads", "grads_for_norm", "grad_norm_cpu", "grad_norm_onecall", "clip",
             "inner_step", "copy_params")
STEP_PARTS = ("zero_grad_buffer", "zero_grad", "no_sync_enter", "no_sync_exit", "finalize")


def available() -> str:
    """'' when Megatron-Core imports, else why not."""
    from .bench_mcore_host import available as mc_available
    return mc_available()


# ---- CPU stand-ins ---------------------------------------------------------------------------
def torch_on_cpu():
    """A copy of the ``torch`` namespace whose tensor factories put ``device='cuda'`` on the
    CPU (every other name is torch's own object, looked up as fast as in torch)."""
    import types

    import torch
    ns = types.ModuleType("torch_on_cpu")
    ns.__dict__.update(torch.__dict__)
    def on_cpu(factory):
        def made(*a, **k):
            if isinstance(k.get("device"), str) and k["device"].startswith("cuda"):
                k["device"] = "cpu"
            return factory(*a, **k)
        return made
    for name in ("tensor", "zeros", "empty", "ones", "full"):
        setattr(ns, name, on_cpu(getattr(torch, name)))
    return ns


@functools.cache
def _shims() -> None:
    """``bench_mcore_host``'s stand-ins, the parallel state on the fake group, and the CPU
    namespace and clip assertion above (once per process)."""
    import megatron.core.optimizer.clip_grads as cg
    import megatron.core.optimizer.distrib_optimizer as do
    import megatron.core.optimizer.optimizer as oo
    import megatron.core.utils as mu
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from . import bench_mcore_host as mc
    if not dist.is_initialized():         # as calibrate.bench_framework._init_fake_pg
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    mc._cpu_shims()
    mc._init_parallel()
    cpu = torch_on_cpu()
    for m in (cg, oo, do, mu):
        m.torch = cpu
    oo.clip_grad_by_total_norm_fp32 = mc.recompiled(cg, "clip_grad_by_total_norm_fp32",
                                                    "'torch.cuda.FloatTensor'",
                                                    "'torch.FloatTensor'")


@contextlib.contextmanager
def cuda_type_names():
    """``Tensor.type()`` answers 'torch.cuda.<X>Tensor' (the optimizer's constructor checks)."""
    import torch
    own = torch.Tensor.type

    def typed(self, *a, **k):
        s = own(self, *a, **k)
        return s.replace("torch.", "torch.cuda.", 1) if not a and not k else s
    torch.Tensor.type = typed
    try:
        yield
    finally:
        torch.Tensor.type = own


# ---- the model, the wrapper, the optimizer ---------------------------------------------------
def _model(layers: int, bias: bool):
    """``Float16Module(GPTModel)`` of the local spec in bf16, and its config."""
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig
    _shims()
    cfg = TransformerConfig(num_layers=layers, hidden_size=HIDDEN, num_attention_heads=4,
                            use_cpu_initialization=True, add_bias_linear=bias, bf16=True,
                            params_dtype=torch.bfloat16, hidden_dropout=0.0,
                            attention_dropout=0.0)
    torch.manual_seed(0)
    gpt = GPTModel(cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                   max_sequence_length=TOKENS, position_embedding_type="rope")
    return Float16Module(cfg, gpt), cfg


def _wrapped(layers: int, bias: bool, bucket: int | None = None):
    """(DDP model, optimizer, config) with the README runs' flags; ``bucket``: its
    ``bucket_size`` in elements (default: Megatron's, one bucket here)."""
    from megatron.core.distributed import DistributedDataParallel as DDP
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    model, cfg = _model(layers, bias)
    ddp_cfg = DistributedDataParallelConfig(
        use_distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True,
        grad_reduce_in_fp32=True, bucket_size=bucket)
    ddp = DDP(cfg, ddp_cfg, model)
    with cuda_type_names():
        opt = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", bf16=True, use_distributed_optimizer=True,
                            clip_grad=CLIP, lr=1e-4), [ddp], use_gloo_process_groups=False)
    return ddp, opt, cfg


def local_counts(ddp) -> list[int]:
    """Per data-parallel rank, the parameter tensors whose range in a bucket meets that rank's
    shard of the bucket: the tensors its DistributedOptimizer steps (distrib_optimizer.py
    ``_build_model_gbuf_range``: shard r = [r S, (r + 1) S) of each bucket, S = the padded
    bucket size / dp; ``_build_model_gbuf_param_range_map``: a tensor counts where its
    [start, end) overlaps the shard)."""
    out: list[int] = []
    for buf in ddp.buffers:
        dp = buf.data_parallel_world_size
        out = out or [0] * dp
        for bucket in buf.buckets:
            size = bucket.grad_data.numel() // dp
            for r in range(dp):
                lo, hi = bucket.offset + r * size, bucket.offset + (r + 1) * size
                out[r] += sum(1 for s, e, _ in buf.param_index_map.values() if s < hi and e > lo)
    return out


def counts(ddp, opt) -> dict[str, int]:
    """Parameter tensors of the model and per layer, the local rank's (those its optimizer
    holds a shard of), modules per layer (each gets a forward pre-hook), bucket groups."""
    inner = opt.chained_optimizers[0]
    layer = ddp.module.module.decoder.layers[0]
    return {"model_tensors": sum(1 for _ in ddp.module.parameters()),
            "local_tensors": sum(len(g) for g in inner.model_float16_groups
                                 + inner.model_fp32_groups),
            "layer_tensors": sum(1 for _ in layer.parameters()),
            "layer_modules": sum(1 for _ in layer.modules()),
            "model_modules": sum(1 for _ in ddp.module.modules()),
            "buckets": len(ddp.bucket_groups), "local_per_rank": local_counts(ddp)}


def _batch():
    import torch
    ids = torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(0))
    mask = torch.triu(torch.ones(TOKENS, TOKENS), diagonal=1).bool()[None, None]
    return ids, torch.arange(TOKENS)[None], mask


def _fwd_bwd(model, params, batch=None):
    """(forward, backward) of one micro-batch of ``model`` (of ``batch``: ids, positions,
    mask; default ``_batch()``): the forward to the summed loss, held for the backward, which
    then drops every ``.grad`` (a DDP hook has dropped them)."""
    ids, pos, mask = batch or _batch()
    held = {}

    def fwd():
        held["loss"] = model(ids, pos, mask, labels=ids).sum() * LOSS_SCALE

    def bwd():
        held.pop("loss").backward()
        for p in params:
            p.grad = None
    return fwd, bwd


def bare_phases(layers: int, bias: bool) -> list[tuple[str, object]]:
    """The bare ``Float16Module(GPTModel)``: two steps of ``MICRO`` micro-batches, named as
    ``ddp_phases`` names them (the same positions in the step)."""
    model, _ = _model(layers, bias)
    fwd, bwd = _fwd_bwd(model, list(model.parameters()))
    return [(f"{pas}{k}", fn) for _ in range(2) for k in range(MICRO)
            for pas, fn in (("fwd", fwd), ("bwd", bwd))]


def _opt_parts(opt) -> list[tuple[str, object]]:
    """``ChainedOptimizer.step`` of one optimizer, in its pieces (same calls, same order)."""
    import megatron.core.optimizer.clip_grads as cg
    inner, held = opt.chained_optimizers[0], {}
    cpu_l2 = cg.l2_norm_impl

    def onecall_l2(chunk, flag, lists, per_tensor):     # one kernel call, like the GPU's
        return lists[0][0].new_zeros(1, dtype=lists[0][0].dtype), None

    def norm(impl):
        def run():
            cg.l2_norm_impl = impl
            try:
                held["norm"] = cg.get_grad_norm_fp32(
                    held["grads"], grad_stats_parallel_group=inner.get_grad_stats_parallel_group())
            finally:
                cg.l2_norm_impl = cpu_l2
        return run
    return [("prepare_grads", opt.prepare_grads),
            ("grads_for_norm", lambda: held.update(grads=inner.get_main_grads_for_grad_norm())),
            ("grad_norm_onecall", norm(onecall_l2)), ("grad_norm_cpu", norm(cpu_l2)),
            ("clip", lambda: cg.clip_grad_by_total_norm_fp32(
                inner.get_parameters(), CLIP, held["norm"], False)),
            ("inner_step", inner.optimizer.step),
            ("copy_params", inner._copy_main_params_to_model_params)]


def ddp_phases(layers: int, bias: bool, whole: bool = False,
               bucket: int | None = None) -> tuple[list, dict]:
    """(phases of two training steps, ``counts``) of the DDP model and its optimizer
    (``whole``: ``optimizer.step()`` in one call). In each step the middle micro-batch runs
    its forward with the forward pre-hooks off (``disable_forward_pre_hook(param_sync=False)``,
    on again after) and its backward with the linear weights' ``grad_added_to_main_grad`` set
    (Transformer Engine's gradient-accumulation fusion: the hook skips their
    ``main_grad.add_``); the first step's parameter all-gathers are dispatched and waited for
    before its first forward (``fwd0_gathered``: a steady forward in the first place). Names
    starting '_' run untimed."""
    from megatron.core.distributed import finalize_model_grads
    ddp, opt, _ = _wrapped(layers, bias, bucket)
    linear = [p for n, p in ddp.module.named_parameters()
              if n.endswith("weight") and ("linear_" in n or "output_layer" in n)]
    fwd, bwd = _fwd_bwd(ddp, list(ddp.module.parameters()))
    ctx = {}

    def enter():
        ctx["cm"] = ddp.no_sync()
        ctx["cm"].__enter__()

    def gather():
        for g in ddp.bucket_groups:
            g.start_param_sync()
            g.param_gather_handle.wait()
            g.param_gather_handle = None

    def fuse(flag):
        def run():
            for p in linear:
                p.grad_added_to_main_grad = flag
        return run
    tail = [("finalize", lambda: finalize_model_grads([ddp]))] + (
        [("step", opt.step)] if whole else _opt_parts(opt))

    def step(gathered: bool):
        return ([("zero_grad_buffer", ddp.zero_grad_buffer), ("zero_grad", opt.zero_grad),
                 ("no_sync_enter", enter)] + ([("_gather", gather)] if gathered else [])
                + [("fwd0_gathered" if gathered else "fwd0", fwd), ("bwd0", bwd),
                   ("_hooks_off", lambda: ddp.disable_forward_pre_hook(param_sync=False)),
                   ("fwd1", fwd), ("_fuse", fuse(True)), ("bwd1", bwd),
                   ("_hooks_on", ddp.enable_forward_pre_hook), ("_unfuse", fuse(False)),
                   ("no_sync_exit", lambda: ctx.pop("cm").__exit__(None, None, None)),
                   ("fwd2", fwd), ("bwd2", bwd)] + tail)
    return step(True) + step(False), {**counts(ddp, opt), "fused_linear_weights": len(linear)}


def hook_body_phases(calls: int = 100) -> list[tuple[str, object]]:
    """The DDP forward pre-hook's body alone (``_make_forward_pre_hook``), ``calls`` times on
    a module without parameters (``pre_hook_0``) and on a LayerNorm (2 tensors)."""
    ddp, _, _ = _wrapped(1, False)
    hook, layer = ddp._make_forward_pre_hook(), ddp.module.module.decoder.layers[0]

    def run(module):
        def go():
            for _ in range(calls):
                hook(module)
        return go
    return [("pre_hook_0", run(layer.self_attention)), ("pre_hook_2", run(layer.input_layernorm))]


def _probe_phases(layers: int) -> list[tuple[str, object]]:
    from .bench_host import _decoder_fns
    fwd, bwd, _ = _decoder_fns(layers)
    held = {}
    return [("fwd", lambda: held.update(y=fwd())), ("bwd", lambda: bwd(held.pop("y")))]


# ---- timing ----------------------------------------------------------------------------------
def time_phases(setups: dict, trials: int = TRIALS, repeats: int = REPEATS, warm: int = 0
                ) -> tuple[dict, float]:
    """{setup: {phase: us}}: each setup's phases run in order, ``repeats`` times per trial,
    every timed phase on the calling thread's CPU clock (``time.thread_time``); setups
    interleaved trial by trial so that other load hits them alike; per phase the 10th
    percentile over trials of the per-trial mean over its runs (as ``bench_dp._low_us``).
    Also the CPU pressure of the run. Three untimed warm-up rounds first (the first step
    records the buckets' gradient-ready counts, ``_ParamAndGradBucketGroup.reset``);
    ``warm``: untimed rounds of the setup before its timed ones in every trial, so that each
    timed phase follows the same setup's own work, not another setup's."""
    from .store import PressureMeter, stats_of
    for phases in setups.values():
        for _ in range(3):
            for _, fn in phases:
                fn()
    samples = {k: {n: [] for n, _ in ph if not n.startswith("_")} for k, ph in setups.items()}
    meter = PressureMeter().start()
    for _ in range(trials):
        for key, phases in setups.items():
            acc, runs = dict.fromkeys(samples[key], 0.0), dict.fromkeys(samples[key], 0)
            for r in range(warm + repeats):
                for name, fn in phases:
                    t0 = time.thread_time()
                    fn()
                    if name in acc and r >= warm:
                        acc[name] += time.thread_time() - t0
                        runs[name] += 1
            for name, s in acc.items():
                samples[key][name].append(s / runs[name] * 1e6)
    pressure = meter.stop()
    return ({k: {n: stats_of(v).p10_s for n, v in ph.items()} for k, ph in samples.items()},
            pressure)


def setups(layers=LAYERS, big: int = BIG) -> tuple[dict, dict]:
    """(every timed setup's phases, their ``counts``), keyed (kind, layers, bias); kinds:
    probe, bare, ddp, whole (``optimizer.step()`` in one call), buckets (a bucket per
    layer)."""
    hi = layers[1]
    out, cnt = {("probe", n, False): _probe_phases(n) for n in (1, 5)}, {}
    for n in layers:
        for bias in (False, True):
            out[("bare", n, bias)] = bare_phases(n, bias)
            out[("ddp", n, bias)], cnt[("ddp", n, bias)] = ddp_phases(n, bias)
    out[("ddp", big, False)], cnt[("ddp", big, False)] = ddp_phases(big, False)
    out[("hook_body", HOOK_CALLS, False)] = hook_body_phases(HOOK_CALLS)
    out[("whole", hi, False)], cnt[("whole", hi, False)] = ddp_phases(hi, False, whole=True)
    per_layer = 12 * HIDDEN * HIDDEN + 4 * HIDDEN           # one layer's elements, no bias
    out[("buckets", hi, False)], cnt[("buckets", hi, False)] = ddp_phases(
        hi, False, bucket=per_layer)
    return out, cnt


# ---- deriving --------------------------------------------------------------------------------
def probe_op(t: dict) -> dict[str, float]:
    """Host us per op-graph op (fwd, bwd) from the probe decoders timed among ``t``."""
    from .bench_host import graph_ops
    (f0, b0), (f1, b1) = graph_ops(1), graph_ops(5)
    lo, hi = t[("probe", 1, False)], t[("probe", 5, False)]
    return {"fwd": (hi["fwd"] - lo["fwd"]) / (f1 - f0), "bwd": (hi["bwd"] - lo["bwd"]) / (b1 - b0)}


def fit_line(xs, ys) -> tuple[float, float]:
    """(intercept, slope): the least-squares line through (xs, ys)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def _diff(t: dict, key: tuple, a: str, b: str, bare: tuple | None = None) -> float:
    """Phase ``a`` minus phase ``b`` of setup ``key`` (the same model), less the same
    difference of the bare model (``bare``: its key; default the same layers and bias)."""
    ref = t[bare or ("bare", *key[1:])]
    return t[key][a] - t[key][b] - (ref[a] - ref[b])


def _per_layer(fn, layers) -> tuple[float, float]:
    """(slope per layer, intercept) of ``fn(layers)`` between the two layer counts."""
    lo, hi = layers
    a, b = fn(lo), fn(hi)
    return (b - a) / (hi - lo), a - lo * (b - a) / (hi - lo)


def hook_values(t: dict, c: dict, layers=LAYERS) -> list[tuple[str, float]]:
    """(metric, us) rows of ``mcore_ddp_hooks`` from timings ``t`` and ``counts`` ``c``:
    forward pre-hooks = a steady forward with them on (fwd2) minus off (fwd1) in the same
    model; backward hooks = DDP's steady backward (bwd0) minus the bare model's; the linear
    weights' main_grad.add_ = bwd0 minus bwd1 (fused emulated) in the same model; the
    pre-hook's body per tensor and per module alone (``hook_body_phases``)."""
    lo, hi = layers
    fwd = _per_layer(lambda n: _diff(t, ("ddp", n, False), "fwd2", "fwd1"), layers)
    bwd = _per_layer(lambda n: t[("ddp", n, False)]["bwd0"] - t[("bare", n, False)]["bwd0"],
                     layers)
    adds = _per_layer(lambda n: _diff(t, ("ddp", n, False), "bwd0", "bwd1"), layers)
    k = c[("ddp", lo, False)]
    fused_n = (c[("ddp", hi, False)]["fused_linear_weights"] - k["fused_linear_weights"]) / (
        hi - lo)
    body = t[("hook_body", HOOK_CALLS, False)]
    tensor_f = (body["pre_hook_2"] - body["pre_hook_0"]) / 2 / HOOK_CALLS
    add = adds[0] / fused_n
    return [("per layer, fwd, steady micro-batch (forward pre-hooks)", fwd[0]),
            ("per layer, bwd, steady micro-batch (param hooks, main_grad.add_ on every tensor)",
             bwd[0]),
            ("per layer, bwd, steady micro-batch, TE grad-accumulation fusion emulated",
             bwd[0] - adds[0]),
            ("per model pass, fwd, steady micro-batch, fixed", fwd[1]),
            ("per model pass, bwd, steady micro-batch, fixed", bwd[1]),
            ("fwd pre-hook body called alone (warm), per parameter tensor", tensor_f),
            ("fwd pre-hook body called alone (warm), per module without parameters",
             body["pre_hook_0"] / HOOK_CALLS),
            ("per hooked module, fwd pre-hook in a forward (per layer / its modules)",
             fwd[0] / k["layer_modules"]),
            ("main_grad.add_ in the bwd hook, per tensor", add),
            ("per parameter tensor, bwd hook beyond main_grad.add_",
             bwd[0] / k["layer_tensors"] - add)] + _edge_values(t, c, layers)


def _edge_values(t: dict, c: dict, layers) -> list[tuple[str, float]]:
    """The first micro-batch's forward (fwd0 minus fwd0_gathered, the same model) and the
    last one's backward (bwd2 minus the steady bwd0, less the bare model's) beyond a steady
    micro-batch's: per layer, fixed, and per extra bucket (the bucket-per-layer setup)."""
    hi = layers[1]
    nb = c[("buckets", hi, False)]["buckets"] - c[("ddp", hi, False)]["buckets"]
    edges = {"first micro-batch, fwd": lambda kind, n: t[(kind, n, False)]["fwd0"]
             - t[(kind, n, False)]["fwd0_gathered"],
             "last micro-batch, bwd": lambda kind, n: _diff(t, (kind, n, False), "bwd2", "bwd0",
                                                            ("bare", n, False))}
    out = []
    for what, edge in edges.items():
        per, fixed = _per_layer(lambda n, edge=edge: edge("ddp", n), layers)
        out += [(f"{what}, extra over steady, per layer", per),
                (f"{what}, extra over steady, fixed", fixed),
                (f"{what}, extra over steady, per extra bucket",
                 (edge("buckets", hi) - edge("ddp", hi)) / nb)]
    return out


def _ddp_keys(c: dict) -> list:                 # the setups of the optimizer's line
    return [k for k in c if k[0] == "ddp"]


FIT_BY = {"zero_grad_buffer": "model_tensors", "finalize": "model_modules"}


def optimizer_fits(t: dict, c: dict) -> dict[str, tuple[float, float]]:
    """(fixed us, us per local tensor) of each optimizer piece and per-step phase, the line
    over the DDP setups' local tensor counts (``FIT_BY``: per model tensor / module)."""
    keys = _ddp_keys(c)
    out = {}
    for ph in OPT_PARTS + STEP_PARTS:
        by = FIT_BY.get(ph, "local_tensors")
        out[ph] = fit_line([c[k][by] for k in keys], [t[k][ph] for k in keys])
    return out


def opt_values(t: dict, c: dict, layers=LAYERS) -> list[tuple[str, float]]:
    """(metric, us) rows of ``mcore_dist_optimizer``."""
    hi = layers[1]
    f = optimizer_fits(t, c)
    gpu = ("prepare_grads", "grads_for_norm", "grad_norm_onecall", "clip", "copy_params",
           "zero_grad")
    unit = {"local_tensors": "local parameter tensor", "model_tensors": "model parameter "
            "tensor", "model_modules": "model module"}
    rows = []
    for ph in OPT_PARTS + STEP_PARTS:
        rows += [(f"{ph}, per step, fixed", f[ph][0]),
                 (f"{ph}, per {unit[FIT_BY.get(ph, 'local_tensors')]}", f[ph][1])]
    rows += [("GPU-path sum (no inner step, one-call norm), per step, fixed",
              sum(f[p][0] for p in gpu)),
             ("GPU-path sum (no inner step, one-call norm), per local parameter tensor",
              sum(f[p][1] for p in gpu))]
    b, one = c[("buckets", hi, False)], c[("ddp", hi, False)]
    nb = b["buckets"] - one["buckets"]
    for ph in ("finalize", "zero_grad_buffer", "no_sync_enter", "no_sync_exit"):
        fit = f[ph][0] + f[ph][1] * b[FIT_BY.get(ph, "local_tensors")]
        rows.append((f"{ph}, per extra bucket", (t[("buckets", hi, False)][ph] - fit) / nb))
    whole = t[("whole", hi, False)]["step"]
    parts = sum(t[("ddp", hi, False)][p] for p in OPT_PARTS if p != "grad_norm_onecall")
    return rows + [(f"optimizer.step() whole at {hi} layers (check)", whole),
                   (f"sum of its pieces at {hi} layers (CPU norm; check)", parts)]

# ---- rows ------------------------------------------------------------------------------------
def measure(trials: int = TRIALS, repeats: int = REPEATS, layers=LAYERS, big: int = BIG
            ) -> dict | None:
    """Timings (us per phase per setup), ``counts``, the probe's us per op and the run's CPU
    pressure; None, with a message on stderr, without Megatron-Core."""
    why = available()
    if why:
        print(f"{HOOKS} / {OPT} skipped: {why}", file=sys.stderr)
        return None
    from .bench_mcore_host import one_thread_no_warnings
    with one_thread_no_warnings():
        built, cnt = setups(layers, big)
        t, pressure = time_phases(built, trials, repeats)
    return {"t": t, "counts": cnt, "op": probe_op(t), "pressure": pressure,
            "layers": tuple(layers), "big": big, "trials": trials, "repeats": repeats}


def _method(m: dict, mech: str) -> str:
    import megatron.core
    c, (lo, hi) = m["counts"], m["layers"]
    k = c[("ddp", lo, False)]
    loc = ", ".join(f"{n}L{'+bias' if b else ''} {c[(kind, n, b)]['local_per_rank']}/"
                    f"{c[(kind, n, b)]['model_tensors']}" for kind, n, b in _ddp_keys(c))
    head = (f"megatron-core {megatron.core.__version__} GPTModel local spec in Float16Module "
            f"(bf16), hidden {HIDDEN}, {TOKENS} tokens, DDP(use_distributed_optimizer, "
            "overlap_grad_reduce, overlap_param_gather, grad_reduce_in_fp32) on a fake 2-rank "
            f"group, {MICRO} micro-batches per step, thread CPU time interleaved with the host "
            f"probe (p10 of {m['trials']} trials x {m['repeats']} x 2 steps; bwd op "
            f"{m['op']['bwd']:.2f} us; CPU pressure {m['pressure']:.2f}); "
            "calibrate.bench_mcore_ddp")
    if mech == HOOKS:
        return (f"{head}; {lo} vs {hi} layers, a layer of {k['layer_tensors']} tensors and "
                f"{k['layer_modules']} hooked modules; fwd pre-hooks = steady forward with them "
                "on minus off (disable_forward_pre_hook), same model, less the bare model's "
                "same two; hook body alone on a module of 0 / 2 tensors; bwd hooks = DDP's "
                "steady (no_sync) backward minus the bare Float16Module(GPTModel)'s; TE fusion "
                "= grad_added_to_main_grad set on the linear weights (same model); first "
                "micro-batch = fwd0 minus fwd0 with the gathers done beforehand (same model); "
                "last = bwd2 minus steady bwd0, less the bare model's; buckets: one per layer "
                f"({c[('buckets', hi, False)]['buckets']} vs 1)")
    return (f"{head}; get_megatron_optimizer(adam, bf16, distributed, clip_grad {CLIP}), "
            "ChainedOptimizer.step in pieces; fixed + per local tensor = least-squares line "
            f"over setups (local tensors of ranks [0, 1] / model tensors: {loc}; rank 0 "
            "timed); inner step = torch.optim.AdamW "
            "single-tensor on this CPU (TE/apex FusedAdam on a GPU); grad_norm_cpu = "
            "local_multi_tensor_l2_norm fallback, grad_norm_onecall = one call in place of "
            "multi_tensor_l2norm; no clip scaling (norm < 1)")


def rows(m: dict, base: dict) -> list[dict]:
    """CSV rows (``bench_framework.COLUMNS``) of both mechanisms, in the run's own probe units."""
    from .bench_dp import probe_rows
    return (probe_rows(m, base, HOOKS, _method(m, HOOKS),
                       hook_values(m["t"], m["counts"], m["layers"]))
            + probe_rows(m, base, OPT, _method(m, OPT),
                         opt_values(m["t"], m["counts"], m["layers"])))


def framework_rows(base: dict, want) -> list[dict]:
    """``bench_framework``'s entry: both mechanisms' rows when ``want`` either; none without
    Megatron-Core."""
    if not (want(HOOKS) or want(OPT)):
        return []
    m = measure()
    if m is None:
        return []
    if m["pressure"] > 0.25:
        print(f"{HOOKS} / {OPT}: host busy ({m['pressure']:.0%} CPU pressure)", file=sys.stderr)
    print_table(m, sys.stderr)
    return [r for r in rows(m, base) if want(r["mechanism"])]


def print_table(m: dict, out=sys.stdout) -> None:
    """Every setup's phases (us) and counts."""
    op = m["op"]
    print(f"probe: fwd {op['fwd']:.2f} us/op, bwd {op['bwd']:.2f} us/op; pressure "
          f"{m['pressure']:.2f}", file=out)
    for key, ph in m["t"].items():
        cnt = m["counts"].get(key, {})
        print(f"{key}: " + ", ".join(f"{n} {v:.1f}" for n, v in ph.items())
              + (f"  | {cnt}" if cnt else ""), file=out)

