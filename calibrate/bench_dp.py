"""Data-parallel wrappers' host work (``calibrate.bench_framework``'s DDP, FSDP1, FSDP2,
DeepSpeed and Megatron-Core optimizer rows): the probe decoder wrapped and bare, timed
interleaved, and the per-tensor loops, on tiny tensors over a fake process group."""
from __future__ import annotations

import time
from typing import Callable

from .bench_host import HOST_LAYERS, loss_backward, probe_spec, time_interleaved


def _low_us(cases, trials: int = 40) -> dict[str, tuple[float, float]]:
    """Interleaved timing; 10th percentile over trials, microseconds (fwd, bwd)."""
    r = time_interleaved(cases, trials=trials)
    return {k: (f.p10_s * 1e6, b.p10_s * 1e6) for k, (f, b, _, _) in r.items()}


def _mechanism_rows(base: dict, op: float, mechanism: str, how: str,
                    values_us: list[tuple[str, float]]) -> list[dict]:
    """CSV rows of one mechanism: each (metric, microseconds) also in eager ops."""
    return [{**base, "mechanism": mechanism, "metric": m, "value_us": round(v, 2),
             "eager_ops": round(v / op, 3), "method": how} for m, v in values_us]


def probe_rows(m: dict, base: dict, mechanism: str, how: str,
               values_us: list[tuple[str, float]]) -> list[dict]:
    """``_mechanism_rows`` of a warm-protocol run ``m`` in its own probe units (``m["op"]
    ["fwd"]`` us per eager op, also written as the rows' ``op_fwd_us_same_run``)."""
    op = m["op"]["fwd"]
    return _mechanism_rows({**base, "op_fwd_us_same_run": round(op, 2)}, op, mechanism, how,
                           values_us)


def _param_tensors(model) -> int:
    return sum(1 for _ in model.parameters())


def _wrapped(layers: int, wrap, split: bool = False, bf16: bool = False):
    """(forward, backward, parameter tensors) of the probe decoder, wrapped by ``wrap``;
    ``split``: one Linear per projection; ``bf16``: the bare model's parameters in bf16
    (the compute dtype a mixed-precision wrapper casts to, so the difference is the
    wrapper's own work)."""
    import torch

    from .torch_model import build_model, synthetic_batch
    spec = probe_spec(layers)
    model = build_model(spec, split=split)
    n = _param_tensors(model)
    if bf16 and not wrap:
        model = model.to(torch.bfloat16)
    model = wrap(model) if wrap else model
    tokens, targets = synthetic_batch(spec, 1)
    torch.manual_seed(0)
    return (lambda: model(tokens, targets)), loss_backward(model), n


def _extra_us(wrap, split: bool = False, bf16: bool = False) -> tuple[float, float, int, int]:
    """(extra fwd us, extra bwd us, parameter tensors, units) of ``wrap`` over the bare
    decoder, as the difference between the two probe sizes (all four interleaved)."""
    cases, tensors = {}, {}
    for n in HOST_LAYERS:
        cases[("bare", n)] = _wrapped(n, None, split, bf16)[:2]
        fw, bw, tensors[n] = _wrapped(n, wrap, split, bf16)
        cases[("wrapped", n)] = (fw, bw)
    t = _low_us(cases)
    lo, hi = HOST_LAYERS
    ex = {n: (t[("wrapped", n)][0] - t[("bare", n)][0], t[("wrapped", n)][1] - t[("bare", n)][1])
          for n in HOST_LAYERS}
    return (ex[hi][0] - ex[lo][0], ex[hi][1] - ex[lo][1], tensors[hi] - tensors[lo], hi - lo)


def _ddp(model):
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
    from torch.nn.parallel import DistributedDataParallel
    d = DistributedDataParallel(model, bucket_cap_mb=25)
    d.register_comm_hook(None, noop_hook)
    return d


def _fsdp(model):
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    block = type(model.blocks[0])
    return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({block}),
                                    sharding_strategy=ShardingStrategy.FULL_SHARD,
                                    device_id=torch.device("cpu"), use_orig_params=True,
                                    limit_all_gathers=True)


def _fsdp2(model):
    """FSDP2 as torchtitan applies it: fully_shard per block and the root, with
    MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (torchtitan apply_fsdp)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh("cpu", (2,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    return fully_shard(model, mesh=mesh, mp_policy=mp)


def fsdp2_rows(base: dict, op: float) -> list[dict]:
    """``fsdp2_unit`` rows: per unit and pass, for blocks of 6 parameter tensors (fused qkv
    and up projections) and of 9 (one Linear per projection, as torchtitan's Llama), under
    torchtitan's mixed precision, against the bare model in bf16."""
    rows = []
    for split in (False, True):
        f, b, tensors, units = _extra_us(_fsdp2, split=split, bf16=True)
        per = tensors // units
        rows += _mechanism_rows(base, op, "fsdp2_unit", "FSDP2 fully_shard per block + root, "
                                "MixedPrecisionPolicy(bf16, fp32), fake pg x2 - bare model in "
                                f"bf16, 5 vs 1 layers ({units} units, {per} tensors each)",
                                [(f"per unit of {per} tensors, {pas}", v / units)
                                 for pas, v in (("fwd", f), ("bwd", b))])
    return rows


def deepspeed_loop_us(tensors: int = 64, repeats: int = 200) -> float:
    """Per parameter tensor: the BF16_Optimizer gradient loop on tiny tensors."""
    import torch
    lp = [torch.zeros(32, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(tensors)]
    hp = [torch.zeros(32, 32) for _ in range(tensors)]

    @torch.no_grad()
    def loop():
        for p, g in zip(lp, hp):
            p.grad = torch.ones_like(p)
        t0 = time.perf_counter()
        for p, g in zip(lp, hp):
            g.data.add_(p.grad.data.to(g.dtype).view(g.shape))
            p._hp_grad = g
            p.grad = None
        return time.perf_counter() - t0
    samples = sorted(loop() for _ in range(repeats))
    return samples[len(samples) // 10] / tensors * 1e6


def mcore_optimizer_loop_us(tensors: int = 64, repeats: int = 200) -> float:
    """Per local parameter tensor: the host work of Megatron-Core's DistributedOptimizer
    step after its grad-norm read (``get_grad_norm_fp32``'s ``.item()``, a host sync), on the
    GPU path (multi-tensor kernels, one launch each, are not per tensor): clip's
    ``param.grad.detach()`` (clip_grads.py clip_grad_by_total_norm_fp32) and
    ``copy_group_params``' range-map lookups, ``param_data.view(-1)[start:end]`` and
    ``.data.copy_(shard_main_param)`` (distrib_optimizer.py @ d98e8a64 L2862-2886), on tiny
    fp32 tensors."""
    import torch
    params = [torch.zeros(32, 32, requires_grad=True) for _ in range(tensors)]
    for p in params:
        p.grad = torch.ones_like(p)
    buffer = torch.zeros(tensors * 32 * 32)
    shards = [torch.ones(32 * 32) for _ in range(tensors)]
    ranges = {p: {"gbuf_world_in_bucket": (i * 1024, (i + 1) * 1024)} for i, p in enumerate(params)}
    gbuf = {p: (0, None, 0) for p in params}

    @torch.no_grad()
    def loop():
        t0 = time.perf_counter()
        grads = [p.grad.detach() for p in params if p.grad is not None]
        for shard, p in zip(shards, params):
            start, end = ranges[p]["gbuf_world_in_bucket"]
            assert end - start == shard.nelement()
            _, _, bucket = gbuf[p]
            buffer.view(-1)[start:end].data.copy_(shard)
        dt = time.perf_counter() - t0
        return dt if grads else 0.0
    samples = sorted(loop() for _ in range(repeats))
    return samples[len(samples) // 10] / tensors * 1e6


def _init_fake_pg() -> None:
    """The fake 2-rank process group (collectives are calls only), once per process."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)


def device_calls(fn: Callable[[], object], steps_on_device: bool = False) -> list[tuple]:
    """(op, args, kwargs) of the calls one run of ``fn`` dispatches that take a tensor of
    more than 0 dimensions, alone or in a list: those touching parameter-shaped (device)
    tensors; the 0-dim step counters (on the CPU on a CUDA host unless ``steps_on_device``,
    as fused AdamW keeps them: then any tensor counts), ``.item()`` and the scalar norm math
    stay out."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    calls: list[tuple] = []
    least = 0 if steps_on_device else 1

    def shaped(x) -> bool:
        xs = x if isinstance(x, (list, tuple)) else [x]
        return any(isinstance(t, torch.Tensor) and t.dim() >= least for t in xs)

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if any(shaped(a) for a in (*args, *kwargs.values())):
                calls.append((func, args, kwargs))
            return func(*args, **kwargs)
    with Record():
        fn()
    return calls


def replay(fn: Callable[[], object], steps_on_device: bool = False) -> Callable[[], None]:
    """The ``device_calls`` of one run of ``fn``, re-issued alone (under no_grad, as the
    optimizer and clip run): on this CPU, the foreach ops' per-tensor slow path."""
    import torch
    calls = device_calls(fn, steps_on_device)

    @torch.no_grad()
    def run() -> None:
        for func, args, kwargs in calls:
            func(*args, **kwargs)
    return run
