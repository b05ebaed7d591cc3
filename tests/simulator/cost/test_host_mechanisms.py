"""Framework host mechanisms (frameworks.json "host"): each priced from its own unit count,
and the FSDP rate limiter's bound on how far the host runs ahead."""
from __future__ import annotations

import dataclasses
import json

import pytest

import hardware_db
from simulator.cost.host import (
    device_copy_ops,
    lead_layers,
    mechanisms_host,
    param_tensors,
    sync_at_p2p,
)
from simulator.engine.simulate import simulate
from simulator.engine.stage_work import build_chunks, place_groups
from simulator.frameworks import FRAMEWORKS, HOST, canonical_framework
from simulator.frameworks.defaults import framework_names
from simulator.frameworks.host import DATA, load_host
from simulator.hardware.profile import Coefficient, HostModel
from simulator.parallel.plan import Plan
from simulator.workload import MLP, TransformerSpec
from simulator.workload.ops import LayerShape, embedding_ops, head_ops, layer_ops

MODEL = TransformerSpec("mech-gpt", n_layers=4, hidden=512, ffn_hidden=2048, n_heads=8,
                        n_kv_heads=8, vocab=8000, seq_len=512)
BASE = hardware_db.load_profile("h100-sxm")


def prof(us: float):
    c = Coefficient(us, "us", "test")
    return dataclasses.replace(BASE, host=HostModel(c, c))


def test_param_tensors_of_a_layer():
    """A dense layer holds 4 Linear weights (qkv, out, fc1, fc2) and 2 norm weights; the
    embedding and head add the table, the final norm and the output weight."""
    sh = LayerShape(micro_batch=1, seq_len=MODEL.seq_len)
    assert param_tensors(layer_ops(MODEL, sh)) == 6
    assert param_tensors(embedding_ops(MODEL, sh) + head_ops(MODEL, sh)) == 3
    swiglu = dataclasses.replace(MODEL, mlp=MLP.SWIGLU)
    assert param_tensors(layer_ops(swiglu, sh)) == 6          # fused gate+up: one weight


def test_mechanism_host_time_scales_with_units_and_host_speed():
    names = ("fsdp1_unit", "deepspeed_bf16_grad_loop")
    f1, b1 = mechanisms_host(names, layers=4, tensors=30, prof=prof(10.0))
    f2, b2 = mechanisms_host(names, layers=8, tensors=60, prof=prof(20.0))
    fsdp, ds = HOST.mechanisms["fsdp1_unit"], HOST.mechanisms["deepspeed_bf16_grad_loop"]
    assert f1.seconds == pytest.approx(4 * fsdp.layer_fwd_eager_ops * 10e-6)
    assert b1.seconds == pytest.approx((4 * fsdp.layer_bwd_eager_ops
                                        + 30 * ds.param_tensor_bwd_eager_ops) * 10e-6)
    assert f2.seconds == pytest.approx(4 * f1.seconds)
    assert b2.seconds == pytest.approx(4 * b1.seconds)


def test_mechanism_flags():
    assert lead_layers(("fsdp1_unit",)) == 1
    assert lead_layers(()) == -1
    assert sync_at_p2p(("megatron_p2p_sync",)) and not sync_at_p2p(("fsdp1_unit",))
    ddp = device_copy_ops(("ddp_param_hooks",), 1.0, 1, 1)
    assert not ddp.fwd and not ddp.first and not ddp.rest
    # DDP's bucket copies: into the bucket and back, each reading and writing the gradient
    from simulator.cost.host import bucket_copy_ops
    fp32 = bucket_copy_ops(("ddp_param_hooks",), 1.0, 3, 4.0, 1)
    assert fp32[0].bytes_moved == 16.0 and fp32[0].kernels == 6
    assert bucket_copy_ops(("ddp_param_hooks",), 1.0, 3, 2.0, 1)[0].bytes_moved == 8.0
    # accumulation under no_sync: only the synchronising backward of 4 copies
    assert bucket_copy_ops(("ddp_param_hooks",), 1.0, 3, 2.0, 4)[0].bytes_moved == 2.0
    assert not bucket_copy_ops(("fsdp1_unit",), 1.0, 3, 2.0, 1)


def test_every_framework_names_known_modes_and_mechanisms():
    for name, fw in list(HOST.frameworks.items()) + [("default", HOST.default)]:
        assert fw.mode in HOST.modes, name
        assert all(m in HOST.mechanisms for m in fw.mechanisms), name
        assert fw.why
    # every framework named there is one --framework accepts (behaviour defaults or memory
    # conventions: torchtitan / fsdp2 have only the latter)
    assert set(HOST.frameworks) <= {canonical_framework(k) for k in framework_names()}
    assert {"megatron-lm", "llm-foundry"} <= {canonical_framework(k) for k in FRAMEWORKS}
    for m in list(HOST.modes.values()) + list(HOST.mechanisms.values()):
        assert m.why and "PLACEHOLDER" not in m.why


def test_loader_reads_its_own_section():
    data = json.loads(DATA.read_text())
    assert load_host(data) == HOST


def _chunk_pair(mechanisms: tuple[str, ...], gpus: int = 2, **plan_kw):
    """The first chunk of MODEL without and with ``mechanisms`` (profile host 10 us/op)."""
    cl = hardware_db.build_cluster("h100-sxm", gpus)
    plain = Plan(dp=gpus, micro_batch=1, global_batch=gpus, **plan_kw)
    withm = dataclasses.replace(plain, host_mechanisms=mechanisms)
    p = prof(10.0)
    return tuple(build_chunks(MODEL, pl, cl, p, place_groups(cl, pl))[0][0]
                 for pl in (plain, withm))


def test_ddp_copies_and_hooks_are_charged_per_backward():
    a, b = _chunk_pair(("ddp_param_hooks",))
    # per layer 4 Linear weights and biases and 2 LayerNorm weights and biases; the
    # embedding, the final norm's weight and bias, the output layer
    tensors = 4 * 12 + 4
    per = HOST.mechanisms["ddp_param_hooks"].param_tensor_bwd_eager_ops
    assert b.bwd.host_s - a.bwd.host_s == pytest.approx(tensors * per * 10e-6)
    assert b.fwd.host_s == pytest.approx(a.fwd.host_s)
    assert b.bwd.total_s > a.bwd.total_s          # bucket copies, in the gradient dtype


def test_fsdp_rate_limiter_bounds_the_host_lead():
    """limit_all_gathers: the host may issue a pass only when the device is within one
    layer of the end of the previous pass. With a host that is fast during backward but
    slow during forward, the limiter makes the step longer than free run-ahead; expected
    from the recursion with the lead bound."""
    cl = hardware_db.build_cluster("h100-sxm", 1)
    fsdp = Plan(micro_batch=1, global_batch=3, host_mechanisms=("fsdp1_unit",))
    p = dataclasses.replace(BASE, host=HostModel(Coefficient(40.0, "us", "t"),
                                                 Coefficient(0.2, "us", "t")))
    ch = build_chunks(MODEL, fsdp, cl, p, place_groups(cl, fsdp))[0][0]
    passes = [(ch.fwd.total_s, ch.fwd.host_s, ch.fwd.host_ops),
              (ch.bwd.total_s, ch.bwd.host_s, ch.bwd.host_ops)] * 3
    h = d = 0.0
    prev = None
    for g, hh, n in passes:
        hs = h if prev is None else max(h, prev[0] + (1 - 1 / MODEL.n_layers) * prev[1])
        ds = max(d, hs + hh / n)
        prev = (ds, g)
        d, h = max(ds + g, hs + hh), hs + hh
    r = simulate(MODEL, fsdp, cl, p)
    assert r.step_time_s == pytest.approx(d + r.breakdown.optimizer_s, rel=1e-9)
    an = simulate(MODEL, fsdp, cl, p, engine="analytic").step_time_s
    assert an == pytest.approx(r.step_time_s, rel=1e-9)


def test_host_facts_follow_framework_aliases_and_plans():
    """Host facts are found under either spelling ("megatron" is "megatron-lm"), and a plan
    under a framework's defaults gets its mode and mechanisms unless the caller keeps its own."""
    from simulator.parallel.framework_plan import with_framework
    assert HOST.framework("megatron") == HOST.framework("megatron-lm")
    assert HOST.framework("llm-foundry-fsdp").mechanisms == ("fsdp1_unit",
                                                             "optimizer_decoupled_adamw")
    assert HOST.framework("no-such-framework") == HOST.default
    base = Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16")
    assert with_framework(base, "llm-foundry").host_mechanisms == \
        ("fsdp1_unit", "optimizer_decoupled_adamw")
    assert with_framework(base, "megatron-deepspeed").host_mechanisms == \
        ("deepspeed_bf16_grad_loop", "cuda_launch_blocking", "megatron_legacy_layer")
    fp16 = Plan(dp=8, micro_batch=1, global_batch=8, precision="fp16")
    assert with_framework(fp16, "megatron-deepspeed").host_mechanisms == \
        ("cuda_launch_blocking", "megatron_legacy_layer")   # the gradient loop is bf16 only
    kept = Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16", host_mode="compiled")
    assert with_framework(kept, "nemo", {"host_mode"}).host_mode == "compiled"
    assert with_framework(kept, "nemo").host_mode == "eager"


def test_fsdp2_copies_are_charged_per_pass_and_only_under_fsdp():
    """FSDP2 (torchtitan): 4 B per local parameter of copy-out in forward, 10 B in backward
    (copy-out + chunk-cat), bandwidth-bound, on top of the same plan without the mechanism;
    the unit hooks and copies are dropped when the plan does not shard (ZeRO < 3)."""
    from simulator.parallel.framework_plan import with_framework
    a, b = _chunk_pair(("fsdp2_unit",), zero_stage=3)
    p = prof(10.0)
    bw = hardware_db.load_gpu("h100-sxm").mem_bw_gbytes_per_s * 1e9 * p.memory.eff("copy")
    launch = p.memory.launch_us.value * 1e-6
    n = MODEL.n_layers
    assert b.fwd.compute_s - a.fwd.compute_s == pytest.approx(
        4.0 * b.params / bw + n * launch, rel=1e-9)
    assert b.bwd.compute_s - a.bwd.compute_s == pytest.approx(
        10.0 * b.params / bw + 2 * n * launch, rel=1e-9)
    # split backward (zero-bubble): B carries the re-gather copy-out it needs first, W the
    # chunk-cat that follows the weight gradients; B + W is the whole backward
    assert b.wgrad.compute_s - a.wgrad.compute_s == pytest.approx(
        6.0 * b.params / bw + n * launch, rel=1e-9)
    b_part = (b.bwd.compute_s - b.wgrad.compute_s) - (a.bwd.compute_s - a.wgrad.compute_s)
    assert b_part == pytest.approx(4.0 * b.params / bw + n * launch, rel=1e-9)
    base = Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16")
    assert with_framework(base, "torchtitan").host_mechanisms == \
        ("fsdp2_unit", "optimizer_fused", "optimizer_dtensor_fused", "torchtitan_batch_copy")
    assert with_framework(dataclasses.replace(base, zero_stage=1), "torchtitan",
                          {"zero_stage"}).host_mechanisms == ("torchtitan_batch_copy",)


def test_te_module_calls_cost_their_measured_host_ratio():
    """Transformer Engine (Megatron-Core, NeMo): every Linear call costs 1.71 eager ops more
    host time than a torch.nn.Linear, forward and backward -- the te.Linear / nn.Linear CPU
    time ratio 2.71 of TE #2053 (host_overhead.csv lines 2-5) minus one. Per layer of
    MODEL: qkv, attention out, MLP up and down = 4 calls (attention score GEMMs are not
    Linear calls)."""
    from simulator.cost.host import linear_calls
    from simulator.parallel.framework_plan import with_framework
    from simulator.workload.ops import LayerShape, layer_ops
    assert linear_calls(layer_ops(MODEL, LayerShape(micro_batch=1, seq_len=128))) == 4
    m = HOST.mechanisms["te_modules"]
    ratios = (99.66 / 37.08, 90.53 / 33.17)
    assert m.linear_call_extra_eager_ops == pytest.approx(sum(ratios) / 2 - 1, abs=0.01)
    a, b = _chunk_pair(("te_modules",))
    calls = 4 * MODEL.n_layers          # the output layer is a plain linear, not TE's
    extra = calls * m.linear_call_extra_eager_ops * 10e-6
    assert b.fwd.host_s - a.fwd.host_s == pytest.approx(extra)
    assert b.bwd.host_s - a.bwd.host_s == pytest.approx(extra)
    f, e = _chunk_pair(("te_modules",), recompute="full")         # layers run again
    assert e.bwd.host_s - f.bwd.host_s == pytest.approx(2 * extra)
    d, c = _chunk_pair(("te_modules",), host_mode="cuda_graphs")
    assert c.fwd.host_s == pytest.approx(d.fwd.host_s)     # a CUDA graph replays without it
    base = Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16")
    assert with_framework(base, "megatron-core").host_mechanisms == (
        "te_modules", "mcore_layer_glue", "mcore_moe_layer", "mcore_model", "mcore_ddp_hooks",
        "mcore_grad_ready_hooks", "mcore_param_gather_hooks", "mcore_dist_optimizer",
        "mcore_train_loop", "mcore_loss_check", "mcore_p2p_sync")
    interleaved = Plan(dp=2, pp=4, vpp=2, micro_batch=1, global_batch=8, precision="bf16",
                       schedule="interleaved")
    assert "mcore_p2p_sync" not in with_framework(interleaved, "megatron-core").host_mechanisms
    assert with_framework(base, "megatron").host_mechanisms == (
        "megatron_batch_sync", "megatron_p2p_sync", "megatron_legacy_layer",
        "megatron_legacy_ddp_hooks", "megatron_legacy_optimizer")


def test_fsdp_reduce_dtype_follows_the_framework():
    """FSDP's reduce-scatter moves fp32 gradients under torchtitan / FSDP2's usual policy
    (reduce_dtype=float32) and under Composer's DEFAULT mixed precision, which llm-foundry's
    benchmark runs used (their table's 'MP Mode' column); 16-bit ones only where a
    framework reduces in the compute dtype."""
    from simulator.memory.accounting import grad_reduce_bytes
    from simulator.parallel.framework_plan import with_framework
    base = Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16")
    assert grad_reduce_bytes(with_framework(base, "torchtitan")) == 4
    assert grad_reduce_bytes(with_framework(base, "fsdp2")) == 4
    assert grad_reduce_bytes(with_framework(base, "llm-foundry")) == 4
    pure = dataclasses.replace(with_framework(base, "llm-foundry"), memory=dataclasses.replace(
        with_framework(base, "llm-foundry").memory, fsdp_reduce_fp32=False))
    assert grad_reduce_bytes(pure) == 2
    fp32 = Plan(dp=8, micro_batch=1, global_batch=8, precision="fp32")
    assert grad_reduce_bytes(with_framework(fp32, "llm-foundry")) == 4


def _pp_chunks(framework: str, mech: tuple[str, ...], pp: int = 2):
    """Stage 0's first chunk of MODEL on 4 H100 (dp 2 x pp 2, 4 micro-batches) under
    ``framework``'s conventions with host mechanisms ``mech``."""
    from simulator.parallel.framework_plan import with_framework
    cl = hardware_db.build_cluster("h100-sxm", 2 * pp)
    base = Plan(dp=2, pp=pp, micro_batch=1, global_batch=8, precision="bf16")
    pl = dataclasses.replace(with_framework(base, framework), host_mechanisms=mech)
    return pl, build_chunks(MODEL, pl, cl, prof(10.0), place_groups(cl, pl))[0][0]


def test_fsdp_under_pipeline_parallelism_gathers_and_reduces_once_per_step():
    """torchtitan on torch pipelining (stage.py: set_reshard_after_backward /
    set_requires_gradient_sync False per micro-batch, perform_reduce_grad after all; no
    reshard after forward with PP): the gather and the reduce-scatter happen once per step
    (1/m of a pass each, m = 4), nothing is re-gathered in backward, FSDP2's copies follow,
    and the reduce-scatter is exposed. Frameworks without the convention keep gathering
    and reducing every micro-batch."""
    from simulator.engine.fsdp_comm import fsdp_once_per_step, fsdp_per_step
    pl, a = _pp_chunks("torchtitan", ())
    _, b = _pp_chunks("torchtitan", ("fsdp2_unit",))
    assert fsdp_once_per_step(pl) and fsdp_per_step(pl) == pytest.approx(1 / 4)
    p = prof(10.0)
    bw = hardware_db.load_gpu("h100-sxm").mem_bw_gbytes_per_s * 1e9 * p.memory.eff("copy")
    launch = p.memory.launch_us.value * 1e-6
    layers = len(b.layers)
    assert b.fwd.compute_s - a.fwd.compute_s == pytest.approx(
        4.0 * b.params / 4 / bw + layers * launch)
    # backward: the unsharded gradients accumulated every micro-batch (6 B on the first,
    # 10 B on the three others: 9 B/param on average, one kernel per tensor) and 1/4 of
    # the chunk-cat, which now reads fp32 (8 B/param)
    from simulator.cost.host import ParamLayout, param_tensors
    from simulator.workload.ops import LayerShape, embedding_ops, layer_ops
    # torchtitan's own code: one Linear each for q, k, v (here with biases)
    sh, lay = LayerShape(micro_batch=1, seq_len=MODEL.seq_len), ParamLayout.of(MODEL, "split")
    assert pl.memory.param_layout == "split"
    tensors = layers * param_tensors(layer_ops(MODEL, sh), lay) + param_tensors(
        embedding_ops(MODEL, sh), lay)             # stage 0: the layers and the embedding
    assert tensors == layers * 16 + 1
    c = device_copy_ops(("fsdp2_unit",), b.params, layers, tensors, accumulate_over=4)
    assert not c.first and [o.bytes_moved for o in c.rest] == pytest.approx(
        [9.0 * b.params, 8.0 * b.params / 4])
    assert [o.kernels for o in c.rest] == [tensors, layers]
    assert b.bwd.compute_s - a.bwd.compute_s == pytest.approx(
        (9.0 + 2.0) * b.params / bw + (tensors + layers) * launch)
    # per-micro-batch FSDP (llm-foundry's FSDP1 conventions) under the same PP plan
    other, c = _pp_chunks("llm-foundry", ())
    assert not fsdp_once_per_step(other)
    nic = [k for k in c.bwd.link_busy_s if k != "scale-up"] or list(c.bwd.link_busy_s)
    ratio = sum(a.bwd.link_busy_s[k] for k in nic) / sum(c.bwd.link_busy_s[k] for k in nic)
    # torchtitan: no all-gather, 1/4 of a 4-byte reduce-scatter; llm-foundry: a 2-byte
    # all-gather and a 4-byte (fp32) reduce-scatter every micro-batch
    assert ratio == pytest.approx((4 / 4) / (2 + 4), rel=0.05)
    rs = [seg for seg in a.bwd.segments if seg.name.startswith("fsdp reduce-scatter")]
    assert rs and a.bwd.comm_s["dp"] == pytest.approx(rs[0].exposed_s)


def test_fsdp_under_pipeline_parallelism_holds_the_stage_gathered():
    """Memory: with PP nothing is resharded or reduced until the last backward, so the
    stage's parameters stay gathered (compute dtype) and its unsharded gradients
    accumulate (reduce dtype) at every moment of the step."""
    from simulator.memory.accounting import fsdp_transient_bytes
    pl, ch = _pp_chunks("torchtitan", ())
    held = ch.memory.params * (2 + 4)                  # bf16 gathered + fp32 accumulated
    assert fsdp_transient_bytes([ch.memory], pl) == (held, held, held)
    other, oc = _pp_chunks("llm-foundry", ())
    assert fsdp_transient_bytes([oc.memory], other)[0] < held
