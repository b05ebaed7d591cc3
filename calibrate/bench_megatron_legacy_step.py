"""Host cost of legacy Megatron-LM's local DistributedDataParallel and of its mixed-precision
optimizers' step, measured on this CPU (``calibrate.bench_framework --only
megatron_legacy_ddp_hooks,megatron_legacy_optimizer,megatron_legacy_dist_optimizer``; needs
``MEGATRON_LM_PATH``, as ``calibrate.bench_megatron_legacy``, skipped with a message without).

What runs: Megatron-LM 23.04's real ``megatron/model/distributed.py``
``DistributedDataParallel(Float16Module(GPTModel), accumulate_allreduce_grads_in_fp32=True,
use_contiguous_buffers=True)``, as ``training.py`` ``get_model`` builds it for a ``--bf16`` run
with the default ``--DDP-impl local`` (``validate_args`` turns fp32 accumulation on for bf16),
``get_megatron_optimizer`` (adam, ``--clip-grad 1.0``, no loss scale: bf16 takes no grad
scaler) giving ``Float16OptimizerWithFloat16Params``, or with ``--use-distributed-optimizer``
``DistributedOptimizer``, and ``OptimizerParamScheduler`` (cosine, constant weight decay), on
the fake 2-rank group (data parallel 2; collectives are calls only) with
``calibrate.bench_megatron_legacy``'s set-up and stand-ins. Megatron's ``Timers`` at level 0.

Timed as ``calibrate.bench_mcore_ddp`` times Megatron-Core's: every phase alone on the thread's
CPU clock, setups interleaved trial by trial with the host probe, re-timed while noisy.

* ``megatron_legacy_ddp_hooks``: the AccumulateGrad post-hook on every parameter tensor
  (``param.main_grad.add_(param.grad.data); param.grad = None``), from a DDP model's backward
  minus the bare ``Float16Module(GPTModel)``'s (hidden 32, 32 tokens, biases, dropout, as the
  legacy layer bench) at 1 and 5 layers: per tensor (per-layer slope / the layer's tensors),
  per model (the intercept less its 4 embedding / final-norm tensors). Under apex's gradient
  accumulation fusion (``--gradient-accumulation-fusion``, on by default where apex has
  ``fused_weight_gradient_mlp_cuda``) the linear weights' wgrad GEMM adds into ``main_grad``
  and returns no gradient: the hook still runs and finds ``grad`` None. Emulated in the same
  model (the second micro-batch of a step): the fusion flag on, the extension a stand-in.
  Per step (train_step): ``zero_grad_buffer()``, and ``optimizer.reduce_model_grads`` (the
  layer-norm check, ``allreduce_gradients``: per buffer ``/=`` and ``all_reduce``, the
  embedding checks, six timer calls), also ``allreduce_gradients`` alone.
* ``megatron_legacy_optimizer``: ``optimizer.zero_grad()``, ``optimizer.step(args, timers)``
  whole and in its pieces (``_copy_model_grads_to_main_grads``, ``get_main_grads_for_grad_norm``,
  ``clip_grad_norm`` without and with scaling, the inner Adam step,
  ``_copy_main_params_to_model_params``: a ``copy_`` per tensor in bf16), ``gather_model_params``
  (nothing without the distributed optimizer) and ``opt_param_scheduler.step``. Fixed and per
  parameter tensor: the least-squares line over 1, 5 and 17 layers with biases and 1 and 5
  without (``--disable-bias-linear``), at hidden 8 so that the CPU kernels' element work stays
  small beside their dispatch. ``megatron_legacy_dist_optimizer``: the same with the
  distributed optimizer, per local tensor (those rank 0's shard meets), its
  ``reduce_model_grads`` (``/=``, one ``_reduce_scatter_base`` per buffer; it replaces DDP's
  ``allreduce_gradients``) and ``gather_model_params`` (one ``_all_gather_base``, then a
  ``copy_`` per model tensor: fitted per model tensor).

Stand-ins (apex is absent): ``multi_tensor_applier`` calls its op as apex's does;
``amp_C.multi_tensor_l2norm`` is one ``torch._foreach_norm`` and ``multi_tensor_scale`` one
``torch._foreach_mul_`` (one call where the GPU makes one launch; on this CPU a foreach op
loops over its tensors through the dispatcher, so these overstate the GPU's per-tensor host
time: ``clip_grad_norm_onecall`` takes one ``new_zeros`` for the norm instead, the lower
bound); apex ``FusedAdam`` is ``torch.optim.AdamW(fused=True)`` (assumed to cost the host what
apex's does: both build per-tensor lists in Python and launch one multi-tensor kernel per dtype
list; the CPU fused kernel's own per-tensor work is taken off by replaying its calls alone, as
``calibrate.bench_optimizer_host``'s CUDA estimate); ``fused_weight_gradient_mlp_cuda.
wgrad_gemm_accum_fp32`` is the unfused path's wgrad matmul with its result dropped (one op
where the GPU launches one GEMM); ``torch.cuda.IntTensor`` is the CPU constructor, without the
GPU's copy to the device; ``clip_grad_norm_fp32``'s ``'torch.cuda.FloatTensor'`` assertion
reads ``'torch.FloatTensor'``, and the optimizers' constructors see CUDA type names.

Host waits for the device (23.04, bf16, no loss scale): ``megatron/optimizer/clip_grads.py``
L69 ``torch.cuda.IntTensor([0])`` (a blocking copy to the device: torch's ``copy_`` without
non_blocking ends in ``cudaStreamSynchronize``, so the host waits for the whole backward),
L95 ``total_norm.item()`` (waits for the norm and its all-reduce), and when the norm exceeds
the clip L100 ``torch.cuda.IntTensor([0])`` again; with a loss scale (fp16) also
``optimizer.py`` L401 ``found_inf.item()``; with ``--log-num-zeros-in-grad`` clip_grads.py
L118 and L133; with ``--timing-log-level`` 1 or 2 every level-1 timer's start and stop
(``timers.py`` L84, L94 ``torch.cuda.synchronize()``; level 0, the default, times none of
these). Outside these mechanisms, every step: ``training.py`` L513 (``training_log``:
``torch.cuda.FloatTensor([0.0])`` built as ``dict.get``'s default, per loss key) and L710
(``get_loss_scale().item()``). DDP's hooks, ``zero_grad_buffer``, ``allreduce_gradients``,
``zero_grad`` and the scheduler have none.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import types

HOOKS = "megatron_legacy_ddp_hooks"
OPT = "megatron_legacy_optimizer"
DIST = "megatron_legacy_dist_optimizer"
MECHANISMS = (HOOKS, OPT, DIST)
LAYERS = (1, 5)                   # the hooks' per-layer slope (hidden 32, with the model)
OPT_SETUPS = ((1, True), (5, True), (17, True), (1, False), (5, False))   # (layers, bias)
OPT_HIDDEN = 8                    # the optimizer setups' width: small element work
LOSS_SCALE = 1e-3                 # gradient norm below CLIP in the micro-batch setups
GRAD = 1e-4                       # the optimizer setups' gradient value (norm below CLIP)
CLIP = 1.0                        # --clip-grad's default
INCREMENT = 4                     # scheduler increment: micro-batches x micro-batch x dp
TRIALS, REPEATS = 60, 3
MODEL_FIT = ("zero_grad_buffer", "reduce_model_grads", "allreduce_gradients",
             "gather_model_params")          # fitted per model tensor (others: per local one)
PARTS = ("zero_grad", "step", "copy_grads", "grads_for_norm", "clip_grad_norm",
         "clip_grad_norm_onecall", "clip_grad_norm_scaling", "inner_step", "inner_step_slow",
         "copy_params", "gather_model_params", "scheduler_step")
DDP_STEP = ("zero_grad_buffer", "reduce_model_grads", "allreduce_gradients")


def available() -> str:
    """'' when ``MEGATRON_LM_PATH`` holds Megatron-LM's legacy code, else why not."""
    from .bench_megatron_legacy import available as legacy_available
    return legacy_available()


# ---- stand-ins -------------------------------------------------------------------------------
def _applier(op, noop_flag, tensor_lists, *args):
    """apex ``multi_tensor_applier``: the op called with apex's chunk size."""
    return op(2048 * 32, noop_flag, tensor_lists, *args)


def _foreach_l2norm(chunk, noop_flag, tensor_lists, per_tensor):
    """amp_C ``multi_tensor_l2norm`` as one foreach call (its value: the first tensor's)."""
    import torch
    return torch._foreach_norm(tensor_lists[0])[0], None


def _onecall_l2norm(chunk, noop_flag, tensor_lists, per_tensor):
    """The same as one op without per-tensor work (the lower bound)."""
    return tensor_lists[0][0].new_zeros(1), None


def _foreach_scale(chunk, noop_flag, tensor_lists, scale):
    """amp_C ``multi_tensor_scale`` in place (clip_grads.py passes ``[grads, grads]``)."""
    import torch
    torch._foreach_mul_(tensor_lists[1], scale)


def _wgrad_accum(total_input, grad_output, main_grad):
    """``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32``: one wgrad matmul."""
    grad_output.t().matmul(total_input)


def _fused_adam():
    """apex ``FusedAdam`` (adam_w_mode) as torch's fused AdamW."""
    import torch

    class FusedAdam(torch.optim.AdamW):
        def __init__(self, params, **kw):
            super().__init__(params, fused=True, **kw)
    return FusedAdam


@functools.cache
def _standins() -> types.SimpleNamespace:
    """The fake group, Megatron's set-up (``bench_megatron_legacy``), the stand-ins above put
    where Megatron's optimizer and linear layers look them up; returns the amp_C stand-in
    (once per process)."""
    import torch

    from .bench_dp import _init_fake_pg
    from .bench_mcore_host import recompiled
    from .bench_megatron_legacy import _init_megatron
    _init_fake_pg()
    _init_megatron()
    import megatron.core.tensor_parallel.layers as tpl
    import megatron.optimizer as mo
    import megatron.optimizer.clip_grads as cg
    import megatron.optimizer.optimizer as oo
    amp = types.SimpleNamespace(multi_tensor_l2norm=_foreach_l2norm,
                                multi_tensor_scale=_foreach_scale)
    for m in (oo, cg):
        m.multi_tensor_applier, m.amp_C = _applier, amp
    mo.Adam = _fused_adam()
    torch.cuda.IntTensor = torch.IntTensor
    oo.clip_grad_norm_fp32 = recompiled(cg, "clip_grad_norm_fp32", "'torch.cuda.FloatTensor'",
                                        "'torch.FloatTensor'")
    tpl.fused_weight_gradient_mlp_cuda = types.SimpleNamespace(
        wgrad_gemm_accum_fp32=_wgrad_accum)
    return amp


# ---- the model, the wrapper, the optimizer ---------------------------------------------------
@contextlib.contextmanager
def _run_args(args, hidden: int, bias: bool, dist: bool):
    """Megatron's global args of a bf16 run of width ``hidden`` while a setup is built (the
    legacy layer bench's fp32 args are restored after)."""
    import torch
    new = {"bf16": True, "fp16": False, "params_dtype": torch.bfloat16,
           "accumulate_allreduce_grads_in_fp32": True, "add_bias_linear": bias,
           "bias_gelu_fusion": bias, "hidden_size": hidden, "ffn_hidden_size": 4 * hidden,
           "kv_channels": hidden // args.num_attention_heads, "lr": 1e-4,
           "use_distributed_optimizer": dist}
    old = {k: getattr(args, k) for k in new}
    vars(args).update(new)
    try:
        yield
    finally:
        vars(args).update(old)


@functools.cache
def _gpt():
    """(``pretrain_gpt``, one micro-batch: ids, positions, causal mask) at the legacy bench's
    32 tokens."""
    from .bench_megatron_legacy import _gpt_forward_step, _init_megatron
    gpt, data = _gpt_forward_step(_init_megatron())
    tokens, _, _, mask, pos = gpt.get_batch(data)
    return gpt, (tokens, pos, mask)


def build(layers: int, bias: bool = True, dist: bool = False, hidden: int | None = None,
          ddp: bool = True):
    """(model, optimizer, scheduler) as training.py 23.04 builds them for a bf16 run:
    ``LocalDDP(Float16Module(GPTModel))`` (``ddp`` False: the bare ``Float16Module``, no
    optimizer), ``get_megatron_optimizer``, ``OptimizerParamScheduler``."""
    import torch

    from .bench_mcore_ddp import cuda_type_names
    from .bench_megatron_legacy import _gpt_model, _init_megatron
    _standins()                       # first: ``megatron`` is the checkout's from here on
    from megatron.model import Float16Module
    from megatron.model.distributed import DistributedDataParallel as LocalDDP
    from megatron.optimizer import get_megatron_optimizer
    from megatron.optimizer_param_scheduler import OptimizerParamScheduler
    args, (gpt, _) = _init_megatron(), _gpt()
    with _run_args(args, hidden or args.hidden_size, bias, dist), \
            contextlib.redirect_stdout(None):
        torch.manual_seed(0)
        model = Float16Module(_gpt_model(gpt, args, layers), args)
        if not ddp:
            return model, None, None
        model = LocalDDP(model, args.accumulate_allreduce_grads_in_fp32,
                         args.use_contiguous_buffers_in_local_ddp)
        with cuda_type_names():
            opt = get_megatron_optimizer([model])
        sched = OptimizerParamScheduler(
            opt, max_lr=args.lr, min_lr=args.lr / 10, lr_warmup_steps=10,
            lr_decay_steps=10 ** 9, lr_decay_style="cosine", start_wd=args.weight_decay,
            end_wd=args.weight_decay, wd_incr_steps=10 ** 9, wd_incr_style="constant")
    return model, opt, sched


def local_per_rank(ddp, dp: int = 2) -> list[int]:
    """Per data-parallel rank, the parameter tensors whose range in a grad buffer meets the
    rank's shard (distrib_optimizer.py 23.04 ``build_model_gbuf_range``: shard r = [r S,
    (r + 1) S), S = the padded buffer / dp; ``build_model_gbuf_param_range_map``: a tensor
    counts where its [start, end) overlaps it)."""
    out = [0] * dp
    for dtype, buf in ddp._grad_buffers.items():
        size = buf.numel_padded // dp
        for start, end in ddp._grad_buffer_param_index_map[dtype].values():
            for r in range(dp):
                out[r] += start < (r + 1) * size and end > r * size
    return out


def _fused_modules(module) -> list:
    """The parallel linears (their ``gradient_accumulation_fusion`` flag) of ``module``."""
    return [m for m in module.modules() if hasattr(m, "gradient_accumulation_fusion")]


def counts(ddp, opt) -> dict:
    """Parameter tensors of the model and of a layer, those the optimizer steps on rank 0
    (all without the distributed optimizer), per rank, and fused linears per layer."""
    layer = ddp.module.module.language_model.encoder.layers[0]
    groups = (opt.model_float16_groups + opt.model_fp32_groups
              if hasattr(opt, "model_float16_groups")
              else opt.float16_groups + opt.fp32_from_fp32_groups)
    model = sum(1 for _ in ddp.module.parameters())
    return {"model_tensors": model, "layer_tensors": sum(1 for _ in layer.parameters()),
            "local_tensors": sum(map(len, groups)),
            "local_per_rank": (local_per_rank(ddp) if hasattr(opt, "model_float16_groups")
                               else [model, model]),
            "fused_linears": len(_fused_modules(layer))}


# ---- phases ----------------------------------------------------------------------------------
def _fusion(ddp):
    """``set(on)`` -> a phase turning gradient-accumulation fusion on / off (the parallel
    linears' flag, and the args flag the output layer reads at call time)."""
    from megatron import get_args
    mods = _fused_modules(ddp)

    def set_(on: bool):
        def run():
            get_args().gradient_accumulation_fusion = on
            for m in mods:
                m.gradient_accumulation_fusion = on
        return run
    return set_


def _rest(ddp, opt, sched):
    """What train_step does after the micro-batches (untimed in the hook setups)."""
    from megatron import get_args, get_timers
    args, timers = get_args(), get_timers()

    def run():
        opt.reduce_model_grads(args, timers)
        opt.step(args, timers)
        opt.gather_model_params(args, timers)
        sched.step(increment=INCREMENT)
    return run


def hook_phases(layers: int) -> tuple[list, dict]:
    """A training step of the DDP model (``zero_grad_buffer``, ``zero_grad``, two micro-
    batches, the second under gradient-accumulation fusion, the rest of the step), each
    micro-batch after one of the bare ``Float16Module(GPTModel)`` (``bare_`` phases), so that
    both run after the same work; first an untimed micro-batch of each; and ``counts``."""
    from .bench_mcore_ddp import _fwd_bwd
    ddp, opt, sched = build(layers)
    bare, _, _ = build(layers, ddp=False)
    fwd, bwd = _fwd_bwd(ddp, list(ddp.module.parameters()), _gpt()[1])
    bfwd, bbwd = _fwd_bwd(bare, list(bare.parameters()), _gpt()[1])
    fuse = _fusion(ddp)

    def warm():
        for f, b in ((bfwd, bbwd), (fwd, bwd)):
            f()
            b()
    return ([("_zero_grad_buffer", ddp.zero_grad_buffer), ("_zero_grad", opt.zero_grad),
             ("_warm", warm), ("bare_fwd0", bfwd), ("bare_bwd0", bbwd), ("fwd0", fwd),
             ("bwd0", bwd), ("bare_fwd1", bfwd), ("bare_bwd1", bbwd), ("_fuse", fuse(True)),
             ("fwd1", fwd), ("bwd1", bwd), ("_unfuse", fuse(False)),
             ("_rest", _rest(ddp, opt, sched))], counts(ddp, opt))


def _norm_onecall(opt, amp):
    def run():
        own, amp.multi_tensor_l2norm = amp.multi_tensor_l2norm, _onecall_l2norm
        try:
            opt.clip_grad_norm(CLIP)
        finally:
            amp.multi_tensor_l2norm = own
    return run


def _fill(ddp):
    def run():                  # a backward's gradients, without the backward
        for buf in ddp._grad_buffers.values():
            buf.data.fill_(GRAD)
    return run


def step_phases(layers: int, bias: bool, dist: bool) -> tuple[list, dict]:
    """A training step's per-step calls without micro-batches (the gradient buffer filled
    instead, untimed): DDP's and the optimizer's, the step whole and in its pieces (the same
    calls in the same order; ``inner_step_slow``: the inner step's calls replayed alone), at
    ``OPT_HIDDEN``; and ``counts``."""
    from .bench_dp import replay
    ddp, opt, sched = build(layers, bias, dist, OPT_HIDDEN)
    from megatron import get_args, get_timers
    args, timers, amp = get_args(), get_timers(), _standins()
    _fill(ddp)()
    opt.step(args, timers)                  # the optimizer's state made before the replay
    slow = replay(opt.optimizer.step, steps_on_device=True)
    return ([("zero_grad_buffer", ddp.zero_grad_buffer), ("zero_grad", opt.zero_grad),
             ("_fill", _fill(ddp)),
             ("reduce_model_grads", lambda: opt.reduce_model_grads(args, timers))]
            + ([] if dist else [("allreduce_gradients", ddp.allreduce_gradients)])
            + [("step", lambda: opt.step(args, timers)),
               ("copy_grads", opt._copy_model_grads_to_main_grads),
               ("grads_for_norm", opt.get_main_grads_for_grad_norm),
               ("clip_grad_norm", lambda: opt.clip_grad_norm(CLIP)),
               ("clip_grad_norm_onecall", _norm_onecall(opt, amp)),
               ("clip_grad_norm_scaling", lambda: opt.clip_grad_norm(0.0)),
               ("inner_step", opt.optimizer.step), ("inner_step_slow", slow),
               ("copy_params", opt._copy_main_params_to_model_params),
               ("gather_model_params", lambda: opt.gather_model_params(args, timers)),
               ("scheduler_step", lambda: sched.step(increment=INCREMENT))],
            counts(ddp, opt))


def setups() -> tuple[dict, dict]:
    """(every timed setup's phases, their ``counts``), keyed (kind, layers, bias); kinds:
    probe, ddp (micro-batches of the DDP and the bare model, hidden 32, biases), opt and dist
    (per-step calls, Float16 / distributed optimizer, ``OPT_HIDDEN``)."""
    from .bench_mcore_ddp import _probe_phases
    out, cnt = {("probe", n, False): _probe_phases(n) for n in (1, 5)}, {}
    for n in LAYERS:
        out[("ddp", n, True)], cnt[("ddp", n, True)] = hook_phases(n)
    for kind in ("opt", "dist"):
        for n, bias in OPT_SETUPS:
            out[(kind, n, bias)], cnt[(kind, n, bias)] = step_phases(n, bias, kind == "dist")
    return out, cnt


# ---- deriving --------------------------------------------------------------------------------
def hook_values(t: dict, c: dict) -> list[tuple[str, float]]:
    """(metric, us) rows of ``megatron_legacy_ddp_hooks``: hooks = the DDP model's backward
    minus the bare model's just before it (bwd0), per layer and its intercept; under fusion
    the same of bwd1, and fusion's saving the difference; the LocalDDP forward wrapper
    likewise from fwd0; the per-step calls' lines over the Float16 optimizer setups."""
    from .bench_mcore_ddp import _per_layer
    lo, _ = LAYERS

    def over_bare(ph: str) -> tuple[float, float]:
        return _per_layer(lambda n: t[("ddp", n, True)][ph] - t[("ddp", n, True)]["bare_" + ph],
                          LAYERS)
    bwd, fwd, fused_bwd = over_bare("bwd0"), over_bare("fwd0"), over_bare("bwd1")
    fused = (bwd[0] - fused_bwd[0], bwd[1] - fused_bwd[1])
    k = c[("ddp", lo, True)]
    tensor = bwd[0] / k["layer_tensors"]
    outside = k["model_tensors"] - lo * k["layer_tensors"]
    rows = [("per parameter tensor, bwd (hook: main_grad.add_, grad = None)", tensor),
            ("per layer, bwd (hooks of its tensors)", bwd[0]),
            ("per model pass, bwd, fixed beyond its tensors' hooks", bwd[1] - outside * tensor),
            (f"per model pass, bwd, intercept (incl. the {outside} tensors outside the layers)",
             bwd[1]),
            ("per fused linear weight, bwd, saved under gradient-accumulation fusion",
             fused[0] / k["fused_linears"]),
            ("per model pass, bwd, saved under fusion (output layer's word-embedding wgrad)",
             fused[1]),
            ("per layer, bwd, hooks under gradient-accumulation fusion", bwd[0] - fused[0]),
            ("per model pass, fwd (LocalDDP.forward wrapper)", fwd[1]),
            ("per layer, fwd (none expected)", fwd[0])]
    f = step_fits(t, c, "opt")
    for ph in DDP_STEP:
        rows += [(f"{ph}, per step, fixed", f[ph][0]),
                 (f"{ph}, per model parameter tensor", f[ph][1])]
    return rows + [("per step, fixed: zero_grad_buffer + reduce_model_grads",
                    f["zero_grad_buffer"][0] + f["reduce_model_grads"][0])]


def step_fits(t: dict, c: dict, kind: str) -> dict[str, tuple[float, float]]:
    """(fixed us, us per tensor) of every per-step phase of ``kind``'s setups: the
    least-squares line over their tensor counts (``MODEL_FIT``: per model tensor; others: per
    local tensor)."""
    from .bench_mcore_ddp import fit_line
    keys = [k for k in c if k[0] == kind]
    names = [n for n in t[keys[0]] if n in PARTS + DDP_STEP]
    return {ph: fit_line([c[k]["model_tensors" if ph in MODEL_FIT else "local_tensors"]
                          for k in keys], [t[k][ph] for k in keys]) for ph in names}


def _sub(a, b, c=(0.0, 0.0)) -> tuple[float, float]:
    return a[0] - b[0] - c[0], a[1] - b[1] - c[1]


def opt_values(t: dict, c: dict, kind: str) -> list[tuple[str, float]]:
    """(metric, us) rows of ``megatron_legacy_optimizer`` (``kind`` opt) or ``_dist_optimizer``
    (dist): each piece's line, and derived: the step beyond its pieces, clip scaling, the norm
    stand-in's share, the inner step's CUDA estimate, the per-step total and its GPU
    estimate (dist: per local tensor, and the calls over every model tensor apart)."""
    f = step_fits(t, c, kind)
    local = "local parameter tensor" if kind == "dist" else "parameter tensor"
    pieces = ("copy_grads", "clip_grad_norm", "inner_step", "copy_params")
    per_step = ("zero_grad", "step", "gather_model_params", "scheduler_step") + (
        ("reduce_model_grads",) if kind == "dist" else ())
    by_model = [p for p in per_step if kind == "dist" and p in MODEL_FIT]
    total = (sum(f[p][0] for p in per_step),
             sum(f[p][1] for p in per_step if p not in by_model))
    cuda = (f["inner_step"][0], f["inner_step"][1] - f["inner_step_slow"][1])
    stand_in = _sub(f["clip_grad_norm"], f["clip_grad_norm_onecall"])
    derived = {
        "step() beyond its pieces (timers, checks)": _sub(
            f["step"], tuple(sum(f[p][i] for p in pieces) for i in (0, 1))),
        "clip scaling when the norm exceeds clip_grad": _sub(f["clip_grad_norm_scaling"],
                                                            f["clip_grad_norm"]),
        "grad-norm stand-in: _foreach_norm over one op": stand_in,
        "inner_step, CUDA estimate (CPU fused kernel's per-tensor work off)": cuda,
        f"per step total ({' + '.join(per_step)})": total,
        "per step total, GPU estimate (one-op norm, inner step's CUDA estimate)": _sub(
            total, stand_in, (0.0, f["inner_step"][1] - cuda[1]))}
    own = {ph: v for ph, v in f.items() if ph in PARTS or (ph, kind) == (
        "reduce_model_grads", "dist")}      # DDP's other per-step calls: the hooks' rows
    rows = []
    for ph, (a, b) in list(own.items()) + list(derived.items()):
        per = "model parameter tensor" if ph in MODEL_FIT else local
        if by_model and ph.startswith("per step total"):   # not the label of lines 1210, 1212
            per += " only (the model-tensor calls on their own row)"  # (both parts in one)
        rows += [(f"{ph}, per step, fixed", a), (f"{ph}, per {per}", b)]
    if by_model:                # the distributed optimizer's calls over every model tensor
        rows.append((f"per step total ({' + '.join(by_model)}), per model parameter tensor "
                     "(with either total)", sum(f[p][1] for p in by_model)))
    return rows


# ---- measuring and rows ----------------------------------------------------------------------
def measure(trials: int = TRIALS, repeats: int = REPEATS) -> dict | None:
    """Timings (us per phase per setup), ``counts``, the probe's us per op, the run's noise;
    None, with a message on stderr, without the checkout."""
    why = available()
    if why:
        print(f"{', '.join(MECHANISMS)} skipped: {why}", file=sys.stderr)
        return None
    from .bench_mcore_host import one_thread_no_warnings
    from .bench_mcore_loop import _time_quiet
    with one_thread_no_warnings():
        built, cnt = setups()
        res, attempts = _time_quiet(built, [], trials, repeats, HOOKS)
    return {**res, "counts": cnt, "attempts": attempts, "trials": trials, "repeats": repeats}


def values(m: dict) -> dict[str, list[tuple[str, float]]]:
    """Each mechanism's (metric, us) rows."""
    t, c = m["t"], m["counts"]
    return {HOOKS: hook_values(t, c), OPT: opt_values(t, c, "opt"),
            DIST: opt_values(t, c, "dist")}


def problems(m: dict) -> list[str]:
    """Why the run's rows must not be written (empty: they may)."""
    v = {(mech, k): x for mech, rows in values(m).items() for k, x in rows}
    op = m["op"]["fwd"]
    bad = [f"noisy: {m['attempts'][-1]}"] * bool(m["attempts"][-1])
    bad += [f"probe per-op cost {op:.2f} us out of range"] * (not 0 < op < 1e3)
    need = [(HOOKS, "per parameter tensor, bwd (hook: main_grad.add_, grad = None)")] + [
        (mech, f"{ph}, per {per}") for mech, per in ((OPT, "parameter tensor"),
                                                     (DIST, "local parameter tensor"))
        for ph in ("step", "inner_step", "copy_params")]
    return bad + [f"{mech} {k}: {v[(mech, k)]:.2f} us not positive" for mech, k in need
                  if v[(mech, k)] <= 0]


def _method(m: dict, mech: str) -> str:
    c, op = m["counts"], m["op"]
    k = c[("ddp", LAYERS[0], True)]
    head = (f"Megatron-LM 23.04 (MEGATRON_LM_PATH) LocalDDP(Float16Module(GPTModel)) bf16, "
            "accumulate_allreduce_grads_in_fp32, contiguous buffers, fake 2-rank group (dp 2), "
            f"thread CPU time interleaved with the host probe (p10 of {m['trials']} trials x "
            f"{m['repeats']}; bwd op {op['bwd']:.2f} us; CPU pressure {m['pressure']:.2f}, "
            f"foreign load {m['foreign']:.2f}, attempts {len(m['attempts'])}); "
            "calibrate.bench_megatron_legacy_step")
    if mech == HOOKS:
        return (f"{head}; hooks = DDP backward minus the bare Float16Module(GPTModel)'s, hidden "
                f"32, 32 tokens, biases, dropout 0.1, {LAYERS[0]} vs {LAYERS[1]} layers, a layer "
                f"of {k['layer_tensors']} tensors ({k['fused_linears']} parallel linears); "
                "fusion = --gradient-accumulation-fusion on (wgrad stand-in: one matmul) in "
                "the same model's 2nd micro-batch; per-step calls: the line over "
                f"{OPT}'s setups (hidden {OPT_HIDDEN})")
    kind = "dist" if mech == DIST else "opt"
    pts = ", ".join(f"{n}L{'' if b else ' no-bias'} {c[(kind, n, b)]['local_per_rank']}/"
                    f"{c[(kind, n, b)]['model_tensors']}" for n, b in OPT_SETUPS)
    return (f"{head}; get_megatron_optimizer(adam, clip_grad {CLIP}"
            f"{', use_distributed_optimizer' if kind == 'dist' else ''}) "
            f"at hidden {OPT_HIDDEN}, gradient buffer filled instead of a backward; fixed + "
            f"per tensor = least-squares line over (local tensors of ranks [0, 1] / model "
            f"tensors) {pts}; rank 0 timed; FusedAdam = torch AdamW(fused=True), "
            "inner_step_slow = its calls replayed alone; multi_tensor_l2norm / _scale = one "
            "torch._foreach_norm / _foreach_mul_ (onecall: one new_zeros)")


def rows(m: dict, base: dict) -> list[dict]:
    """CSV rows (``bench_framework.COLUMNS``) of the three mechanisms, in the run's own probe
    units."""
    from .bench_dp import probe_rows
    return [r for mech, vals in values(m).items()
            for r in probe_rows(m, base, mech, _method(m, mech), vals)]


def framework_rows(base: dict, want) -> list[dict]:
    """``bench_framework``'s entry: the rows of the mechanisms ``want`` names; none (with a
    message) without the checkout or from an unfit run."""
    if not any(map(want, MECHANISMS)):
        return []
    m = measure()
    if m is None:
        return []
    from .bench_mcore_ddp import print_table
    print_table(m, sys.stderr)
    bad = problems(m)
    if bad:
        print(f"{', '.join(MECHANISMS)} rows not written: " + "; ".join(bad), file=sys.stderr)
        return []
    return [r for r in rows(m, base) if want(r["mechanism"])]
