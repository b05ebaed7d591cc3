"""Kineto trace import: the call tree, op families, phases, host time, collectives and GPU
kernels, checked on synthetic traces whose every duration the test chose, and on two traces
a real profiler recorded on real GPUs (HolisticTraceAnalysis test data, MIT)."""
from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.trace_import import load_trace
from calibrate.trace_stats import clean_steps, measure_step
from simulator.errors import InvalidInputError

from kineto_synth import MAIN, Trace

HTA = Path(__file__).parent / "data" / "hta"


def cpu_step(tr: Trace, i: int) -> tuple[float, float, dict[str, float]]:
    """One training step; returns (start, end, leaf microseconds per family)."""
    start = tr.t
    tr.t += 2.0
    tr.leaf("aten::mm", 40.0, [(64, 32), (32, 96)], gap=5.0, wrappers=("aten::linear", "aten::matmul"))
    tr.leaf("aten::view", 1.0, [(64, 96)], gap=1.0)                     # host only
    tr.leaf("aten::native_layer_norm", 10.0, [(64, 32), (), (32,)], gap=3.0,
            wrappers=("aten::layer_norm",))
    tr.leaf("aten::_scaled_dot_product_flash_attention_for_cpu", 20.0,
            [(2, 4, 32, 8)] * 3, gap=2.0, concrete=("", "", "", "0.0", "True"),
            wrappers=("aten::scaled_dot_product_attention",))
    # cross-entropy: one claim, two leaves inside it
    ce = tr.t + 2.0
    tr.x("aten::cross_entropy_loss", ce, 16.0)
    tr.x("aten::_log_softmax", ce + 1.0, 8.0, **{"Input Dims": [[64, 128]]})
    tr.x("aten::nll_loss_forward", ce + 10.0, 4.0, **{"Input Dims": [[64, 128], [64]]})
    tr.t = ce + 16.0
    tr.leaf("aten::mm", 30.0, [(96, 64), (64, 32)], gap=4.0,
            wrappers=("autograd::engine::evaluate_function: MmBackward0", "MmBackward0"))
    tr.leaf("aten::mm", 25.0, [(64, 96), (96, 32)], gap=1.0,
            wrappers=("autograd::engine::evaluate_function: MmBackward0", "MmBackward0"))
    tr.leaf("aten::cat", 6.0, [(64, 32), (64, 32)], gap=2.0,
            wrappers=("autograd::engine::evaluate_function: SplitWithSizesBackward0",))
    opt = tr.t + 3.0
    tr.x("Optimizer.step#AdamW.step", opt, 14.0, cat="user_annotation")
    tr.x("aten::_fused_adamw_", opt + 2.0, 11.0, **{"Input Dims": [[4096]]})
    tr.t = opt + 14.0 + 2.0
    end = tr.t
    tr.step(i, start, end)
    return start, end, {"gemm": 95.0, "norm": 10.0, "attention": 20.0, "softmax": 12.0,
                        "optimizer": 11.0}


@pytest.fixture
def cpu_trace(tmp_path: Path) -> tuple[Path, float, dict[str, float]]:
    tr = Trace()
    walls = []
    for i in range(1, 5):
        s, e, fam = cpu_step(tr, i)
        walls.append(e - s)
    return tr.write(tmp_path / "cpu.json.gz"), walls[1], fam


def test_cpu_families_phases_and_host_time(cpu_trace):
    path, wall_us, fam_us = cpu_trace
    t = load_trace(path)
    assert t.device == "cpu" and not t.has_gpu and t.main_tid == MAIN and len(t.steps) == 4
    m = measure_step(t, t.steps[1])
    assert m.wall_s == pytest.approx(wall_us * 1e-6)
    for fam, us in fam_us.items():
        assert m.family_s[fam] == pytest.approx(us * 1e-6), fam
    assert m.other_s == {"cat": pytest.approx(6e-6)}          # unpriced: backward of a split
    leaves = sum(fam_us.values()) + 6.0
    assert m.host_s == pytest.approx((wall_us - leaves) * 1e-6)
    phases = {(o.name, o.phase) for o in t.ops if o.step == 1}
    assert ("aten::mm", "fwd") in phases and ("aten::mm", "bwd") in phases
    assert ("aten::_fused_adamw_", "opt") in phases
    assert {o.family for o in t.ops if o.name == "aten::nll_loss_forward"} == {"softmax"}
    assert not any(o.name == "aten::view" for o in t.ops)       # views are host time
    # host time before each operator, by the family it led to, adds up to the host time
    assert sum(m.host_by_family.values()) == pytest.approx(m.host_s)


def test_gloo_collective_exposed_while_the_main_thread_waits(tmp_path: Path):
    tr = Trace(dist={"backend": "gloo", "rank": 0, "world_size": 2})
    start = tr.t
    tr.leaf("aten::mm", 50.0, [(64, 32), (32, 96)], gap=2.0)
    blocked = tr.t + 1.0
    tr.x("c10d::allreduce_", blocked, 30.0, **{"Input Dims": [[[1000]], [], []]})
    tr.x("gloo:all_reduce", blocked + 2.0, 26.0, tid=200, **{"Input Dims": [[1000]],
                                                            "Input type": ["float"]})
    tr.t = blocked + 31.0
    tr.leaf("aten::mm", 20.0, [(64, 32), (32, 96)], gap=1.0)
    tr.step(1, start, tr.t + 1.0)
    t = load_trace(tr.write(tmp_path / "ddp.json"))
    assert (t.backend, t.world_size) == ("gloo", 2)
    dev = [c for c in t.comms if c.where == "device"]
    assert len(dev) == 1 and dev[0].collective == "all_reduce" and dev[0].size_bytes == 4000
    m = measure_step(t, t.steps[0])
    assert m.comm_s == pytest.approx(26e-6) and m.comm_exposed_s == pytest.approx(26e-6)
    assert m.comm_overlapped_s == 0.0
    assert m.host_s == pytest.approx(m.wall_s - 70e-6 - 26e-6)


def test_gpu_kernels_belong_to_the_op_that_launched_them(tmp_path: Path):
    tr = Trace(gpu_name="NVIDIA H100 80GB HBM3",
               dist={"backend": "nccl", "rank": 0, "world_size": 8})
    start = tr.t
    tr.leaf("aten::mm", 8.0, [(4096, 4096), (4096, 4096)], kernel_us=300.0,
            wrappers=("aten::linear",), dtype="c10::BFloat16")
    tr.leaf("aten::native_layer_norm", 6.0, [(4096, 4096)], kernel_us=40.0,
            dtype="c10::BFloat16")
    # an NCCL all-reduce on its own stream, half of it behind the layer norm's kernel
    k_ln = [e for e in tr.events if e["cat"] == "kernel"][-1]
    tr.launch(tr.t, 60.0, name="ncclKernel_AllReduce_RING_LL_Sum_bf16", stream=20)
    nccl = [e for e in tr.events if e["cat"] == "kernel"][-1]
    nccl["ts"] = k_ln["ts"] + 20.0
    nccl["args"].update({"Collective name": "allreduce", "In msg nelems": 1 << 20,
                         "dtype": "BFloat16", "Group size": 8})
    end = nccl["ts"] + nccl["dur"] + 10.0
    tr.step(1, start, end)
    t = load_trace(tr.write(tmp_path / "gpu.json"))
    assert t.has_gpu and t.device.startswith("NVIDIA H100")
    mm = next(o for o in t.ops if o.name == "aten::mm")
    assert mm.kernel_s == pytest.approx(300e-6) and mm.n_kernels == 1 and mm.dtype == "c10::BFloat16"
    m = measure_step(t, t.steps[0])
    assert m.family_s["gemm"] == pytest.approx(300e-6) and m.family_s["norm"] == pytest.approx(40e-6)
    comm = next(c for c in t.comms if c.where == "device")
    assert (comm.collective, comm.size_bytes, comm.group_size) == ("all_reduce", 2 * (1 << 20), 8)
    assert m.comm_overlapped_s == pytest.approx(20e-6)     # 20 us left of the norm kernel
    assert m.comm_exposed_s == pytest.approx(40e-6)
    busy = m.streams_s["stream 7"] + m.comm_exposed_s
    assert m.host_s == pytest.approx(m.wall_s - busy)      # device idle


def test_pressure_from_validate_run_selects_clean_steps(cpu_trace, tmp_path: Path):
    path, _, _ = cpu_trace
    import gzip
    import json
    d = json.load(gzip.open(path))
    d["complexity"] = {"traced_steps": [{"wall_s": 1, "pressure": p} for p in (0, 0.5, 0.0, 0.9)]}
    p2 = tmp_path / "p.json"
    p2.write_text(json.dumps(d))
    steps, note = clean_steps(load_trace(p2))
    assert [s.index for s in steps] == [2] and "1 of 3" in note


def test_bad_files_are_one_line_errors(tmp_path: Path):
    for name, text in (("missing.json", None), ("x.json", "{not json"), ("y.json", "[1, 2]"),
                       ("z.json", '{"traceEvents": []}')):
        p = tmp_path / name
        if text is not None:
            p.write_text(text)
        with pytest.raises(InvalidInputError) as e:
            load_trace(p)
        assert "\n" not in str(e.value) and "trace" in str(e.value)


# ---- traces a real profiler wrote on real GPUs (HolisticTraceAnalysis test data) ------------
def test_hta_a100_trace_with_shapes_and_kernels():
    t = load_trace(HTA / "sampled_rank-0.json.gz")
    assert t.has_gpu and (t.backend, t.world_size) == ("nccl", 128) and len(t.steps) == 2
    gemm = [o for o in t.ops if o.family == "gemm" and o.kernel_s > 0]
    assert len(gemm) > 50 and all(len(o.shapes) >= 2 for o in gemm if o.name == "aten::mm")
    assert any(k.family == "comm" for k in t.kernels)
    m = measure_step(t, t.steps[1])
    assert 0 < m.family_s["gemm"] < m.wall_s and m.streams_s


def test_hta_ddp_trace_nccl_allreduce_sizes():
    t = load_trace(HTA / "nccl_data_one_step.json.gz")
    assert t.device.startswith("NVIDIA A100") and (t.backend, t.world_size) == ("nccl", 2)
    ar = [c for c in t.comms if c.where == "device" and c.collective == "all_reduce"]
    assert ar and all(c.size_bytes > 0 and c.group_size == 2 for c in ar)
    m = measure_step(t, t.steps[0])
    assert m.comm_s > 0 and m.comm_exposed_s + m.comm_overlapped_s == pytest.approx(m.comm_s)


def test_profiler_cost_comes_out_per_recorded_event(cpu_trace, tmp_path: Path):
    """validate-run notes the unprofiled median step; the difference to the traced steps,
    per recorded event, is taken out of every operator (per event inside it) and of the
    host time (the other events); the rows still add up to the traced step."""
    import gzip
    import json

    from calibrate.trace_stats import event_cost
    path, wall_us, _ = cpu_trace
    d = json.load(gzip.open(path))
    extra_us = 26.0
    d["complexity"] = {"unprofiled_median_step_s": (wall_us - extra_us) * 1e-6,
                       "unprofiled_clean_steps": 10,
                       "traced_steps": [{"wall_s": 0, "pressure": 0.0}] * 4}
    p = tmp_path / "m.json"
    p.write_text(json.dumps(d))
    t = load_trace(p)
    steps, _ = clean_steps(t)
    cost, how = event_cost(t, steps)
    events = t.events_per_step[1]
    assert cost == pytest.approx(extra_us * 1e-6 / events) and "unprofiled" in how
    raw, m = measure_step(t, t.steps[1]), measure_step(t, t.steps[1], cost)
    assert m.profiler_s == pytest.approx(extra_us * 1e-6)
    assert raw.family_s["gemm"] - m.family_s["gemm"] == pytest.approx(3 * cost)  # 3 mm events
    total = m.priced_s + m.unpriced_s + m.host_s + m.comm_exposed_s + m.profiler_s
    assert total == pytest.approx(m.wall_s)
