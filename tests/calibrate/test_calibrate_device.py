"""The device-generic benchmark core: timers, cache-flush sizing, clock logging, naming the
GPU, and the GPU runner on this CPU through the same code path (no GPU needed)."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from calibrate.budget import GpuPlan, Point, candidate_points, target_for
from calibrate.device import (
    GPU_FLUSH_MIN_BYTES,
    BenchDevice,
    ClockLog,
    CudaEventTimer,
    WallTimer,
    cpu_device,
    flush_bytes_for,
    gpu_key_for,
    reason_names,
    slowed,
)
from calibrate.discover import visible_indices
from calibrate.store import time_call


class FakeClock:
    """A device clock: each event records the fake time; kernels advance it."""

    def __init__(self) -> None:
        self.now_ms, self.log = 0.0, []


class FakeEvent:
    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.t_ms, self.synced = clock, None, False

    def record(self) -> None:
        self.t_ms = self.clock.now_ms
        self.clock.log.append("record")

    def synchronize(self) -> None:
        self.synced = True
        self.clock.log.append("synchronize")

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert end.synced, "elapsed_time read before the end event completed"
        return end.t_ms - self.t_ms


def test_cuda_event_timer_brackets_the_call_and_converts_ms():
    clock = FakeClock()
    timer = CudaEventTimer(event_factory=lambda: FakeEvent(clock),
                           synchronize=lambda: clock.log.append("device_sync"))

    def kernel():
        clock.log.append("kernel")
        clock.now_ms += 2.5
    assert timer.sample(kernel) == pytest.approx(2.5e-3)
    assert clock.log == ["record", "kernel", "record", "synchronize"]
    timer.sync()
    assert clock.log[-1] == "device_sync"
    assert timer.kind == "cuda_event"


def test_wall_timer_syncs_before_and_after():
    calls = []
    timer = WallTimer(sync=lambda: calls.append("sync"))
    dt = timer.sample(lambda: calls.append("fn"))
    assert calls == ["sync", "fn", "sync"] and dt >= 0.0


class ScriptedTimer:
    """Returns the given samples in order; counts calls (a fake device timer)."""

    kind = "fake"

    def __init__(self, samples):
        self.samples, self.calls = list(samples), 0

    def sample(self, fn):
        fn()
        self.calls += 1
        return self.samples.pop(0)

    def sync(self):
        pass


def test_time_call_takes_samples_from_the_timer_and_flushes_before_each():
    timer = ScriptedTimer([3.0, 1.0, 2.0, 5.0])
    setups, runs = [], []
    st = time_call(lambda: runs.append(1), warmup=2, repeats=4, budget_s=60.0,
                   setup=lambda: setups.append(1), timer=timer)
    assert timer.calls == 4 and st.n_samples == 4
    assert st.median_s == pytest.approx(2.5)            # median of 3, 1, 2, 5
    assert len(runs) == 6 and len(setups) == 6           # warm-up calls flushed too


@pytest.mark.parametrize("l2, want", [(50e6, GPU_FLUSH_MIN_BYTES), (60e6, GPU_FLUSH_MIN_BYTES),
                                      (126e6, 504e6)])
def test_gpu_flush_is_256_mib_or_4x_l2(l2, want):
    assert flush_bytes_for("cuda", l2) == int(want)


def test_cpu_flush_is_3x_l3_at_most_256_mib():
    assert flush_bytes_for("cpu", 32 * 2 ** 20) == 96 * 2 ** 20
    assert flush_bytes_for("cpu", 512 * 2 ** 20) == 256 * 2 ** 20


@pytest.mark.parametrize("name, mem_gb, key", [
    ("NVIDIA H200", 143, "h200-sxm"), ("NVIDIA H100 80GB HBM3", 85, "h100-sxm"),
    ("NVIDIA A100-SXM4-40GB", 42, "a100-sxm-40gb"), ("NVIDIA A100-SXM4-80GB", 85, "a100-sxm-80gb"),
    ("NVIDIA A100 80GB PCIe", 85, "a100-pcie-80gb"), ("NVIDIA H100 PCIe", 85, "h100-pcie"),
    ("Tesla V100-SXM2-32GB", 34, "v100-sxm-32gb"), ("NVIDIA B200", 190, "b200"),
    ("NVIDIA GeForce RTX 4090", 24, None), ("GAUDI2", 96, "gaudi2"),
    ("Intel Gaudi 2", 96, "gaudi2"), ("HL-225H", 96, "gaudi2"), ("GAUDI3", 128, "gaudi3"),
    ("HL-325L", 128, "gaudi3")])
def test_gpu_key_for_names_the_datasheet(name, mem_gb, key):
    assert gpu_key_for(name, mem_gb * 1e9) == key


def test_visible_indices_follow_cuda_visible_devices():
    assert visible_indices(8, None) == list(range(8))
    assert visible_indices(8, "3,1") == [3, 1]
    assert visible_indices(4, "1,9,2") == [1]            # CUDA stops at an invalid entry
    assert visible_indices(4, "") == []
    assert visible_indices(2, "GPU-1234") == [0, 1]      # UUIDs: left to NVML order


class FakeNvml:
    NVML_CLOCK_SM = 1

    def __init__(self, mask: int) -> None:
        self.mask = mask

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"h{i}"

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1755

    def nvmlDeviceGetPowerUsage(self, h):
        return 690_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.mask

    def nvmlSystemGetDriverVersion(self):
        return b"580.1"


def test_clock_log_reads_clock_power_and_reasons():
    log = ClockLog(0, nvml=FakeNvml(0x4 | 0x40))
    s = log.sample()
    assert s == {"sm_clock_mhz": 1755, "power_w": 690.0,
                 "clock_reasons": "sw_power_cap,hw_thermal"}
    assert slowed(s) and log.driver() == "580.1"
    assert not slowed(ClockLog(0, nvml=FakeNvml(0x4)).sample())   # the power cap is normal
    assert reason_names(0x1 | 0x100) == ("gpu_idle", "display_clocks")


def test_clock_log_without_nvml_is_empty():
    class Broken:
        @staticmethod
        def nvmlInit():
            raise RuntimeError("no driver")
    log = ClockLog(0, nvml=Broken)
    assert log.sample() == {"sm_clock_mhz": 0, "power_w": 0.0, "clock_reasons": ""}
    assert log.driver() == ""


# ---- the GPU runner on this CPU -----------------------------------------------------------
def _small_attention(p: Point) -> Point:
    """An attention point of the plan with one sequence of 2 heads of at most 256 tokens."""
    q = {**p.p, "batch": 1, "heads": 2, "seq": min(256, p.p["seq"])}
    key = f"1x2x{q['seq']}x{q['head_dim']}:{q['dtype']}:{q['backend']}:{q['pass']}"
    return replace(p, key=key, params=tuple(q.items()))


def tiny_plan(settle_s: float = 0.0) -> GpuPlan:
    """The GPU plan's own points, shrunk to shapes a CPU runs in milliseconds."""
    t = target_for("h200-sxm", 1)
    keep: dict[str, Point] = {}
    for p in candidate_points(t):
        q = p.p
        if (p.bench == "gemm" and max(q["m"], q["n"], q["k"]) <= 512 and q["dtype"] != "tf32") \
                or (p.bench == "memory" and q["elems"] <= 2 ** 17):
            keep[p.key] = p
        elif p.bench == "attention" and q["head_dim"] == 128 and q["seq"] <= 1024:
            small = _small_attention(p)
            keep[small.key] = small
    return GpuPlan(t, None, tuple(keep.values()), (), {"clock settle": settle_s})


FAST = {"warmup": 1, "repeats": 3, "budget_s": 0.02}


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    from calibrate.bench_gpu import run_compute
    out = tmp_path_factory.mktemp("cpu-run")
    env = {"device": "cpu-test", "torch_version": "t"}
    plan = tiny_plan()
    rep = run_compute(out, env, plan, cpu_device(), time.perf_counter() + 600, quiet=True,
                      timing=FAST)
    return out, env, plan, rep


def test_gpu_runner_runs_on_cpu_and_writes_gpu_format_rows(cpu_run):
    out, _, plan, rep = cpu_run
    assert {p.bench for p in plan.points} == {"gemm", "memory", "attention"}
    assert rep.measured > 0
    gemm = pq.read_table(out / "measurements" / "gemm.parquet").to_pylist()
    assert {r["dtype"] for r in gemm} >= {"bf16", "fp8"}
    assert all(r["flops"] == 2.0 * r["m"] * r["n"] * r["k"] and r["timer"] == "wall"
               and r["device_name"] == "cpu" and r["median_s"] > 0 for r in gemm)
    assert {r["layout"] for r in gemm if r["dtype"] == "fp8"} == {"NT"}
    att = pq.read_table(out / "measurements" / "attention.parquet").to_pylist()
    assert {r["pass"] for r in att} == {"fwd", "fwd_bwd"} and all(r["flops_fwd"] > 0 for r in att)
    mem = pq.read_table(out / "measurements" / "memory.parquet").to_pylist()
    copy = [r for r in mem if r["kernel"] == "copy"]
    assert copy and all(r["bytes_moved"] == 8.0 * r["elems"] for r in copy)
    bf = [r for r in mem if r["dtype"] == "bf16"]
    assert all(r["bytes_moved"] > 0 and r["cols"] == 4096 for r in bf)


def test_a_group_that_cannot_run_is_skipped_with_one_note(cpu_run):
    _, _, plan, rep = cpu_run
    # the cuDNN attention kernel does not exist on a CPU: its points are skipped, not fatal
    assert any(p.group == "cudnn attention bf16" for p in plan.points)
    assert "cudnn attention bf16" in rep.failed
    assert any(n.startswith("skipped cudnn attention bf16") for n in rep.notes())


def test_gpu_runner_resumes_stored_points(cpu_run):
    from calibrate.bench_gpu import run_compute
    out, env, plan, first = cpu_run
    again = run_compute(out, env, plan, cpu_device(), time.perf_counter() + 600, quiet=True,
                        timing=FAST)
    assert again.measured == 0 and again.resumed == first.measured


def test_gpu_runner_stops_at_the_deadline(tmp_path: Path):
    from calibrate.bench_gpu import run_compute
    plan = tiny_plan()
    rep = run_compute(tmp_path, {"device": "cpu-test", "torch_version": "t"}, plan,
                      cpu_device(), time.perf_counter() - 1.0, quiet=True, timing=FAST)
    assert rep.measured == 0 and rep.over_budget == len(plan.points)
    assert "re-run the same command" in rep.notes()[-1]


def test_the_slowed_clock_flag_marks_points_suspect(tmp_path: Path):
    from calibrate.bench_gpu import run_compute
    t = target_for("h200-sxm", 1)
    pts = [p for p in candidate_points(t) if p.bench == "gemm" and p.p["m"] == 256]
    plan = GpuPlan(t, None, tuple(pts), (), {})
    run_compute(tmp_path, {"device": "cpu-test", "torch_version": "t"}, plan, cpu_device(),
                time.perf_counter() + 600, quiet=True, log=ClockLog(0, nvml=FakeNvml(0x40)),
                timing=FAST)
    rows = pq.read_table(tmp_path / "measurements" / "gemm.parquet").to_pylist()
    assert rows and all(r["suspect"] and r["clock_reasons"] == "hw_thermal" for r in rows)


def test_collectives_worker_runs_over_gloo(tmp_path: Path):
    """The NCCL benchmark's worker, over gloo on 2 CPU ranks: busbw as nccl-tests."""
    from calibrate.bench_nccl import run_collectives
    from calibrate.fit import busbw_factor
    from simulator.network.collectives import Collective
    t = target_for("h200-sxm", 2)
    pts = [p for p in candidate_points(t) if p.bench == "collectives"
           and p.p["size_bytes"] <= 4096 and p.p["algo"] == "default"
           and p.p["op"] in ("all_reduce", "all_gather")]
    pts.append(Point("interference", "span:mm32:ar4096:n2", (("gemm_n", 32),
                     ("allreduce_bytes", 4096), ("n_ranks", 2)), 0.1, 1, "interference"))
    left = run_collectives(tmp_path, {"device": "cpu-test", "torch_version": "t"}, pts, 2,
                           time.perf_counter() + 300, backend="gloo", quiet=True)
    assert left == 0
    rows = pq.read_table(tmp_path / "measurements" / "collectives.parquet").to_pylist()
    assert {r["op"] for r in rows} == {"all_reduce", "all_gather"}
    for r in rows:
        alg = r["size_bytes"] / r["median_s"] / 1e9
        assert r["algbw_gbytes_per_s"] == pytest.approx(alg)
        assert r["busbw_gbytes_per_s"] == pytest.approx(alg * busbw_factor(Collective(r["op"]), 2))
    inter = pq.read_table(tmp_path / "measurements" / "interference.parquet").to_pylist()
    assert inter[0]["mode"] == "span" and inter[0]["alone_s"] > 0 and inter[0]["comm_alone_s"] > 0


def test_bench_device_names():
    assert cpu_device().name == "cpu" and not cpu_device().is_cuda
    assert BenchDevice("cuda", 3, WallTimer(), 1).name == "cuda:3"


# ---- discovery -----------------------------------------------------------------------------
def test_discover_falls_back_to_torch_without_pynvml(monkeypatch):
    import calibrate.discover as disc
    gpu = disc.GpuInfo(0, "NVIDIA H200", 143e9, 0, 0, 0.0, 0, 0, 0, 132)
    monkeypatch.setattr(disc, "_nvml_gpus", lambda: None)
    monkeypatch.setattr(disc, "_torch_gpus", lambda: [gpu, gpu])
    info = disc.discover()
    assert info.kind == "cuda" and info.key == "cuda-nvidia-h200" and len(info.gpus) == 2
    assert "pynvml missing" in info.message and "no NVIDIA GPU found" not in info.message


class FakeTopoNvml:
    """Four GPUs: 0-1 and 2-3 joined by NVLink, the pairs across only by PCIe (SYS)."""

    NVML_P2P_CAPS_INDEX_NVLINK, NVML_P2P_STATUS_OK = 2, 0

    def nvmlDeviceGetP2PStatus(self, a, b, idx):
        assert idx == 2
        return 0 if {a, b} in ({0, 1}, {2, 3}) else 4          # 4: not supported

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return 50


def test_nvlink_is_per_pair_not_per_gpu():
    from calibrate.discover import _link
    nv = FakeTopoNvml()
    assert _link(nv, 0, 1) == "NVLINK" and _link(nv, 2, 3) == "NVLINK"
    assert _link(nv, 1, 2) == "SYS"                              # both have NVLinks up
