"""Fitting a profile from a trace: each fitter recovers the coefficients that generated a
synthetic trace through the simulator's own closed forms; FLOPs and op lists are the
simulator's; the written profile says what the trace informed and what it kept."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.fit import busbw_factor
from calibrate.sim_ops import predicted_family_s, step_ops
from calibrate.trace_fit import (
    Fitted,
    attention_flops,
    fit_gemm_family,
    fit_host,
    fit_links,
    fit_memory_families,
    inputs,
    shape_bytes,
)
from calibrate.trace_import import OpRecord, load_trace
from calibrate.trace_profile import calibrate_from_trace, match_gpu
from simulator.cost.kernels import gemm_time_core_s
from simulator.engine.simulate import simulate
from simulator.hardware.profile import Profile
from simulator.hardware.specs import ClusterSpec
from simulator.network.collectives import Collective
from simulator.parallel.plan import Plan
from simulator.workload import resolve_model
from simulator.workload.ops import LayerShape, core_attention_ops

from kineto_synth import Trace

RATE_TFLOPS, K_HALF, LAUNCH_US = 0.2, 64.0, 5.0
SHAPES = [(64, 96, 32), (256, 256, 64), (512, 128, 256), (1024, 512, 128), (128, 1024, 512),
          (2048, 256, 256), (96, 64, 1024), (512, 512, 512)]


def gemm_us(m: int, n: int, k: int) -> float:
    """The simulator's GEMM formula (a CPU: no waves, compute-bound)."""
    return 1e6 * gemm_time_core_s(m, n, k, 4.0 * (m * k + k * n + m * n), 1e12, RATE_TFLOPS,
                                  K_HALF, LAUNCH_US * 1e-6, 1.0, 1e15)


def gemm_trace(path: Path, gap_us: float = 7.0) -> Path:
    tr = Trace()
    for i in range(1, 4):
        start = tr.t
        for m, n, k in SHAPES:
            tr.leaf("aten::mm", gemm_us(m, n, k), [(m, k), (k, n)], gap=gap_us,
                    wrappers=("aten::linear", "aten::matmul"))
        tr.step(i, start, tr.t + 1.0)
    return tr.write(path)


def test_gemm_fit_recovers_the_generating_coefficients(tmp_path: Path):
    fi = inputs(load_trace(gemm_trace(tmp_path / "g.json")), None, None)
    out = Fitted()
    fit_gemm_family(fi, None, out)
    f = out.fits["gemm_fp32"]
    assert f.values["eff_max"] == pytest.approx(RATE_TFLOPS, rel=1e-3)
    assert f.values["k_half"] == pytest.approx(K_HALF, rel=1e-2)
    assert f.values["launch_us"] == pytest.approx(LAUNCH_US, rel=1e-2)
    assert out.peaks["fp32"] == pytest.approx(RATE_TFLOPS, rel=1e-3)   # CPU: peak = asymptote
    assert f.heldout_mape_pct is not None and f.heldout_mape_pct < 1.0
    assert "fitted from trace g.json" in out.gemm["k_half"].source


def test_host_time_per_launch_without_the_model(tmp_path: Path):
    """Each GEMM is preceded by a 7 us gap and its two wrappers (1 us each before the leaf,
    1 us each after): 11 us of host time per GEMM, and one more us closing the step."""
    fi = inputs(load_trace(gemm_trace(tmp_path / "g.json")), None, None)
    out = Fitted()
    fit_host(fi, out)
    per_step_host = len(SHAPES) * 11.0 + 1.0
    assert out.host_us_per_gemm == pytest.approx(per_step_host / len(SHAPES), rel=1e-6)


def test_memory_family_fit_from_shapes(tmp_path: Path):
    bw_gbs, eff, launch = 20.0, 0.5, 3.0
    tr = Trace()
    for i in range(1, 4):
        start = tr.t
        for rows in (64, 256, 1024, 4096):
            op = OpRecord("aten::native_layer_norm", "norm", "", "fwd", 0, 0, 0, 0,
                          ((rows, 256), (), (256,)), "float")
            us = launch + shape_bytes(op) / (bw_gbs * 1e9 * eff) * 1e6
            tr.leaf("aten::native_layer_norm", us, [(rows, 256), (), (256,)], gap=2.0)
        tr.step(i, start, tr.t + 1.0)
    fi = inputs(load_trace(tr.write(tmp_path / "n.json")), None, None)
    out = Fitted()
    fit_memory_families(fi, bw_gbs, launch, out)
    assert out.kind_eff["norm"].value == pytest.approx(eff, rel=1e-3)
    assert "bytes from recorded shapes" in out.kind_eff["norm"].source


def test_gloo_link_fit_recovers_bandwidth(tmp_path: Path):
    """gloo all-reduce executions timed as base + bytes on the wire / bandwidth."""
    bw_gbs, base_us = 1.5, 40.0
    tr = Trace(dist={"backend": "gloo", "rank": 0, "world_size": 2})
    start = tr.t
    for n in (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22):
        wire = 4.0 * n * busbw_factor(Collective.ALL_REDUCE, 2)
        us = base_us + wire / (bw_gbs * 1e9) * 1e6
        tr.x("gloo:all_reduce", tr.t, us, tid=300, **{"Input Dims": [[n]], "Input type": ["float"]})
        tr.t += us + 5.0
    tr.step(1, start, tr.t)
    fi = inputs(load_trace(tr.write(tmp_path / "l.json")), None, None)
    out = Fitted()
    fit_links(fi, None, None, out, "host")
    assert out.link_bw_gbytes_per_s == pytest.approx(bw_gbs, rel=0.02)
    assert out.links["host"].bw_eff.value == 1.0


def test_attention_flops_are_the_simulators():
    spec = resolve_model("tiny-2l-128", seq_len=256)
    sh = LayerShape(micro_batch=2, seq_len=256, dtype="fp32")
    sim = next(o for o in core_attention_ops(spec, sh) if o.name == "core_attn")
    q = (2, spec.n_heads, 256, spec.head_dim)
    fwd = OpRecord("aten::_scaled_dot_product_flash_attention_for_cpu", "attention", "", "fwd",
                   0, 0, 0, 0, (q, q, q), "float", ("", "", "", "0.0", "True"))
    assert attention_flops(fwd) == pytest.approx(sim.flops)
    bwd = OpRecord("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention",
                   "", "bwd", 0, 0, 0, 0, (q, q, q, q, q, (2, 4, 256)), "float",
                   ("",) * 7 + ("True",))
    assert attention_flops(bwd) == pytest.approx(2.5 * sim.flops)     # backward_ops: 2.5x


def test_sim_op_list_prices_what_simulate_prices():
    from test_validate_run import cpu_profile
    prof = cpu_profile(None)
    spec = resolve_model("tiny-2l-128", seq_len=64)
    plan = Plan(micro_batch=2, global_batch=2, precision="fp32", attention="flash")
    cl = ClusterSpec(gpu=prof.device, node=prof.node, n_gpus=1)
    res = simulate(spec, plan, cl, prof)
    fam = predicted_family_s(step_ops(spec, plan), prof.device, prof)
    assert sum(fam.values()) == pytest.approx(res.breakdown.compute_s + res.breakdown.optimizer_s,
                                              rel=1e-9)


def test_calibrate_from_trace_writes_provenance(tmp_path: Path):
    from test_validate_run import cpu_profile
    from calibrate.profile_io import write_profile
    trace = gemm_trace(tmp_path / "g.json")
    res = calibrate_from_trace(trace, tmp_path / "out")
    p = Profile.read_json(res.path)
    assert p.device is not None and p.device.peak_tflops["fp32"] == pytest.approx(RATE_TFLOPS,
                                                                                 rel=1e-3)
    assert "fitted from trace g.json" in p.gemm.k_half.source
    assert "assumed" in p.attention.fwd_eff["fp32"].source        # no attention in the trace
    assert p.fingerprint["builder"] == "calibrate.trace_profile"
    report = json.loads((tmp_path / "out" / "trace_fit.json").read_text())
    assert "gemm_fp32" in report["informed_by_trace"]
    # with a base profile: what the trace cannot inform is kept and says so
    base = tmp_path / "base.json"
    write_profile(cpu_profile(1), base)
    res = calibrate_from_trace(trace, tmp_path / "out2", profile_path=str(base))
    p = Profile.read_json(res.path)
    assert p.attention.fwd_eff["fp32"].source.startswith("not informed by trace g.json")
    assert p.gemm.eff_max["fp32"].value == pytest.approx(RATE_TFLOPS / 0.1, rel=1e-3)
    assert "attention.fwd_eff.fp32" in res.kept


def test_gpu_names_map_to_hardware_db():
    assert match_gpu("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert match_gpu("NVIDIA A100-SXM4-80GB") == "a100-sxm-80gb"
    assert match_gpu("NVIDIA H100 PCIe") == "h100-pcie"
    assert match_gpu("Some Accelerator") is None
    assert match_gpu("AMD Instinct MI250X") == "mi250x"
    assert match_gpu("NVIDIA A800-SXM4-80GB") == "a800-sxm-80gb"
    assert match_gpu("NVIDIA A800 80GB PCIe") is None       # no A800 PCIe part is listed
    assert match_gpu("NVIDIA A100-SXM4-40GB") == "a100-sxm-40gb"
    assert match_gpu("NVIDIA GH200 480GB") == "gh200"


def test_gpu_gemm_fit_recovers_efficiency_from_kernel_times(tmp_path: Path):
    """H100 bf16 kernels timed by the simulator's own GEMM model (waves, k saturation,
    launch) at a chosen efficiency: the fit against the datasheet peak recovers it."""
    from dataclasses import replace

    import hardware_db
    from simulator.cost.kernels import gemm_time_s
    gpu, ref = hardware_db.load_gpu("h100-sxm"), hardware_db.load_profile("h100-sxm")
    eff = 0.6
    # kernels at the clock the job held: the reference's sustained ceiling is not applied
    prof = replace(ref, gemm=replace(ref.gemm, eff_max={"bf16": replace(
        ref.gemm.eff_max["bf16"], value=eff)}, sustained_eff={}))
    tr = Trace(gpu_name="NVIDIA H100 80GB HBM3")
    shapes = [(4096, 4096, 1024), (8192, 2048, 4096), (2048, 8192, 8192), (16384, 4096, 512),
              (4096, 12288, 4096), (1024, 1024, 2048), (8192, 8192, 256)]
    for i in range(1, 4):
        start = tr.t
        for m, n, k in shapes:
            us = gemm_time_s(m, n, k, "bf16", gpu, prof) * 1e6
            tr.leaf("aten::mm", 10.0, [(m, k), (k, n)], kernel_us=us, gap=20.0,
                    dtype="c10::BFloat16")
            tr.t = max(tr.t, tr.gpu_t)
        tr.step(i, start, tr.t + 5.0)
    res = calibrate_from_trace(tr.write(tmp_path / "h.json"), tmp_path / "out")
    f = res.fitted.fits["gemm_bf16"]
    assert f.values["eff_max"] == pytest.approx(eff, rel=1e-3)
    assert f.values["k_half"] == pytest.approx(ref.gemm.k_half.value, rel=1e-2)
    assert res.profile.device_key == "h100-sxm" and res.profile.device is None
    assert res.fitted.host_us_per_op is None            # GPU: host time reported, not folded
    assert res.profile.attention.fwd_eff["bf16"].source.startswith("not informed by trace")


def test_calibrate_from_a_recorded_gpu_ddp_trace():
    """HTA's 2-rank A100 DDP trace (no shapes recorded): the NCCL link's bandwidth is
    fitted, every compute coefficient is kept from the shipped A100 profile and says so."""
    hta = Path(__file__).parent / "data" / "hta"
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        res = calibrate_from_trace(hta / "nccl_data_one_step.json.gz", tmp)
    assert res.profile.device_key.startswith("a100")
    assert "link_nvlink" in res.fitted.fits
    assert res.profile.links["nvlink"].bw_eff.source.startswith("fitted from trace")
    assert res.profile.gemm.k_half.source.startswith("not informed by trace")


def test_host_time_folded_from_a_cpu_trace_replaces_the_base_host_model(tmp_path: Path):
    """A CPU trace's host time goes into the launch costs; a base profile's per-op host model
    (``Profile.host``, synchronous on a CPU) would charge it a second time, so the fitted
    profile carries none. Without a fold the base's host model is kept."""
    from dataclasses import replace

    from calibrate.profile_io import write_profile
    from calibrate.trace_fit import HOST_GEMM_FOLDED_KEY
    from simulator.hardware.profile import Coefficient, HostModel
    from test_validate_run import cpu_profile
    trace = gemm_trace(tmp_path / "g.json")
    host = HostModel(Coefficient(5.0, "us", "test"), Coefficient(8.0, "us", "test"),
                     synchronous=True)
    base = tmp_path / "base.json"
    write_profile(replace(cpu_profile(1), host=host), base)
    res = calibrate_from_trace(trace, tmp_path / "out", profile_path=str(base))
    p = Profile.read_json(res.path)
    assert float(p.fingerprint[HOST_GEMM_FOLDED_KEY]) == pytest.approx(
        (len(SHAPES) * 11.0 + 1.0) / len(SHAPES), rel=1e-6)
    assert p.host is None
    assert "host time per launch" in p.gemm.launch_us.source


def test_overlap_fit_leaves_out_operators_shorter_than_the_profiler_cost():
    """Operators whose profiler-corrected time is <= 0 (shorter than the profiler's own cost
    per event) cannot inform the slowdown: they are left out instead of failing the fit
    (seen on a real two-rank small-6l-512 trace)."""
    from types import SimpleNamespace as NS

    from calibrate.trace_fit import Fitted, fit_overlap_family
    comm = [NS(ts_s=0.0, dur_s=1.0, where="device", step=0)]
    ops, times = [], {}
    for i, (alone, busy) in enumerate([(1e-3, 1.2e-3), (2e-3, 2.4e-3), (3e-3, 3.6e-3),
                                       (0.0, -1e-6)]):         # the last: profiler-sized op
        for ts, t in ((5.0, alone), (0.1, busy)):
            o = NS(step=0, family="gemm", name=f"op{i}", shapes=(), phase="fwd", ts_s=ts,
                   end_s=ts + max(t, 1e-9))
            ops.append(o)
            times[id(o)] = t
    fi = NS(measures=[NS(step=0)], trace=NS(comms=comm, ops=ops, path="t.json"),
            steps_note="1 step", t=lambda o: times[id(o)])
    out = Fitted()
    fit_overlap_family(fi, out)
    assert out.overlap.value == pytest.approx(1.2, rel=1e-3)
    assert "3 operator shapes" in out.overlap.source
