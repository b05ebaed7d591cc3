"""The DDP bucket model and the compression hooks against torch's real implementations (CPU,
gloo). One-process groups are enough: the Reducer builds the same buckets and calls the comm
hook with the same buckets whatever the world size; the 2-process timing run is ``slow``."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.torch

ZOO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file()) / "examples" / "module_zoo.py"


@pytest.fixture(scope="module")
def zoo():
    spec = importlib.util.spec_from_file_location("module_zoo_real", ZOO)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def group(tmp_path):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("gloo not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _ddp(module, **kw):
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(module, **kw)


def _steps(ddp, x, loss_fn, n):
    for _ in range(n):
        ddp.zero_grad()
        out = ddp(*x)
        (loss_fn(out) if loss_fn else out.sum()).backward()


def _record_all_reduce(monkeypatch) -> list:
    sizes: list = []
    orig = dist.all_reduce

    def rec(t, *a, **k):
        sizes.append((t.numel(), str(t.dtype)))
        return orig(t, *a, **k)
    monkeypatch.setattr(dist, "all_reduce", rec)
    return sizes


def _trace(factory):
    from simulator.modules.trace_torch import trace_factory
    return trace_factory(factory)


@pytest.mark.parametrize("cap", [None, 1.0, 5.0])
def test_buckets_match_the_reducer(zoo, group, cap):
    from simulator.modules.ddp import DDPConfig, assign_buckets
    torch.manual_seed(0)
    module, x, loss_fn = zoo.small_cnn(batch=2)
    ddp = _ddp(module, bucket_cap_mb=cap)
    _steps(ddp, x, loss_fn, 3)                    # the rebuilt buckets are logged after step 2
    data = ddp._get_ddp_logging_data()
    real = [int(s) for s in str(data["rebuilt_bucket_sizes"]).split(",")]
    names = [n for n, _ in module.named_parameters()]
    real_idx = [[names[int(i)] for i in part.split()]
                for part in str(data["rebuilt_per_bucket_param_indices"]).split(",")]
    ours = assign_buckets(_trace(lambda: zoo.small_cnn(batch=2)), DDPConfig(bucket_cap_mib=cap))
    assert [b.nbytes for b in ours] == real
    assert [list(b.params) for b in ours] == real_idx


@pytest.mark.parametrize("rank", [1, 2, 8])
def test_powersgd_wire_bytes_match_the_hook(zoo, group, monkeypatch, rank):
    """One bucket: the hook blocks a gloo worker thread on its nested all-reduces, so two
    buckets in flight on a one-process group can take both threads and deadlock."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    from simulator.modules.compression import powersgd_split
    from simulator.modules.ddp import DDPConfig, assign_buckets
    torch.manual_seed(0)
    module, x, loss_fn = zoo.small_cnn(batch=2)
    ddp = _ddp(module, bucket_cap_mb=100)
    state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                             start_powerSGD_iter=2, warm_start=True, use_error_feedback=True)
    ddp.register_comm_hook(state, ps.powerSGD_hook)
    _steps(ddp, x, loss_fn, 3)                    # rebuild buckets, start PowerSGD
    sizes = _record_all_reduce(monkeypatch)
    _steps(ddp, x, loss_fn, 1)
    buckets = assign_buckets(_trace(lambda: zoo.small_cnn(batch=2)), DDPConfig(bucket_cap_mib=100))
    assert len(buckets) == 1 and len(buckets[0].params) == 36
    expect = [n for b in buckets for n in powersgd_split(b.shapes, rank).message_numels()]
    assert [n for n, _ in sizes] == expect
    assert {d for _, d in sizes} == {"torch.float32"}


def test_fp16_hook_halves_the_bytes(zoo, group, monkeypatch):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    import hardware_db
    from simulator.modules.compression import CompressionSpec, bucket_steps
    from simulator.modules.ddp import DDPConfig, assign_buckets
    torch.manual_seed(0)
    module, x, loss_fn = zoo.small_cnn(batch=2)
    ddp = _ddp(module, bucket_cap_mb=5)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    _steps(ddp, x, loss_fn, 2)
    sizes = _record_all_reduce(monkeypatch)
    _steps(ddp, x, loss_fn, 1)
    gpu, prof = hardware_db.load_gpu("h100-sxm"), hardware_db.load_profile("h100-sxm")
    buckets = assign_buckets(_trace(lambda: zoo.small_cnn(batch=2)), DDPConfig(bucket_cap_mib=5))
    steps = [bucket_steps(b.shapes, 4, "fp32", CompressionSpec("fp16"), gpu, prof) for b in buckets]
    assert [2 * n for n, _ in sizes] == [s.nbytes for st in steps for s in st if s.kind == "comm"]
    assert {d for _, d in sizes} == {"torch.float16"}


@pytest.mark.slow
def test_two_process_run_and_prediction(tmp_path):
    """A real 2-process gloo DDP run: the Reducer's buckets equal the model's, and the
    prediction with a loaded-CPU profile is finite and positive (accuracy: see the report)."""
    from simulator.modules.calib import build_profile
    from simulator.modules.run import RunConfig, measure, predict
    cfg = RunConfig(f"{ZOO}:mlp", world=2, bucket_cap_mb=5, steps=3, warmup=2)
    m = measure(cfg)
    fit = {"peak_gflops": 50.0, "k_half": 16.0, "launch_us": 5.0, "conv_eff": 1.0,
           "mem_bw_gbytes_per_s": 20.0, "mem_launch_us": 5.0, "link_gbytes_per_s": 1.0,
           "alpha_us": 50.0, "small_bw_eff": 0.5, "base_us": 200.0, "overlap_slowdown": 1.2}
    p = predict(cfg, build_profile(fit, 2, 1))
    assert m.median_s > 0 and p.step_s > 0
    assert list(m.bucket_sizes_bytes) == list(p.bucket_sizes_bytes)
