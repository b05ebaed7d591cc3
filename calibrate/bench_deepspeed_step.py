"""Host cost of DeepSpeed's ZeRO stage 1 and 2 optimizer step, measured on this CPU
(``python -m calibrate.bench_framework --only deepspeed_zero_optimizer``).

Which optimizer runs (DeepSpeed 0.19.8, runtime/engine.py ``_do_optimizer_sanity_check``
2294-2325, ``_configure_optimizer`` 2356-2365): with ZeRO on, every stage 1 / 2 config gets
``DeepSpeedZeroOptimizer`` (runtime/zero/stage_1_and_2.py), except bf16 at stage 1 with fp32
gradient accumulation (``data_types.grad_accum_dtype: "fp32"``), which gets
``BF16_Optimizer``; the accumulation dtype defaults to the model's (engine.py 1806-1809), so
``bf16: {enabled: true}`` at ZeRO-1 or 2 and fp16 at either run DeepSpeedZeroOptimizer
(each engine's class is recorded, ``counts``).

What runs: ``deepspeed.initialize`` on the probe decoder of ``calibrate.bench_host`` (and the
same decoder at hidden 8: ``HIDDENS``) at ``LAYERS`` layers, blocks of 6 and 9 parameter
tensors, on the fake 2-rank group of the other DeepSpeed benches (DS_ACCELERATOR=cpu; rank 0
owns the first half of the flat buffer; every collective is a no-op), ``KINDS``: bf16 or fp16
(dynamic loss scale from 2^``FP16_SCALE_POWER``), ZeRO 1 or 2 (contiguous gradients, no
overlap_comm), ``gradient_clipping`` 1.0, ``steps_per_print`` inf (as accelerate sets it),
the client ``torch.optim.AdamW(fused=True)`` (HF Trainer's adamw_torch_fused) or DeepSpeed's
FusedAdam from the config's ``"optimizer": {"type": "AdamW"}`` (its CPU op build; the Python
around the kernel is the GPU's). A timed round (``engine_phases``): forward and backward (the
boundary's reduction into the partition; not timed), the step in its pieces (``PIECES``: the
calls of ``DeepSpeedZeroOptimizer.step`` 3013-3170 and ``engine._take_model_step`` 3505-3565
in their order), forward and backward again, ``engine.step()`` whole. The bare fp32 model
with the same torch AdamW: ``clip_grad_norm_``, ``step``, ``zero_grad`` (a check against
``bench_optimizer_host``'s ``optimizer_step_fused``). Every phase on the thread's CPU clock
(``bench_mcore_ddp.time_phases``), re-timed while noisy (``bench_hf_host.noise``).

Warm protocol (the rows' metrics start with ``LABEL``): in every trial each setup in turn
runs ``WARM`` untimed rounds and then ``REPEATS`` timed ones back to back, so every timed
piece follows that same engine's own forward, backward and earlier pieces (and its previous
step), as in a training loop; the host probe's decoders are setups like the others, timed the
same way in the same trials (as ``bench_optimizer_host`` times each case in a run of calls of
its own, interleaved trial by trial with the probe). The earlier rows (no ``LABEL``) timed
one round per setup after 72 other setups' rounds: caches colder than a training loop's.

Fits (``fit``): each phase's least squares over the sizes, fixed + per tensor + per element:
the tensors the phase loops over (``UNIT``: the model's, or the rank's partition's: those
``params_in_partition``) and the elements of the rank's fp32 partition (the bare optimizer:
of the model). On this CPU the elementwise kernels (the flat partition's cast, unscale,
AdamW and copy back, the fp64 norms) cost host time in proportion to the elements; on a GPU
that is device time, so the per-element term is kept apart (hidden 8 against 32: 16x fewer
matrix elements, the same tensors).

Where the host waits for a GPU (``host_syncs`` lists the calls; 0.19.8): stage_1_and_2.py
3248 ``overflow_gpu[0].item()`` after the overflow flag's all_reduce (``has_overflow``; the
bf16 config's ``check_grad_overflow`` defaults on, as fp16's); runtime/utils.py 887
``torch.tensor(-1.0, device=...)`` (a host-to-device copy from pageable memory) in
``mask_nan_or_inf_with_val_inplace`` from ``get_grad_norm_direct`` 2699; utils.py 233
``bool(...)`` in ``is_invalid_grad_norm`` from ``step`` 3043 and ``unscale_and_clip_grads``
3203; utils/timer.py 256 ``ThroughputTimer.stop``'s ``synchronize()`` from ``engine.step``
(engine.py 3622; the throughput timer is on and synchronized by default, from the third
step). Outside the step, timer.py 238 (``start``) syncs in every forward (engine.py 2946,
when ``deepspeed.initialize`` got no training data, as under accelerate).
Stand-ins: the collectives (overflow and norm all_reduce, the all_gather_into_tensor) are
calls into the fake group; rank 0 only (the last rank pads its flat gradient); each phase
runs after a forward and backward, so its caches are as cold as after a real backward.
DeepSpeed is not a dependency (``pip install deepspeed``): without it the bench is skipped.
"""
from __future__ import annotations

import sys

MECHANISM = "deepspeed_zero_optimizer"
LAYERS = (1, 4, 12)
HIDDENS = (32, 8)
BLOCKS = (False, True)                   # build_model(split=...): 6 / 9 tensors per layer
CHECK_SIZE = (LAYERS[-1], True, HIDDENS[0])   # the largest setup: pieces summed vs whole
CLIP = 1.0
FP16_SCALE_POWER = 12                    # no overflow in the probe's fp16 gradients
TRIALS, REPEATS, WARM = 30, 2, 1
LABEL = "warm: "                         # every row's metric: the warm protocol's
WAIT_S = 300.0                           # of pauses while re-measuring on a busy host
KINDS = {"z1_bf16": (1, "bf16", "torch"), "z2_bf16": (2, "bf16", "torch"),
         "z1_fp16": (1, "fp16", "torch"), "z2_fp16": (2, "fp16", "torch"),
         "z1_bf16_ds": (1, "bf16", "fusedadam")}
RUN = ("z1_bf16", "z2_bf16")              # bench_framework's run; the rest: measure(kinds=...)
OPTIMIZERS = {"torch": "torch AdamW(fused=True)", "fusedadam": "DeepSpeed FusedAdam"}
# the step's pieces, with the tensors each loops over (None: no per-tensor loop): flatten frees
# params_not_in_partition's gradients and flattens those of params_in_partition (together
# the model's on rank 0), free_grads frees params_in_partition's (stage_1_and_2.py 3103-3128)
UNIT = {"overflow": "local", "grad_norm": "local", "scale": None, "flatten": "model",
        "free_grads": "local", "unscale_clip": None, "inner_step": None, "copy_back": None,
        "all_gather": None, "bit16_views": "model", "zero_grad": "model", "glue": None}
PIECES = tuple(UNIT)
BARE = {"clip": "model", "opt_step": "model", "opt_zero_grad": "model"}


def available() -> str:
    from .bench_deepspeed import available as ds_available
    return ds_available()


def config(kind: str, hidden: int) -> dict:
    """The DeepSpeed config of ``kind`` (``KINDS``) on the fake group, as
    ``bench_deepspeed.config`` of its stage, in its dtype, clipping and optimizer."""
    from .bench_deepspeed import config as ds_config
    stage, dtype, opt = KINDS[kind]
    return step_config(ds_config(stage, hidden), dtype, opt)


def step_config(cfg: dict, dtype: str, opt: str) -> dict:
    """``cfg`` with the step's settings: gradient clipping ``CLIP``, no step prints, bf16
    or fp16 (dynamic loss scale from 2^``FP16_SCALE_POWER``), and DeepSpeed's FusedAdam as
    the optimizer where ``opt`` is "fusedadam" (else the client's)."""
    cfg.update(gradient_clipping=CLIP, steps_per_print=float("inf"),
               bf16={"enabled": dtype == "bf16"})
    if dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": FP16_SCALE_POWER}
    if opt == "fusedadam":
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-4}}
    return cfg


def spec_of(layers: int, hidden: int):
    """The probe decoder's spec at ``layers`` layers and width ``hidden`` (ffn 4x)."""
    from dataclasses import replace

    from .bench_host import probe_spec
    return replace(probe_spec(layers), hidden=hidden, ffn_hidden=4 * hidden)


def _passes(model, forward, backward):
    """(forward, backward) phases of one micro-batch of ``model`` (``forward`` its call,
    ``backward`` the loss's), the loss held between them; the gradients stay."""
    from .torch_model import synthetic_batch
    tokens, targets = synthetic_batch(model.spec, 1)
    held = {}

    def fwd():
        held["loss"] = forward(tokens, targets)

    def bwd():
        backward(held.pop("loss"))
    return fwd, bwd


def engine(kind: str, layers: int, split: bool, hidden: int):
    """A DeepSpeed engine of ``kind`` on the probe decoder (``spec_of``)."""
    import deepspeed
    import torch

    from .torch_model import build_model
    model = build_model(spec_of(layers, hidden), split=split)
    model.spec = spec_of(layers, hidden)
    opt = None if KINDS[kind][2] == "fusedadam" else torch.optim.AdamW(
        model.parameters(), lr=1e-4, fused=True)
    eng, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config(kind, hidden))
    return eng


def step_parts(eng) -> list[tuple[str, object]]:
    """``engine.step()`` at a boundary in ``PIECES`` (DeepSpeed 0.19.8, stage_1_and_2.py
    ``step`` 3013-3170 without offload or Muon, this rank not the last partition; engine.py
    ``_take_model_step``): the same calls in the same order; ``glue``: ``engine.step()``
    with the optimizer's ``step`` and ``zero_grad`` done already (instance no-ops)."""
    import torch
    from deepspeed.runtime.utils import is_invalid_grad_norm
    from deepspeed.runtime.zero.stage_1_and_2 import INITIAL_MICRO_STEP_ID
    o, held = eng.optimizer, {}
    groups = range(len(o.bit16_groups))

    def overflow():
        o.micro_step_id = INITIAL_MICRO_STEP_ID
        o._wait_for_offload_copies()
        o.overflow = False
        if o.check_grad_overflow:
            o.check_overflow(partition_gradients=o.partition_gradients)

    def grad_norm():
        held["norm"] = norm = o.scaled_global_norm()
        if (o.dtype != torch.bfloat16 or o.check_grad_overflow) and is_invalid_grad_norm(norm):
            o.overflow = True

    def scale():
        prev = o.loss_scale
        o._update_scale(o.overflow)
        o._commit_muon_momentum()
        o._global_grad_norm = held["norm"] / prev

    def flatten():
        for i in groups:
            o.free_grad_in_param_list(o.params_not_in_partition[i])
            flat = o.flatten(o.averaged_gradients[i])
            held[i] = flat.to(o.single_partition_of_fp32_groups[i].dtype)
            o.single_partition_of_fp32_groups[i].grad = held[i]

    def free_grads():
        for i in groups:
            o.free_grad_in_param_list(o.params_in_partition[i])
            o._release_preflattened_grad_buffers(i)
            o.averaged_gradients[i] = o.all_grad_tensors[i] = None

    def copy_back():
        for i in groups:
            o.single_partition_of_fp32_groups[i].grad = None
            rank = torch.distributed.get_rank(group=o.real_dp_process_group[i])
            o.parallel_partitioned_bit16_groups[i][rank].data.copy_(
                o.single_partition_of_fp32_groups[i].data)
    fn = {"overflow": overflow, "grad_norm": grad_norm, "scale": scale, "flatten": flatten,
          "free_grads": free_grads,
          "unscale_clip": lambda: [o.unscale_and_clip_grads([held[i]], held["norm"])
                                   for i in groups],
          "inner_step": lambda: [o._optimizer_step(i) for i in groups],
          "copy_back": copy_back, "all_gather": lambda: _all_gather(o),
          "bit16_views": lambda: [o._update_model_bit16_weights(i) for i in groups],
          "zero_grad": o.zero_grad, "glue": lambda: _glue(eng)}
    return [(p, fn[p]) for p in PIECES]


def _all_gather(o) -> None:
    """The step's all-gather of the updated bit16 partitions (one call per group)."""
    from deepspeed.runtime.utils import all_gather_dp_groups
    all_gather_dp_groups(groups_flat=o.bit16_groups_flat,
                         partitioned_param_groups=o.parallel_partitioned_bit16_groups,
                         dp_process_group=o.real_dp_process_group,
                         start_alignment_factor=o.nccl_start_alignment_factor,
                         allgather_bucket_size=o.allgather_bucket_size)


def _glue(eng) -> None:
    """``engine.step()`` beyond the optimizer's ``step`` and ``zero_grad`` (run as pieces
    before it): those two shadowed by no-ops on the instance for the call."""
    o = eng.optimizer
    o.step = o.zero_grad = lambda *a, **k: None
    try:
        eng.step()
    finally:
        del o.step, o.zero_grad


def engine_phases(kind: str, layers: int, split: bool, hidden: int) -> tuple[list, dict]:
    """(one round's phases, ``counts``) of an engine of ``kind``: forward, backward, the
    step in ``step_parts``; forward, backward, ``engine.step()`` whole (``step``)."""
    eng = engine(kind, layers, split, hidden)
    fwd, bwd = _passes(eng.module, eng, eng.backward)
    passes = [("_fwd", fwd), ("_bwd", bwd)]
    return passes + step_parts(eng) + passes + [("step", eng.step)], counts(eng)


def bare_phases(layers: int, split: bool, hidden: int) -> tuple[list, dict]:
    """The bare fp32 model and ``torch.optim.AdamW(fused=True)``: forward, backward,
    ``clip_grad_norm_`` (``CLIP``), ``step``, ``zero_grad``; and its counts."""
    import torch

    from .torch_model import build_model
    model = build_model(spec_of(layers, hidden), split=split)
    model.spec = spec_of(layers, hidden)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    fwd, bwd = _passes(model, model, lambda loss: loss.backward())
    n, e = len(params), sum(p.numel() for p in params)
    return ([("_fwd", fwd), ("_bwd", bwd),
             ("clip", lambda: torch.nn.utils.clip_grad_norm_(params, CLIP)),
             ("opt_step", opt.step), ("opt_zero_grad", lambda: opt.zero_grad(set_to_none=True))],
            {"model": n, "local": n, "elements": e, "model_elements": e})


def counts(eng) -> dict:
    """The engine's optimizer classes, its parameter tensors (``model``), those of this
    rank's partition (``local``: the step's norm, overflow and free_grads loops), the elements
    of this rank's fp32 partition and of the model."""
    o = eng.optimizer
    return {"model": sum(len(g) for g in o.bit16_groups),
            "local": sum(len(g) for g in o.params_in_partition),
            "elements": sum(p.numel() for p in o.single_partition_of_fp32_groups),
            "model_elements": sum(p.numel() for p in eng.module.parameters()),
            "optimizer": type(o).__name__, "inner": type(o.optimizer).__name__}


def sizes() -> list[tuple[int, bool, int]]:
    return [(n, s, h) for h in HIDDENS for s in BLOCKS for n in LAYERS]


def setups(kinds=tuple(KINDS)) -> tuple[dict, dict]:
    """(phases, counts) of every setup, keyed (kind, layers, split, hidden), kinds ``bare``
    and ``kinds``; the host probe's (``bench_mcore_ddp``'s keys). Needs the fake group up."""
    from .bench_deepspeed import _launcher_env
    from .bench_mcore_ddp import _probe_phases
    _launcher_env()
    out = {("probe", n, False): _probe_phases(n) for n in (1, 5)}
    cnt = {}
    for size in sizes():
        out[("bare", *size)], cnt[("bare", *size)] = bare_phases(*size)
        for kind in kinds:
            out[(kind, *size)], cnt[(kind, *size)] = engine_phases(kind, *size)
    return out, cnt


# ---- measuring -------------------------------------------------------------------------------
def _time_quiet(built: dict, trials: int, repeats: int, warm: int = WARM,
                label: str = MECHANISM) -> tuple[dict, list]:
    """``bench_mcore_ddp.time_phases`` of ``built`` (``warm`` untimed rounds per setup and
    trial), re-timed after a backoff pause while noisy (``bench_hf_host.noise``) within
    ``WAIT_S``: (timings, each attempt's noise); ``label`` names the bench in messages."""
    from .bench import until_quiet
    from .bench_hf_host import _host_name, _recorded_probe_us, noise
    from .bench_mcore_ddp import probe_op, time_phases
    from .store import ForeignLoadMeter
    usual = _recorded_probe_us(_host_name())

    def attempt():
        meter = ForeignLoadMeter().start()
        t, pressure = time_phases(built, trials, repeats, warm)
        res = {"t": t, "op": probe_op(t), "pressure": pressure,
               "foreign": meter.foreign(meter.stop()[0])}
        return res, noise(pressure, res["foreign"], res["op"]["fwd"], usual)
    return until_quiet(attempt, WAIT_S, f"{label}: ")


def host_syncs(built: dict, kind: str, size: tuple) -> dict[str, dict[str, int]]:
    """Per pass (forward, backward at the boundary, ``engine.step()``) of the engine set up
    as ``(kind, *size)``: ``bench_deepspeed_pipe.host_reads`` without its ``.to()`` calls
    (here dtype casts and moves to the tensor's own device): value reads into Python, the
    accelerator's ``synchronize()``, tensors made from host data on the device."""
    from .bench_deepspeed_pipe import host_reads
    phases = built[(kind, *size)]
    fwd, bwd, step = (dict(phases)[n] for n in ("_fwd", "_bwd", "step"))
    out = {}
    for name, fn in (("fwd", fwd), ("bwd", bwd), ("step", step)):
        out[name] = {k: v for k, v in host_reads(fn).items() if not k.startswith("to(")}
    return out


def measure(kinds=RUN, trials: int = TRIALS, repeats: int = REPEATS) -> dict | None:
    """One run: timings (us per phase per setup), ``counts``, the probe's us per op, noise,
    and ``host_syncs`` per kind; None, with a message on stderr, without DeepSpeed."""
    why = available()
    if why:
        print(f"{MECHANISM} skipped: {why}", file=sys.stderr)
        return None
    from .bench_mcore_host import one_thread_no_warnings
    with one_thread_no_warnings():
        built, cnt = setups(kinds)
        res, attempts = _time_quiet(built, trials, repeats)
        syncs = {k: host_syncs(built, k, CHECK_SIZE) for k in kinds}
    return run_result(built, cnt, kinds, (res, attempts, syncs), (trials, repeats))


def run_result(built: dict, cnt: dict, kinds, timed: tuple, sizes: tuple[int, int]) -> dict:
    """A run's result from its setups ``built`` and ``cnt``, ``timed`` (timings, attempts,
    host syncs) and ``sizes`` (trials, repeats), with each engine's steps skipped on
    overflow (fp16: none wanted) counted."""
    (res, attempts, syncs), (trials, repeats) = timed, sizes
    for k, phases in built.items():
        if k[0] in kinds:
            cnt[k]["skipped"] = dict(phases)["step"].__self__.skipped_steps
    return {**res, "counts": cnt, "attempts": attempts, "syncs": syncs, "kinds": tuple(kinds),
            "trials": trials, "repeats": repeats}


# ---- deriving --------------------------------------------------------------------------------
def fit(xs: list[tuple[float, ...]], ys: list[float]) -> tuple[float, ...]:
    """(intercept, coefficient per column of ``xs``): least squares."""
    import numpy as np
    a = np.column_stack([np.ones(len(ys)), np.asarray(xs, dtype=float)])
    return tuple(float(v) for v in np.linalg.lstsq(a, np.asarray(ys, dtype=float),
                                                   rcond=None)[0])


def _keys(c: dict, kind: str, hidden: int | None = None) -> list:
    return [k for k in c if k[0] == kind and (hidden is None or k[3] == hidden)]


def phase_fits(t: dict, c: dict, kind: str, phases: dict) -> dict[str, tuple[float, ...]]:
    """Per phase of ``phases`` ({phase: unit}), over ``kind``'s setups: (fixed us, us per
    tensor of its unit, us per 1000 elements) (``fit``); a phase of unit None: (fixed, 0,
    per 1000 elements), it loops over no tensors."""
    keys = _keys(c, kind)
    out = {}
    for ph, unit in phases.items():
        ys = [t[k][ph] for k in keys]
        if unit is None:
            a, e = fit([(c[k]["elements"] / 1e3,) for k in keys], ys)
            out[ph] = (a, 0.0, e)
        else:
            out[ph] = fit([(c[k][unit], c[k]["elements"] / 1e3) for k in keys], ys)
    return out


def step_values(t: dict, c: dict, kind: str) -> list[tuple[str, float]]:
    """(metric, us) rows of one engine kind: ``engine.step()`` whole (per model tensor and
    per 1000 partition elements; also the plain line at hidden 32, compute included), over
    the bare optimizer's step + zero_grad, each piece (fixed; per tensor where it loops),
    the pieces' sums by unit, and the check at ``CHECK_SIZE``."""
    keys = _keys(c, kind)
    whole = phase_fits(t, c, kind, {"step": "model"})["step"]
    h32 = _keys(c, kind, HIDDENS[0])
    plain = fit([(c[k]["model"],) for k in h32], [t[k]["step"] for k in h32])
    extra = fit([(c[k]["model"], c[k]["model_elements"] / 1e3) for k in keys],
                [t[k]["step"] - t[("bare", *k[1:])]["opt_step"]
                 - t[("bare", *k[1:])]["opt_zero_grad"] for k in keys])
    rows = [("engine.step() at the boundary, per step, fixed", whole[0]),
            ("engine.step() at the boundary, per model parameter tensor", whole[1]),
            ("engine.step() at the boundary, per 1000 fp32 partition elements (this CPU's "
             "elementwise compute: device time on a GPU)", whole[2]),
            (f"engine.step() at the boundary, per model parameter tensor, hidden {HIDDENS[0]} "
             "only, no element term (compute included)", plain[1]),
            ("engine.step() - bare step() and zero_grad(), per step, fixed", extra[0]),
            ("engine.step() - bare step() and zero_grad(), per model parameter tensor",
             extra[1])]
    f = phase_fits(t, c, kind, UNIT)
    for p, unit in UNIT.items():
        rows.append((f"{p}, per step, fixed", f[p][0]))
        if unit:
            rows.append((f"{p}, per {unit} parameter tensor", f[p][1]))
    by = {u: sum(f[p][1] for p, v in UNIT.items() if v == u) for u in ("model", "local")}
    size = (kind, *CHECK_SIZE)
    return rows + [("pieces summed, per step, fixed", sum(v[0] for v in f.values())),
                   ("pieces summed, per model parameter tensor", by["model"]),
                   ("pieces summed, per local parameter tensor (this rank's partition)",
                    by["local"]),
                   ("pieces summed, per 1000 fp32 partition elements (compute)",
                    sum(v[2] for v in f.values())),
                   (f"check: pieces summed at {_size_text(CHECK_SIZE)}",
                    sum(t[size][p] for p in PIECES)),
                   (f"check: engine.step() at {_size_text(CHECK_SIZE)}", t[size]["step"])]


def _size_text(size: tuple) -> str:
    n, split, h = size
    return f"{n} layers of {9 if split else 6} tensors, hidden {h}"


def bare_values(t: dict, c: dict) -> list[tuple[str, float]]:
    """(metric, us) rows of the bare fp32 model's ``BARE`` phases and of its step and
    zero_grad together: fixed, per tensor, per 1000 elements."""
    f = phase_fits(t, c, "bare", BARE)
    f["opt_both"] = tuple(x + y for x, y in zip(f["opt_step"], f["opt_zero_grad"]))
    names = {"clip": "clip_grad_norm_(1.0)", "opt_step": "torch AdamW(fused=True).step()",
             "opt_zero_grad": "zero_grad(set_to_none=True)",
             "opt_both": "torch AdamW(fused=True).step() + zero_grad(set_to_none=True)"}
    return [row for p, (a, b, e) in f.items() for row in (
        (f"bare fp32 {names[p]}, per step, fixed", a),
        (f"bare fp32 {names[p]}, per parameter tensor", b),
        (f"bare fp32 {names[p]}, per 1000 elements (compute)", e))]


# ---- rows ------------------------------------------------------------------------------------
TAGS = {kind: f"ZeRO-{stage} {dtype}, {OPTIMIZERS[opt]}" for kind, (stage, dtype, opt)
        in KINDS.items()}


def problems(m: dict) -> list[str]:
    """Why the run's rows must not be written (empty: they may)."""
    c, op = m["counts"], m["op"]["fwd"]
    bad = [f"noisy: {m['attempts'][-1]}"] * bool(m["attempts"][-1])
    bad += [f"probe per-op cost {op:.2f} us out of range"] * (not 0 < op < 1e3)
    bad += sorted({f"{k[0]}: {v['skipped']} steps skipped on overflow"
                   for k, v in c.items() if v.get("skipped")})
    return bad


def syncs_text(syncs: dict[str, dict[str, int]]) -> str:
    """``host_syncs`` of one kind as text: per pass, what, how often, where."""
    parts = []
    for pas, found in syncs.items():
        items = [f"{n}x {k.split(' at ')[0]} at {k.split(' at ')[1].split(' ')[0]}"
                 for k, n in sorted(found.items())]
        parts.append(f"{pas}: " + ("; ".join(items) or "none"))
    return ("host reads of device values, synchronize() and host->device tensors in one "
            f"round at {_size_text(CHECK_SIZE)} (calibrate.bench_deepspeed_pipe.host_reads; "
            "dtype casts and same-device .to() left out): " + " | ".join(parts))


def _method(m: dict, kind: str | None) -> str:
    from .bench_deepspeed import version
    k = (kind or "bare", *CHECK_SIZE)
    c = m["counts"][k]
    who = (f"{c['optimizer']} over {c['inner']}" if kind else "the bare fp32 model")
    held = (f"{c['model']} model tensors, {c['local']} in rank 0's partition, "
            f"{c['elements']} fp32 partition elements" if kind
            else f"{c['model']} tensors, {c['elements']} elements")
    return (f"DeepSpeed {version()} {TAGS[kind] if kind else 'bare'} ({who}; DS_ACCELERATOR="
            f"cpu, fake pg x2 rank 0, contiguous_gradients, overlap_comm off, gradient_clipping "
            f"{CLIP}, steps_per_print inf, fp16 initial_scale_power {FP16_SCALE_POWER}) on the "
            f"probe decoder at {LAYERS} layers x blocks of 6 / 9 tensors x hidden {HIDDENS} (at "
            f"{_size_text(CHECK_SIZE)}: {held}); warm protocol: per trial each setup in "
            f"turn, {WARM} untimed round(s) then {m['repeats']} timed, back to back (every piece "
            "after the same engine's own fwd, bwd and earlier pieces); a round: fwd, bwd at the "
            "boundary, the step in pieces (stage_1_and_2.py step 3013-3170, engine.py "
            "_take_model_step 3505-3565), fwd, bwd, engine.step() whole; bare: fp32 model, "
            "clip_grad_norm_, AdamW(fused).step, zero_grad; thread CPU time, the host probe's "
            f"decoders timed alike in the same trials (p10 of {m['trials']} trials of the mean "
            f"of {m['repeats']} rounds; bwd op "
            f"{m['op']['bwd']:.2f} us; CPU pressure {m['pressure']:.2f}, foreign load "
            f"{m['foreign']:.2f}, attempts {len(m['attempts'])}); least squares fixed + per "
            "tensor of the piece's loop (model / local) + per 1000 fp32 partition elements "
            "(bare: model elements); calibrate.bench_deepspeed_step"
            + (f"; {syncs_text(m['syncs'][kind])}" if kind else ""))


def rows_of(m: dict, base: dict) -> list[dict]:
    """CSV rows (``bench_framework.COLUMNS``) in the run's own probe units: the bare
    optimizer's, then each kind's (metric prefixed with its ``TAGS``); every metric begins
    with ``LABEL`` (the warm protocol)."""
    from .bench_dp import probe_rows
    t, c = m["t"], m["counts"]
    out = probe_rows(m, base, MECHANISM, _method(m, None),
                     [(LABEL + k, v) for k, v in bare_values(t, c)])
    for kind in m["kinds"]:
        out += probe_rows(m, base, MECHANISM, _method(m, kind), [
            (f"{LABEL}{TAGS[kind]}, {k}", v) for k, v in step_values(t, c, kind)])
    return out


def print_table(m: dict, out=sys.stderr) -> None:
    op = m["op"]["fwd"]
    print(f"probe fwd {op:.2f} us/op; pressure {m['pressure']:.2f}, foreign {m['foreign']:.2f}"
          f"; attempts: {' | '.join(a or 'quiet' for a in m['attempts'])}", file=out)
    for kind in m["kinds"]:
        for k, v in step_values(m["t"], m["counts"], kind):
            print(f"{v / op:8.3f} eo {v:9.2f} us  {TAGS[kind]}, {k}", file=out)
        print(syncs_text(m["syncs"][kind]), file=out)
    for k, v in bare_values(m["t"], m["counts"]):
        print(f"{v / op:8.3f} eo {v:9.2f} us  {k}", file=out)


def rows(base: dict) -> list[dict]:
    """``bench_framework``'s entry: one run's rows; none, with a message, without DeepSpeed
    or when the run is unfit (``problems``)."""
    from .bench import checked_rows
    return checked_rows(MECHANISM, sys.modules[__name__], base)
