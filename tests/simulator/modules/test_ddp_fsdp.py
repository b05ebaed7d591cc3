"""DDP bucketing and overlap, FSDP, compression and precision what-ifs on traced graphs."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

import hardware_db
from simulator.modules.compression import CompressionSpec, bucket_steps, powersgd_split
from simulator.modules.compression_whatif import compression_whatif
from simulator.modules.ddp import (
    MIB,
    DDPConfig,
    assign_buckets,
    dp_comm,
    optimizer_time_s,
    simulate_ddp,
)
from simulator.modules.fsdp import FSDPConfig, fsdp_units, simulate_fsdp
from simulator.modules.op_report import format_report, op_report, price_graph
from simulator.modules.precision_whatif import precision_whatif
from simulator.workload.ops import Op, OpKind
from simulator.workload.traced import GradReady, ParamInfo, TracedGraph, TracedOp


def _layer_graph(n_layers: int = 8, hidden: int = 1024, tokens: int = 4096,
                 dtype: str = "fp32") -> TracedGraph:
    """A stack of Linear layers: forward GEMMs, then per layer (reversed) dgrad + wgrad +
    bias-grad ops; each layer's weight and bias are ready after its wgrad."""
    eb = 4 if dtype == "fp32" else 2
    ops, params, ready = [], [], []

    def add(name, kind, phase, module, flops=0.0, nbytes=0.0, mnk=(0, 0, 0), params_=()):
        i = len(ops)
        saved = eb * tokens * hidden if phase == "forward" else 0.0
        ops.append(TracedOp(i, Op(f"{module}/{name}#{i}", kind, flops=flops, model_flops=flops,
                                  bytes_moved=nbytes, m=mnk[0], n=mnk[1], k=mnk[2], dtype=dtype,
                                  saved_bytes=saved),
                            f"aten.{name}.default", phase, module, (), (), nbytes / 2, nbytes / 2,
                            (i - 1,) if i else (), tuple(params_)))
        return i

    gemm_bytes = eb * (tokens * hidden * 3)
    for l in range(n_layers):
        params += [ParamInfo(f"l{l}.weight", (hidden, hidden), dtype, hidden * hidden,
                             hidden * hidden * eb, f"l{l}"),
                   ParamInfo(f"l{l}.bias", (hidden,), dtype, hidden, hidden * eb, f"l{l}")]
        add("addmm", OpKind.GEMM, "forward", f"l{l}", 2.0 * tokens * hidden * hidden, gemm_bytes,
            (tokens, hidden, hidden), (f"l{l}.bias", f"l{l}.weight"))
        add("relu", OpKind.MEMORY, "forward", f"l{l}", 0.0, 2 * eb * tokens * hidden)
    add("sum", OpKind.MEMORY, "loss", "<loss>", 0.0, eb * tokens * hidden)
    for l in reversed(range(n_layers)):
        add("threshold_backward", OpKind.MEMORY, "backward", f"l{l}", 0.0, 3 * eb * tokens * hidden)
        add("mm", OpKind.GEMM, "backward", f"l{l}", 2.0 * tokens * hidden * hidden, gemm_bytes,
            (tokens, hidden, hidden), (f"l{l}.weight",))
        w = add("mm", OpKind.GEMM, "backward", f"l{l}", 2.0 * tokens * hidden * hidden, gemm_bytes,
                (hidden, hidden, tokens))
        b = add("sum", OpKind.MEMORY, "backward", f"l{l}", 0.0, eb * tokens * hidden)
        ready += [GradReady(f"l{l}.bias", b), GradReady(f"l{l}.weight", w)]
    return TracedGraph("mlp-synthetic", tuple(ops), tuple(params), tuple(ready),
                       saved_activation_bytes=2.0 * n_layers * eb * tokens * hidden,
                       buffer_bytes=0.0, input_bytes=eb * tokens * hidden)


@pytest.fixture(scope="module")
def h100():
    return hardware_db.load_gpu("h100-sxm"), hardware_db.load_profile("h100-sxm")


def _comm(prof, n=16, nic_gbps=None):
    return dp_comm(hardware_db.build_cluster("h100-sxm", n, nic_gbits_per_s=nic_gbps), prof)


# ---- bucketing ---------------------------------------------------------------------------------
def test_buckets_follow_torch_rules():
    g = _layer_graph(8, 1024)                 # weights 4 MiB, biases 4 KiB
    default = assign_buckets(g, DDPConfig())  # first bucket 1 MiB, then 25 MiB
    assert default[0].params == ("l7.bias", "l7.weight")   # crosses 1 MiB with the weight
    assert [len(b.params) for b in default] == [2, 14]
    assert default[0].cap_bytes == MIB and default[1].cap_bytes == 25 * MIB
    assert default[1].nbytes >= 25 * MIB > default[1].nbytes - 4 * MIB
    explicit = assign_buckets(g, DDPConfig(bucket_cap_mib=25))   # torch: first cap = cap
    assert explicit[0].cap_bytes == 25 * MIB and len(explicit) == 2
    small = assign_buckets(g, DDPConfig(bucket_cap_mib=1))
    assert len(small) == 8 and all(len(b.params) == 2 for b in small)
    order = [p for b in default for p in b.params]
    assert order == [r.param for r in g.grad_ready]
    assert all(b.ready_after_op == max(r.after_op for r in g.grad_ready if r.param in b.params)
               for b in default)


def test_buckets_split_by_dtype():
    g = _layer_graph(2, 256)
    mixed = replace(g, params=tuple(replace(p, dtype="bf16", nbytes=p.numel * 2)
                                    if p.name.endswith("bias") else p for p in g.params))
    bs = assign_buckets(mixed, DDPConfig())
    assert {b.dtype for b in bs} == {"fp32", "bf16"}
    assert all(all(n.endswith("bias") for n in b.params) for b in bs if b.dtype == "bf16")


# ---- DDP timeline ------------------------------------------------------------------------------
def test_single_rank_is_compute_plus_optimizer(h100):
    gpu, prof = h100
    g = _layer_graph()
    t = price_graph(g, gpu, prof)
    r = simulate_ddp(g, t, _comm(prof, 1), DDPConfig(), gpu, prof, optimizer="adam")
    expect = sum(t) + optimizer_time_s(g, "adam", gpu, prof) + prof.step_overhead_s.value
    assert r.step_time_s == pytest.approx(expect, rel=1e-9) and not r.buckets


def test_overlap_hides_communication(h100):
    gpu, prof = h100
    g = _layer_graph(16, 2048)
    t = price_graph(g, gpu, prof)
    comm = _comm(prof, 64, nic_gbps=100)
    ov = simulate_ddp(g, t, comm, DDPConfig(), gpu, prof)
    no = simulate_ddp(g, t, comm, DDPConfig(overlap=False), gpu, prof)
    one = simulate_ddp(g, t, comm, DDPConfig(bucket_cap_mib=4096), gpu, prof)
    assert ov.step_time_s < no.step_time_s and ov.step_time_s < one.step_time_s
    assert no.exposed_comm_s >= 0.9 * no.comm_s
    assert ov.step_time_s >= sum(t)
    starts = [b.comm_start_s for b in ov.buckets]
    assert starts == sorted(starts)                           # FIFO, in bucket order
    assert all(b.comm_start_s >= b.ready_s - 1e-12 for b in ov.buckets)
    assert ov == simulate_ddp(g, t, comm, DDPConfig(), gpu, prof)   # deterministic


def test_bucket_view_saves_copies_and_memory(h100):
    gpu, prof = h100
    g = _layer_graph()
    t = price_graph(g, gpu, prof)
    comm = _comm(prof, 8)
    plain = simulate_ddp(g, t, comm, DDPConfig(), gpu, prof)
    view = simulate_ddp(g, t, comm, DDPConfig(gradient_as_bucket_view=True), gpu, prof)
    assert view.step_time_s < plain.step_time_s
    assert view.memory["bucket_buffers_bytes"] == 0 < plain.memory["bucket_buffers_bytes"]


# ---- compression -------------------------------------------------------------------------------
def test_powersgd_split_rules():
    sp = powersgd_split([(64, 3, 3, 3), (64,), (10, 6), (1000, 1000)], rank=2)
    # (64, 27): 91 * 2 * 2 < 1728 -> compressed; (10, 6): 16 * 2 * 2 > 60 -> not; 1-D -> not
    assert sp.matrices == ((64, 27, 2), (1000, 1000, 2))
    assert sp.uncompressed_numel == 64 + 60
    assert (sp.p_numel, sp.q_numel) == (64 * 2 + 1000 * 2, 27 * 2 + 1000 * 2)


def test_hook_messages(h100):
    gpu, prof = h100
    shapes = [(1024, 1024), (1024,)]
    plain = bucket_steps(shapes, 4, "fp32", CompressionSpec(), gpu, prof)
    half = bucket_steps(shapes, 4, "fp32", CompressionSpec("bf16"), gpu, prof)
    psgd = bucket_steps(shapes, 4, "fp32", CompressionSpec("powersgd", rank=4), gpu, prof)
    assert [s.nbytes for s in plain if s.kind == "comm"] == [4 * (1024 * 1024 + 1024)]
    assert [s.nbytes for s in half if s.kind == "comm"] == [2 * (1024 * 1024 + 1024)]
    assert [s.nbytes for s in psgd if s.kind == "comm"] == [4 * 1024, 4 * 4096, 4 * 4096]
    assert sum(s.seconds for s in psgd) > sum(s.seconds for s in plain)


def test_compression_pays_off_only_when_communication_bound(h100):
    gpu, prof = h100
    g = _layer_graph(16, 4096, tokens=256)       # little compute, many gradients
    t = price_graph(g, gpu, prof)
    slow = compression_whatif(g, t, _comm(prof, 64, nic_gbps=25), DDPConfig(), gpu, prof)
    rows = {r.option: r for r in slow.rows}
    assert rows["powersgd-r1"].pays_off and rows["powersgd-r1"].speedup > 1.5
    assert rows["fp16"].message_bytes == pytest.approx(rows["none"].message_bytes / 2)
    assert any("pays off" in v for v in slow.verdicts)
    big = _layer_graph(4, 1024, tokens=65536)    # compute-bound, fast fabric
    fast = compression_whatif(big, price_graph(big, gpu, prof), _comm(prof, 8), DDPConfig(), gpu, prof)
    assert not any(r.pays_off for r in fast.rows if r.option.startswith("powersgd"))


# ---- FSDP --------------------------------------------------------------------------------------
def test_fsdp_units_and_prefetch(h100):
    gpu, prof = h100
    g = _layer_graph(8, 2048)
    depth, units = fsdp_units(g)
    assert depth == 1 and [u.name for u in units] == [f"l{i}" for i in range(8)]
    t = price_graph(g, gpu, prof)
    comm = _comm(prof, 64, nic_gbps=100)
    pre = simulate_fsdp(g, t, comm, gpu, prof)
    late = simulate_fsdp(g, t, comm, gpu, prof, FSDPConfig(backward_prefetch=False))
    assert sum(t) <= pre.step_time_s <= late.step_time_s
    ddp = simulate_ddp(g, t, comm, DDPConfig(), gpu, prof)
    assert pre.memory["weights_bytes"] < ddp.memory["weights_bytes"]
    assert pre.comm_s > ddp.comm_s * 0.9            # gathers + reduce-scatters move more


# ---- reports -----------------------------------------------------------------------------------
def test_roofline_report(h100):
    gpu, prof = h100
    g = _layer_graph()
    r = op_report(g, gpu, prof)
    gemm = next(x for x in r.rows if x.kind == "gemm")
    relu = next(x for x in r.rows if x.aten == "aten.relu.default")
    assert gemm.bound == "compute" and relu.bound == "memory" and relu.intensity == 0
    assert sum(x.share for x in r.rows) == pytest.approx(1.0)
    assert r.top(3)[0].time_s >= r.top(3)[1].time_s
    d = r.to_dict()
    assert {"forward_flops", "backward_flops", "params", "ops"} <= set(d)
    assert "top 5 ops" in format_report(r, 5)


def test_precision_whatif(h100):
    gpu, prof = h100
    g = _layer_graph(8, 4096)
    rows = {x.mode: x for x in precision_whatif(g, gpu, prof).rows}
    assert rows["bf16"].speedup > 2 and rows["tf32"].speedup > 1.5
    assert rows["fp16"].loss_scaling_s > 0 == rows["bf16"].loss_scaling_s
    assert rows["bf16"].activations_bytes == pytest.approx(rows["fp32"].activations_bytes / 2)
    assert rows["bf16"].gain_from["gemm_s"] > 0 and "gain" in rows["bf16"].note
    assert math.isclose(rows["fp32"].speedup, 1.0)
