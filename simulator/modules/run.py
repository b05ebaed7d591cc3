"""Real training steps of a traced model on this machine, and the check against prediction.

``measure`` spawns ``world`` local processes (gloo, ``threads`` intra-op threads each, as
``torchrun`` sets ``OMP_NUM_THREADS=1`` for several processes per host), wraps the model
in ``DistributedDataParallel`` with the given bucket size, runs ``warmup + steps`` training
steps (zero_grad, forward, loss, backward, optimizer step) and reports the median step
time (per step, the slowest rank) after warm-up, plus the bucket sizes the Reducer built.
``predict`` traces the same factory on the meta device, prices it with a calibrated CPU
profile (``complexity calibrate --quick --out DIR`` writes ``DIR/profile_1thread.json``)
and simulates the DDP step (``simulator.modules.ddp``); with ``anchor`` (a compute-only run of
the same processes, ``measure(cfg, ddp=False)``) the op times are rescaled to the measured
forward / backward, which isolates the DDP bucket, overlap and communication model.
``validate`` interleaves the compute-only and DDP runs for several rounds and bucket sizes
and keeps each configuration's least-disturbed round (the host may be shared).
torch is imported inside functions only.
"""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import ComplexityError, InvalidInputError
from ..hardware.profile import Profile


class RunError(ComplexityError):
    """The worker processes of a real run failed before reporting."""


def spawn_workers(fn: Callable, args: tuple, nprocs: int, out: str) -> dict:
    """``torch.multiprocessing.spawn`` and read rank 0's JSON result. A worker that dies
    after rank 0 wrote its result (gloo teardown can abort) does not lose the run."""
    import torch.multiprocessing as mp
    try:
        mp.spawn(fn, args=args, nprocs=nprocs, join=True)
    except Exception as exc:  # noqa: BLE001 - any worker failure becomes one line
        if not Path(out).is_file():
            raise RunError(f"{nprocs} worker processes failed: {type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:200]}") from None
    return json.loads(Path(out).read_text())


def load_factory(spec: str) -> Callable[[], Any]:
    """``"path/to/file.py:factory"`` -> the callable (imported by path)."""
    path, sep, name = str(spec).rpartition(":")
    if not sep or not path.endswith(".py") or not name:
        raise InvalidInputError("module", spec, "FILE.py:FACTORY, e.g. examples/module_zoo.py:resnet50")
    p = Path(path)
    if not p.is_file():
        raise InvalidInputError("module", spec, "an existing Python file before the ':'")
    mod_name = "complexity_user_" + "".join(c if c.isalnum() else "_" for c in str(p.resolve()))
    spec_ = importlib.util.spec_from_file_location(mod_name, p)
    mod = importlib.util.module_from_spec(spec_)
    try:
        import warnings
        with warnings.catch_warnings():      # torch's import-time pynvml notice
            warnings.filterwarnings("ignore", message=".*pynvml.*", category=FutureWarning)
            spec_.loader.exec_module(mod)
    except Exception as exc:  # noqa: BLE001 - user code; one line
        raise InvalidInputError("module", spec, "a file that imports cleanly",
                                f"{type(exc).__name__}: {exc}") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise InvalidInputError("module", spec, f"a callable named {name!r} in {path}")
    return fn


@dataclass(frozen=True)
class RunConfig:
    factory: str                           # FILE.py:FACTORY
    world: int = 2
    bucket_cap_mb: float | None = None     # MiB, torch's meaning; None = torch default
    steps: int = 20
    warmup: int = 5
    threads: int = 1
    optimizer: str = "sgd"
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    hook: str = "none"                     # none, fp16, bf16, powersgd
    powersgd_rank: int = 1
    seed: int = 0


@dataclass(frozen=True)
class Measured:
    config: RunConfig
    median_s: float
    p10_s: float
    p90_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    step_times_s: tuple[float, ...]
    bucket_sizes_bytes: tuple[int, ...]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _make_optimizer(torch: Any, name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9)
    if name in ("adam", "adamw"):
        return (torch.optim.AdamW if name == "adamw" else torch.optim.Adam)(params, lr=1e-5)
    if name == "none":
        return None
    raise InvalidInputError("optimizer", name, "none, sgd, sgd-momentum, adam, adamw")


def _register_hook(dist_model: Any, cfg: RunConfig) -> None:
    """fp16 / bf16 / PowerSGD hooks. Caution: on gloo, PowerSGD's callbacks block a gloo
    worker thread on nested all-reduces; many small buckets in flight can deadlock."""
    if cfg.hook == "none":
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if cfg.hook in ("fp16", "bf16"):
        fn = default_hooks.fp16_compress_hook if cfg.hook == "fp16" else default_hooks.bf16_compress_hook
        dist_model.register_comm_hook(None, fn)
        return
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=cfg.powersgd_rank,
                                        start_powerSGD_iter=2, warm_start=True, use_error_feedback=True)
    dist_model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def _train_steps(torch: Any, model: Any, opt: Any, args, kwargs, loss_fn, n: int,
                 sync: Callable | None = None) -> list[list[float]]:
    from .trace_torch import _default_loss
    rows = []
    for _ in range(n):
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        out = model(*args, **kwargs)
        loss = loss_fn(out) if loss_fn is not None else _default_loss(torch, out)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if opt is not None:
            opt.step()
        t3 = time.perf_counter()
        rows.append([t3 - t0, t1 - t0, t2 - t1, t3 - t2])
    return rows


def _bucket_sizes(model: Any) -> list[int]:
    try:
        data = model._get_ddp_logging_data()
    except Exception:  # noqa: BLE001 - private API; best effort
        return []
    raw = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""
    return [int(x) for x in str(raw).replace(",", " ").split() if x.strip().isdigit()]


def _worker(rank: int, cfg: RunConfig, port: int, out_path: str, ddp: bool = True) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .trace_torch import _split_inputs, build_from_factory
    torch.set_num_threads(cfg.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=cfg.world)
    try:
        torch.manual_seed(cfg.seed)
        module, inputs, loss_fn, _ = build_from_factory(load_factory(cfg.factory), on_meta=False)
        args, kwargs = _split_inputs(inputs)
        model = module
        if ddp:
            model = DDP(module, bucket_cap_mb=cfg.bucket_cap_mb, static_graph=cfg.static_graph,
                        gradient_as_bucket_view=cfg.gradient_as_bucket_view)
            _register_hook(model, cfg)
        opt = _make_optimizer(torch, cfg.optimizer, model.parameters())
        sync = None if ddp else dist.barrier           # keep compute-only ranks in step
        rows = _train_steps(torch, model, opt, args, kwargs, loss_fn, cfg.warmup + cfg.steps, sync)
        t = torch.tensor(rows, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            Path(out_path).write_text(json.dumps({"rows": t.tolist(), "buckets": _bucket_sizes(model)}))
    finally:
        dist.destroy_process_group()


def measure(cfg: RunConfig, ddp: bool = True) -> Measured:
    """Run the real DDP training steps (see module doc); ``ddp=False``: the same processes
    run the same steps without DDP (no gradient communication), started together."""
    if cfg.world < 1 or cfg.steps < 1:
        raise InvalidInputError("world/steps", (cfg.world, cfg.steps), "positive counts")
    load_factory(cfg.factory)                        # fail fast, in this process
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        data = spawn_workers(_worker, (cfg, _free_port(), out, ddp), cfg.world, out)
    rows = data["rows"][cfg.warmup:]
    steps = sorted(r[0] for r in rows)
    q = lambda f: steps[min(len(steps) - 1, int(f * len(steps)))]
    med = lambda i: statistics.median(r[i] for r in rows)
    return Measured(cfg, statistics.median(steps), q(0.1), q(0.9), med(1), med(2), med(3),
                    tuple(r[0] for r in rows), tuple(data["buckets"]))


# ---- prediction and comparison -----------------------------------------------------------------
@dataclass(frozen=True)
class Predicted:
    step_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    exposed_comm_s: float
    bucket_sizes_bytes: tuple[int, ...]


def anchor_times(g, times: Sequence[float], local: Measured) -> list[float]:
    """Op times rescaled per phase so forward (+ loss) and backward add up to a measured
    compute-only step (``measure(cfg, ddp=False)``): isolates the DDP model's error."""
    from ..workload.traced import BACKWARD
    fwd = sum(t for o, t in zip(g.ops, times) if o.phase != BACKWARD) or 1.0
    bwd = sum(t for o, t in zip(g.ops, times) if o.phase == BACKWARD) or 1.0
    return [t * (local.backward_s / bwd if o.phase == BACKWARD else local.forward_s / fwd)
            for o, t in zip(g.ops, times)]


def predict(cfg: RunConfig, prof: Profile, graph=None, anchor: Measured | None = None) -> Predicted:
    """Predicted step time of ``cfg`` on the device ``prof`` describes (a measured CPU);
    with ``anchor`` the compute comes from that compute-only run (see ``anchor_times``)."""
    from ..hardware.specs import ClusterSpec
    from .compression import CompressionSpec
    from .ddp import DDPConfig, dp_comm, simulate_ddp
    from .op_report import price_graph
    from .trace_torch import trace_factory
    if prof.device is None or prof.node is None:
        raise InvalidInputError("profile", prof.name, "a measured profile that carries its device "
                                "and node (`complexity calibrate --out DIR` writes one)")
    g = graph if graph is not None else trace_factory(load_factory(cfg.factory))
    cluster = ClusterSpec(gpu=prof.device, node=prof.node, n_gpus=cfg.world)
    ddp_cfg = DDPConfig(bucket_cap_mib=cfg.bucket_cap_mb, static_graph=cfg.static_graph,
                        gradient_as_bucket_view=cfg.gradient_as_bucket_view,
                        compression=CompressionSpec(cfg.hook, rank=cfg.powersgd_rank))
    times = price_graph(g, prof.device, prof)
    if anchor is not None:
        times = anchor_times(g, times, anchor)
    r = simulate_ddp(g, times, dp_comm(cluster, prof, cfg.world), ddp_cfg, prof.device, prof,
                     optimizer=cfg.optimizer,
                     optimizer_s=anchor.optimizer_s if anchor is not None else None)
    return Predicted(r.step_time_s, r.forward_s, r.backward_s, r.optimizer_s, r.exposed_comm_s,
                     tuple(b.nbytes for b in r.buckets))


@dataclass(frozen=True)
class CheckRow:
    factory: str
    bucket_cap_mb: float | None
    measured_s: float                    # median DDP step
    predicted_s: float                   # profile only
    error_pct: float
    compute_only_s: float                # median step of the same ranks without DDP
    anchored_s: float                    # measured compute + the DDP model
    anchored_error_pct: float
    measured_fwd_s: float
    predicted_fwd_s: float
    measured_bwd_s: float                # backward incl. waiting for the last all-reduce
    predicted_bwd_s: float               # backward compute only
    measured_buckets: tuple[int, ...]
    predicted_buckets: tuple[int, ...]
    spread_pct: float = 0.0              # slowest round's median over the one reported


def _least_disturbed(runs: Sequence[Measured]) -> Measured:
    """The round with the lowest median step: other work on a shared host only adds time."""
    return min(runs, key=lambda m: (m.median_s, m.p10_s))


def validate(factory: str, prof: Profile, bucket_caps: Sequence[float | None] = (1.0, 25.0),
             base: RunConfig | None = None, rounds: int = 3) -> list[CheckRow]:
    """Measure and predict ``factory`` under DDP for each bucket cap (MiB). The compute-only
    run and the DDP runs are interleaved for ``rounds`` rounds; each configuration reports
    its least-disturbed round (``spread_pct`` says how far the rounds were apart)."""
    from .trace_torch import trace_factory
    base = replace(base or RunConfig(factory), factory=factory)
    graph = trace_factory(load_factory(factory))
    cfgs = [replace(base, bucket_cap_mb=cap) for cap in bucket_caps]
    local_runs: list[Measured] = []
    ddp_runs: list[list[Measured]] = [[] for _ in cfgs]
    for _ in range(max(1, rounds)):
        local_runs.append(measure(base, ddp=False))
        for i, cfg in enumerate(cfgs):
            ddp_runs[i].append(measure(cfg))
    local = _least_disturbed(local_runs)
    rows = []
    for cfg, runs in zip(cfgs, ddp_runs):
        m, p = _least_disturbed(runs), predict(cfg, prof, graph)
        a = predict(cfg, prof, graph, anchor=local)
        pct = lambda x: 100.0 * (x - m.median_s) / m.median_s
        spread = 100.0 * (max(r.median_s for r in runs) / m.median_s - 1.0)
        rows.append(CheckRow(factory, cfg.bucket_cap_mb, m.median_s, p.step_s, pct(p.step_s),
                             local.median_s, a.step_s, pct(a.step_s), m.forward_s, p.forward_s,
                             m.backward_s, p.backward_s, m.bucket_sizes_bytes,
                             p.bucket_sizes_bytes, spread))
    return rows


def format_rows(rows: Sequence[CheckRow]) -> str:
    lines = [f"{'model':16s} {'bucket MiB':>10s} {'measured ms':>12s} {'predicted ms':>13s} "
             f"{'error':>7s} {'no-DDP ms':>10s} {'anchored ms':>12s} {'error':>7s} {'spread':>7s}  buckets"]
    for r in rows:
        cap = "default" if r.bucket_cap_mb is None else f"{r.bucket_cap_mb:g}"
        same = "same as DDP's" if list(r.measured_buckets) == list(r.predicted_buckets) else "DIFFER"
        lines.append(f"{r.factory.rpartition(':')[2][:16]:16s} {cap:>10s} {r.measured_s * 1e3:12.1f} "
                     f"{r.predicted_s * 1e3:13.1f} {r.error_pct:+6.1f}% {r.compute_only_s * 1e3:10.1f} "
                     f"{r.anchored_s * 1e3:12.1f} {r.anchored_error_pct:+6.1f}% {r.spread_pct:6.0f}%  "
                     f"{len(r.predicted_buckets)} ({same})")
    return "\n".join(lines)


def rows_to_dicts(rows: Sequence[CheckRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
