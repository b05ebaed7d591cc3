"""Context parallelism (ring / all-gather attention) and MoE ops against closed forms.

Expected values come from the published formulas (TE ring attention with 2*cp chunk load
balancing; FLOPs 4*b*s^2*h_q*d/2 for causal attention; the expected maximum of normal
draws by numerical integration), not from the implementation.
"""
from __future__ import annotations

import math

import hardware_db
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.layer import pass_cost
from simulator.engine.stage_work import place_groups
from simulator.parallel.plan import Plan
from simulator.workload import MoESpec, TransformerSpec
from simulator.workload.moe_load import expected_max_load_ratio, expected_max_normal
from simulator.workload.ops import LayerShape, OpKind, backward_ops, layer_ops

L7B = TransformerSpec("7b", 32, 4096, 11008, 32, 32, 32000, 131072, mlp="swiglu")


def _attn(ops):
    return [o for o in ops if o.kind == OpKind.ATTENTION]


@pytest.mark.parametrize("cp", [2, 4, 8, 32])
@pytest.mark.parametrize("causal", [True, False])
def test_ring_attention_conserves_flops_and_balances_causal_work(cp, causal):
    """Per rank: 1/cp of the full attention, 4 b s^2 h d / cp (half of it when causal), in
    cp kernel calls; with 2*cp chunks every rank does the same work."""
    b, s, h = 1, L7B.seq_len, L7B.hidden
    ops = layer_ops(L7B, LayerShape(b, s, cp=cp, causal=causal, flash=True))
    calls = _attn(ops)
    full = 4.0 * b * s * s * h
    assert len(calls) == cp
    assert sum(o.flops for o in calls) == pytest.approx(full / cp * (0.5 if causal else 1.0))
    assert sum(o.model_flops for o in calls) == pytest.approx(full / cp)
    if causal:
        c = s // (2 * cp)
        assert calls[0].causal and (calls[0].m, calls[0].n) == (2 * c, 2 * c)
        assert all(not o.causal and (o.m, o.n) == (2 * c, c) for o in calls[1:])


def test_ring_transfers_kv_blocks_and_doubles_them_in_backward():
    """cp - 1 KV transfers per pass, each one rank's K and V block (2 b s/cp kv_dim bytes);
    backward carries KV and dKV (twice the bytes); each hides behind its step's kernel."""
    cp, b, s = 8, 1, L7B.seq_len
    fwd = layer_ops(L7B, LayerShape(b, s, cp=cp, flash=True))
    p2p = [o for o in fwd if o.group == "cp"]
    assert len(p2p) == cp - 1
    block = 2 * b * (s // cp) * L7B.kv_dim * 2
    assert all(o.comm_bytes == block for o in p2p)
    assert all(o.overlaps_with.startswith("core_attn_cp") for o in p2p)
    bwd = [o for o in backward_ops(fwd) if o.group == "cp"]
    assert all(o.comm_bytes == 2 * block for o in bwd)


def _cluster_groups(gpus, **plan):
    cl = hardware_db.build_cluster("h100-sxm", gpus)
    p = Plan(**plan)
    return cl, place_groups(cl, p)


def test_ring_step_costs_the_slower_of_kernel_and_transfer():
    """Exposed CP time = sum over steps of max(0, transfer - kernel)."""
    cl, groups = _cluster_groups(16, cp=16, global_batch=1)
    prof = hardware_db.load_profile("h100-sxm")
    ops = layer_ops(L7B, LayerShape(1, L7B.seq_len, cp=16, flash=True,
                                    attention_kernel="flash3"))
    pc = pass_cost(ops, cl.gpu, prof, groups, tp_overlap=False)
    from simulator.cost.layer import compute_time_s, group_collective_s
    want = 0.0
    for o in ops:
        if o.group == "cp":
            t = group_collective_s(o.collective, o.comm_bytes, groups["cp"], prof)
            k = compute_time_s(next(x for x in ops if x.name == o.overlaps_with), cl.gpu, prof)
            want += max(0.0, t - k)
    assert pc.comm_s.get("cp", 0.0) == pytest.approx(want)


def test_ring_backward_correction_adds_dq_and_dkv_once():
    """Backward of each ring step's correction: TE adds the step's dQ and dKV into the
    running ones (read both, write one, 16-bit): 3 x 2 B per Q and KV element, not twice
    the forward's fp32 output-correction bytes. Causal steps add half of the smaller one
    (half the KV, or half the queries, on each rank; the ring waits for the larger)."""
    cp, b, s = 8, 1, L7B.seq_len
    s_loc = s // cp
    q, kv = L7B.q_dim, 2 * L7B.kv_dim                         # dQ; dK and dV
    for causal, want in ((False, q + kv), (True, q + kv - min(q, kv) / 2)):
        fwd = layer_ops(L7B, LayerShape(b, s, cp=cp, flash=True, causal=causal))
        bwd = {o.name: o for o in backward_ops(fwd)}
        corr = [o for o in fwd if o.name.endswith("_correction")]
        assert len(corr) == cp - 1
        for o in corr:
            assert bwd[o.name + "_bwd"].bytes_moved == pytest.approx(6.0 * b * s_loc * want)


def test_recomputed_ring_transfer_hides_behind_the_recomputed_step():
    """Full recompute re-runs the forward ring in backward: each re-posted KV block hides
    behind its re-run attention step, exactly as in the forward (not behind the ~3x longer
    backward kernel of that step)."""
    from simulator.engine.recompute import recompute_ops
    cl, groups = _cluster_groups(32, cp=32, global_batch=1, recompute="full")
    prof = hardware_db.load_profile("h100-sxm")
    fwd = layer_ops(L7B, LayerShape(1, L7B.seq_len, cp=32, flash=True,
                                    attention_kernel="flash3"))
    re = recompute_ops(fwd, Plan(cp=32, global_batch=1, recompute="full"))
    assert all(o.overlaps_with.endswith("_recompute") for o in re if o.group == "cp")
    pf = pass_cost(fwd, cl.gpu, prof, groups, tp_overlap=False)
    pr = pass_cost(re, cl.gpu, prof, groups, tp_overlap=False)
    assert pf.comm_s["cp"] > 0                      # the transfers outlast their steps here
    assert pr.comm_s["cp"] == pytest.approx(pf.comm_s["cp"])


def test_allgather_cp_conserves_causal_flops_and_exposes_the_gather():
    cp, b, s = 4, 1, L7B.seq_len
    ops = layer_ops(L7B, LayerShape(b, s, cp=cp, flash=True, cp_comm="all_gather"))
    full = 4.0 * b * s * s * L7B.hidden
    assert sum(o.flops for o in _attn(ops)) == pytest.approx(0.5 * full / cp)
    ag = [o for o in ops if o.group == "cp"]
    assert len(ag) == 1 and ag[0].overlaps_with == ""
    assert ag[0].comm_bytes == 2 * b * s * L7B.kv_dim * 2


# ---- MoE ----------------------------------------------------------------------------------
def _exact_expected_max(n: int) -> float:
    """E[max of n standard normals] = int x n phi(x) Phi(x)^(n-1) dx (numerical)."""
    from scipy import integrate, stats
    f = lambda x: x * n * stats.norm.pdf(x) * stats.norm.cdf(x) ** (n - 1)
    return integrate.quad(f, -12, 12)[0]


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64, 256])
def test_blom_expected_maximum_of_normals(n):
    assert expected_max_normal(n) == pytest.approx(_exact_expected_max(n), rel=0.05)


def test_imbalance_model_on_heldout_measured_layers():
    """moe_expert_load.csv: fit the routing spread on even layers, predict the mean
    max/mean load of odd layers (8 experts, ~640 tokens each)."""
    from calibrate.csvrows import load_rows
    from calibrate.moe_load import fit_expert_load_cv, heldout
    rows = load_rows("moe_expert_load.csv")
    cv, pred, meas = heldout(rows)
    assert pred == pytest.approx(meas, rel=0.03)
    from simulator.frameworks.moe import ROUTING
    assert ROUTING.expert_load_cv(8) == pytest.approx(fit_expert_load_cv(rows), rel=0.01)


def test_routing_spread_of_many_expert_models_from_maxvio():
    """moe_load_summary.csv (Wang et al. 2024, Table 2, 64 experts): each MaxVio_global row
    inverts to cv = MaxVio / a_64 and back; moe.json holds the pooled fits; bias
    (auxiliary-loss-free) balancing is far tighter than the auxiliary loss."""
    from calibrate.moe_load import fit_maxvio_cv, maxvio_cv, summary_rows
    from simulator.frameworks.moe import ROUTING
    aux, free = summary_rows("aux_loss"), summary_rows("loss_free")
    for r in aux + free:
        assert maxvio_cv(r) * expected_max_normal(64) == pytest.approx(float(r.data["value"]))
    assert ROUTING.expert_load_cv(64) == pytest.approx(fit_maxvio_cv(aux), rel=0.01)
    assert ROUTING.expert_load_cv(64, loss_free=True) == pytest.approx(fit_maxvio_cv(free),
                                                                      rel=0.01)
    assert min(maxvio_cv(r) for r in aux) <= ROUTING.expert_load_cv(64) <= max(
        maxvio_cv(r) for r in aux)
    assert ROUTING.expert_load_cv(64, loss_free=True) < ROUTING.expert_load_cv(8)


@settings(max_examples=30, deadline=None)
@given(e=st.integers(1, 4096))
def test_routing_spread_between_the_measured_expert_counts(e):
    """Log-linear between the measured points, flat outside, never outside their range."""
    from simulator.frameworks.moe import ROUTING
    (e0, c0), (e1, c1) = ROUTING.aux_points[0], ROUTING.aux_points[-1]
    cv = ROUTING.expert_load_cv(e)
    assert min(c0, c1) <= cv <= max(c0, c1)
    assert ROUTING.expert_load_cv(e + 1) >= cv
    if e <= e0:
        assert cv == c0
    if e >= e1:
        assert cv == c1


def test_bias_balanced_presets_use_the_loss_free_spread():
    """DeepSeek-V3 (noaux_tc bias balancing) gets the loss-free spread, Qwen3 (auxiliary
    loss) the many-expert one: the busiest EP-64 rank differs accordingly."""
    from simulator.workload import get_preset
    from simulator.workload.moe_ops import moe_load_factor
    dsv3, qwen = get_preset("deepseek-v3"), get_preset("qwen3-235b-a22b")
    assert dsv3.moe.router_expert_bias and not qwen.moe.router_expert_bias
    sh = LayerShape(1, 4096, ep=64)
    routed = 4096 * 8
    from simulator.frameworks.moe import ROUTING
    assert moe_load_factor(dsv3, sh, routed) == pytest.approx(expected_max_load_ratio(
        64, 4, 256, routed, ROUTING.expert_load_cv(256, loss_free=True)))
    assert moe_load_factor(qwen, sh, routed) == pytest.approx(expected_max_load_ratio(
        64, 2, 128, routed, ROUTING.expert_load_cv(128)))
    assert moe_load_factor(qwen, sh, routed) > 1.3 > moe_load_factor(dsv3, sh, routed)


@settings(max_examples=40, deadline=None)
@given(ep=st.sampled_from([2, 4, 8, 16, 64]), tokens=st.integers(64, 1 << 16))
def test_imbalance_grows_with_ranks_and_shrinks_with_tokens(ep, tokens):
    r = expected_max_load_ratio(ep, 256 // ep, 256, tokens, 0.05)
    assert r > 1.0
    assert expected_max_load_ratio(2 * ep, 256 // (2 * ep), 256, tokens, 0.05) > r
    assert expected_max_load_ratio(ep, 256 // ep, 256, 4 * tokens, 0.05) < r


MOE = TransformerSpec("moe", 4, 2048, 6144, 32, 4, 32000, 4096, mlp="swiglu",
                      moe=MoESpec(experts=128, top_k=8, expert_ffn_hidden=768,
                                  shared_experts=1, dense_layers=1))


def test_moe_layer_ops_as_the_alltoall_dispatcher_runs_them():
    ep, tp, b, s = 8, 2, 1, MOE.seq_len
    sh = LayerShape(b, s, tp=tp, ep=ep, sequence_parallel=True, dtype="fp8")
    ops = {o.name: o for o in layer_ops(MOE, sh, layer=1)}
    t_loc = b * s // tp
    routed = t_loc * 8
    from simulator.frameworks.moe import ROUTING
    ratio = expected_max_load_ratio(ep, 128 // ep, 128, routed, ROUTING.expert_load_cv(128))
    assert ops["router"].dtype == "bf16" and (ops["router"].m, ops["router"].n) == (t_loc, 128)
    assert ops["ep_dispatch"].comm_bytes == pytest.approx(routed * ratio * 2048 * 2)
    assert ops["ep_combine"].comm_bytes == ops["ep_dispatch"].comm_bytes
    # the fp32 routing probabilities travel in their own all-to-all (token_dispatcher.py
    # @ d98e8a64 l.718), one per received token-expert pair
    assert ops["ep_dispatch_probs"].comm_bytes == pytest.approx(routed * ratio * 2)
    # after the TP gather (tokens and probabilities) the rows are sorted by local expert
    assert ops["ep_tp_allgather_probs"].comm_bytes == pytest.approx(routed * ratio * tp * 2)
    # the dispatcher's TP gather / reduce-scatter are synchronous calls, not overlapped by
    # TE (its grouped linear has TP comm off: extensions/transformer_engine.py l.2447)
    from simulator.workload.moe_ops import _DISPATCHER_TP_COLLECTIVES
    assert all(ops[n].overlaps_with == "" for n in _DISPATCHER_TP_COLLECTIVES)
    names = list(ops)
    assert names.index("ep_tp_allgather") < names.index("moe_sort_chunks") \
        < names.index("experts_fc1") < names.index("moe_unsort_chunks") \
        < names.index("ep_tp_reducescatter")
    assert ops["moe_sort_chunks"].bytes_moved == pytest.approx(2 * routed * ratio * tp * 2048 * 2)
    assert "moe_sort_chunks" in ops and "moe_unsort_chunks" in ops   # 16 local experts
    # FP8: expert rows copied into aligned segments and back (bf16 activations)
    pad_elems = routed * ratio * tp * 2048
    back = {o.name: o for o in backward_ops(list(ops.values()))}
    for name in ("moe_fp8_pad", "moe_fp8_unpad"):
        assert ops[name].bytes_moved == pytest.approx(2 * pad_elems * 2)
        assert back[name + "_bwd"].bytes_moved == ops[name].bytes_moved   # one copy back
    bf16 = {o.name for o in layer_ops(MOE, LayerShape(b, s, tp=tp, ep=ep,
                                                      sequence_parallel=True), layer=1)}
    assert "moe_fp8_pad" not in bf16
    fc1 = ops["experts_fc1"]
    assert fc1.grouped and fc1.batch == 16 and fc1.n == 2 * 768 // tp
    assert fc1.batch * fc1.m == pytest.approx(routed * ratio * tp, rel=0.01)
    assert "shared_fc1" in ops and "shared_allgather" in ops
    dense = {o.name for o in layer_ops(MOE, sh, layer=0)}
    assert "router" not in dense and "mlp_fc1" in dense


def test_capacity_factor_pads_every_expert_to_capacity():
    from dataclasses import replace
    m = replace(MOE, moe=replace(MOE.moe, capacity_factor=1.25))
    sh = LayerShape(1, MOE.seq_len, ep=8)
    ops = {o.name: o for o in layer_ops(m, sh, layer=1)}
    assert ops["ep_dispatch"].comm_bytes == pytest.approx(MOE.seq_len * 8 * 1.25 * 2048 * 2)


def test_grouped_gemm_slows_per_token_as_tokens_per_expert_fall():
    """Tokens per expert set the grouped GEMM's efficiency: weight streaming and partial
    tiles at few tokens, k-saturation of the weight-gradient GEMM (k = tokens)."""
    from simulator.cost.kernels import gemm_time_s
    gpu, prof = hardware_db.load_gpu("h100-sxm"), hardware_db.load_profile("h100-sxm")
    per_token = [gemm_time_s(t, 1536, 2048, "bf16", gpu, prof, batch=16, grouped=True) / t
                 for t in (64, 256, 1024, 4096)]
    assert per_token == sorted(per_token, reverse=True)
    assert per_token[0] > 2 * per_token[-1]
    wgrad = [gemm_time_s(2048, 1536, t, "bf16", gpu, prof, batch=16, grouped=True) / t
             for t in (64, 4096)]
    assert wgrad[0] > 1.5 * wgrad[1]


def test_grouped_gemm_ratio_predicts_its_heldout_rows():
    """kernels_more.csv 293/297/301/305: torch._grouped_mm on H200; the ratio from the 1k
    and 4k rows predicts the 2k and 8k rows within 5%."""
    prof = hardware_db.load_profile("h200-sxm")
    c = prof.gemm.grouped_eff["bf16"]
    assert 0.7 < c.value < 0.95 and c.heldout_error_pct < 5.0
    assert prof.gemm.grouped_eff["fp8"].value == 1.0


def test_deepgemm_contiguous_grouped_rows_within_15_percent():
    """kernels_more.csv 278-281 (DeepGEMM fp8 m-grouped, contiguous, H800 = H100 compute, not
    fitted): the dense fp8 model with grouped tiles and per-group weights."""
    from simulator.cost.kernels import gemm_time_s
    gpu, prof = hardware_db.load_gpu("h100-sxm"), hardware_db.load_profile("h100-sxm")
    for g, mg, n, k, meas in ((4, 8192, 4096, 7168, 1346), (4, 8192, 7168, 2048, 1214),
                              (8, 4096, 4096, 7168, 1346), (8, 4096, 7168, 2048, 1214)):
        t = gemm_time_s(mg, n, k, "fp8", gpu, prof, batch=g, grouped=True)
        assert 2 * g * mg * n * k / t / 1e12 == pytest.approx(meas, rel=0.15)
    assert math.isfinite(t)


# ---- rotary position embedding ----------------------------------------------------------------
def test_rope_rotates_q_and_k_once_each_way():
    """Fused RoPE (Megatron's default, --no-rope-fusion off) reads and writes Q and K once;
    its backward rotates the gradients back over the same bytes; a learned-position model
    has no such op."""
    import dataclasses
    from simulator.workload.spec import Position
    rope = dataclasses.replace(L7B, position=Position.ROPE, seq_len=4096)
    sh = LayerShape(1, 4096, tp=2)
    ops = {o.name: o for o in layer_ops(rope, sh)}
    elems = 4096 * (rope.q_dim // 2 + rope.kv_dim // 2)
    assert ops["rope"].bytes_moved == 2 * elems * 2 and ops["rope"].saved_bytes == 0
    bwd = {o.name: o for o in backward_ops(list(ops.values()))}
    assert bwd["rope_bwd"].bytes_moved == ops["rope"].bytes_moved
    learned = dataclasses.replace(L7B, position=Position.LEARNED, seq_len=4096)
    assert "rope" not in {o.name for o in layer_ops(learned, sh)}


def test_published_rows_naming_a_preset_keep_its_position_embedding():
    from simulator.validation.predict import row_model
    from simulator.workload.spec import Position
    row = {"model": "llama2-7b", "seq_len": "4096"}
    assert row_model(row).position == Position.ROPE
    assert row_model({"model": "", "n_layers": "2", "hidden": "256", "ffn_hidden": "1024",
                      "n_heads": "4", "vocab": "1000", "seq_len": "128"}).position \
        == Position.LEARNED


def test_published_rows_naming_an_moe_preset_keep_its_architecture():
    """A held-out style row: deepseek-v3 named, its dimension and MoE count columns given.
    The preset's MLA, router (sigmoid scores, groups, expert bias) and dense leading layers
    stay; the columns set the counts."""
    from simulator.validation.predict import row_model
    from simulator.workload import get_preset
    base = get_preset("deepseek-v3")
    row = {"model": "deepseek-v3", "n_layers": str(base.n_layers), "hidden": str(base.hidden),
           "ffn_hidden": str(base.ffn_hidden), "n_heads": str(base.n_heads),
           "vocab": str(base.vocab), "seq_len": "4096", "moe_experts": "256", "moe_topk": "8",
           "moe_ffn_hidden": "2048", "moe_shared_experts": "1", "moe_dense_layers": "3"}
    m = row_model(row)
    assert m.mla == base.mla and m.mla is not None
    assert m.moe.router_score == base.moe.router_score
    assert m.moe.router_groups == base.moe.router_groups
    assert (m.moe.experts, m.moe.top_k, m.moe.dense_layers) == (256, 8, 3)
    assert m.seq_len == 4096


def test_empty_moe_cells_of_a_named_preset_keep_the_preset_counts():
    """Only experts and top-k given: shared experts, dense layers and the expert width stay
    DeepSeek-V3's (a bare MoESpec would give 0 / 0 / the dense width: 6 T parameters)."""
    from simulator.validation.predict import row_model
    from simulator.workload import get_preset
    base = get_preset("deepseek-v3")
    m = row_model({"model": "deepseek-v3", "moe_experts": "256", "moe_topk": "8",
                   "ffn_hidden": str(base.ffn_hidden)})
    assert m.moe.shared_experts == base.moe.shared_experts
    assert m.moe.dense_layers == base.moe.dense_layers
    assert m.moe.expert_ffn_hidden == base.moe.expert_ffn_hidden
    assert abs(m.total_params() / base.total_params() - 1) < 1e-9
    # MLA keeps its value-head width when the row changes the head count
    m2 = row_model({"model": "deepseek-v3", "n_heads": "64", "n_kv_heads": "64"})
    assert m2.head_dim == base.head_dim and m2.q_dim == 64 * base.head_dim


def test_mla_assembles_q_and_k_per_head_once_each_way():
    from simulator.workload import get_preset
    m = get_preset("deepseek-v3")
    sh = LayerShape(1, 4096, tp=8)
    ops = {o.name: o for o in layer_ops(m, sh, layer=5)}
    heads, qk = m.n_heads // 8, m.mla.qk_head_dim
    op = ops["mla_rope_qk_assemble"]
    assert op.bytes_moved == 2 * (4096 * heads * 2 * qk) * 2 and op.saved_bytes == 0
    back = {o.name: o for o in backward_ops(list(ops.values()))}
    assert back["mla_rope_qk_assemble_bwd"].bytes_moved == op.bytes_moved
    assert "rope" not in ops                                 # MLA has its own


def test_ring_forward_holds_every_kv_block_and_step_output():
    """TE's P2P ring keeps all received KV blocks and per-step outputs until the forward
    ends: the whole sequence's K, V and output of this rank's heads, whatever the CP degree
    (llama3-8b at 512k tokens, TP2: 3.2 GB, as TE's buffers add up); the layer's working
    set in the memory model is at least that."""
    import dataclasses
    from simulator.memory.chunk import layer_memory
    from simulator.parallel.plan import Recompute
    from simulator.workload import get_preset
    from simulator.workload.ops import ring_forward_transient_bytes
    m = dataclasses.replace(get_preset("llama3-8b"), seq_len=524288)
    want = 524288 * (2 * 1024 // 2 + 4096 // 2) * 2
    for cp in (8, 32):
        sh = LayerShape(1, m.seq_len, tp=2, cp=cp, flash=True, sequence_parallel=True)
        assert ring_forward_transient_bytes(m, sh) == want
        assert layer_memory(m, sh, Recompute.FULL, (False, False))[1] >= want
    assert ring_forward_transient_bytes(m, LayerShape(1, m.seq_len, tp=2, cp=8, flash=True,
                                                      cp_comm="all_gather")) == 0
    assert abs(want / 1e9 - 3.2) < 0.05


# ---- DeepSeek-V3's multi-token prediction ------------------------------------------------------
def test_mtp_module_is_one_more_layer_a_projection_and_a_second_head():
    """DeepSeek-V3 trains one MTP module (report Sec. 2.2, config num_nextn_predict_layers
    = 1): on the last stage, after the main head, one more decoder layer (the last layer's
    kind, MoE), a 2h -> h projection and the shared output layer and loss again."""
    import dataclasses
    from simulator.workload import get_preset
    from simulator.workload.ops import head_ops
    m = get_preset("deepseek-v3")
    assert m.mtp_layers == 1
    sh = LayerShape(1, 4096, tp=1, ep=8)
    head = head_ops(m, sh)
    plain = head_ops(dataclasses.replace(m, mtp_layers=0), sh)
    mtp = [o for o in head if o.name.startswith("mtp0_")]
    assert len(head) == len(plain) + len(mtp) and all(o.name.startswith("mtp0_") for o in
                                                       head[len(plain):])
    flops = lambda ops: sum(o.model_flops for o in ops)
    layer = flops(layer_ops(m, sh, m.n_layers - 1))
    logits = next(o for o in plain if o.name == "logits").model_flops
    proj = 2 * 4096 * m.hidden * 2 * m.hidden
    assert flops(mtp) == pytest.approx(layer + logits + proj, rel=1e-9)
    names = {o.name for o in mtp}
    assert all(not o.overlaps_with or o.overlaps_with in names for o in mtp)


def test_mtp_parameters_and_their_memory_on_the_last_stage():
    """One MoE layer, two norms and the 2h x h projection: ~11.6B for DeepSeek-V3 (its
    reported 14B MTP module also counts embedding and head copies that training shares);
    not in total_params (the 671B figure), but in the last stage's memory."""
    from simulator.memory.chunk import chunk_memory
    from simulator.parallel.plan import Plan
    from simulator.workload import get_preset
    import dataclasses
    m = get_preset("deepseek-v3")
    assert 11.0e9 < m.mtp_params() < 12.5e9
    plan = Plan(pp=2, dp=8, ep=8)
    sh = LayerShape(1, 4096, ep=8)
    last = chunk_memory(m, plan, sh, list(range(31, 61)), False, True)
    bare = chunk_memory(dataclasses.replace(m, mtp_layers=0), plan, sh, list(range(31, 61)),
                        False, True)
    routed = m.moe.experts * m.dense_mlp_params(m.moe.expert_ffn_hidden)
    want = m.mtp_params() - routed + routed / 8
    assert last.params - bare.params == pytest.approx(want, rel=1e-9)
    assert last.act_bytes > bare.act_bytes


def test_hf_config_reads_the_mtp_depth():
    from pathlib import Path
    from simulator.workload.hf import from_hf_config
    hf = Path(__file__).parent / "data" / "hf" / "deepseek-v3.json"
    assert from_hf_config(hf).mtp_layers == 1


def test_the_dispatchers_tp_collectives_are_exposed_even_with_tp_comm_overlap():
    """Megatron-Core with --tp-comm-overlap (the megatron-core defaults) overlaps the dense
    layers' TP collectives with their GEMMs, but the MoE dispatcher's TP all-gather and
    reduce-scatter are synchronous: the layer pays each in full, as priced alone."""
    import hardware_db
    from simulator.cost.layer import group_collective_s, pass_cost
    from simulator.parallel.placement import place_group
    cl, prof = hardware_db.build_cluster("h100-sxm", 16), hardware_db.load_profile("h100-sxm")
    sh = LayerShape(1, MOE.seq_len, tp=2, ep=8, sequence_parallel=True, dtype="bf16")
    ops = [o for o in layer_ops(MOE, sh, layer=1)]
    by = {o.name: o for o in ops}
    groups = {"tp": place_group(cl, "tp", 2, 1), "ep": place_group(cl, "ep", 8, 2),
              "cp": place_group(cl, "cp", 1, 1), "dp": place_group(cl, "dp", 1, 1)}
    pc = pass_cost(ops, cl.gpu, prof, groups, tp_overlap=True)
    for name in ("ep_tp_allgather", "ep_tp_reducescatter"):
        alone = group_collective_s(by[name].collective, by[name].comm_bytes, groups["tp"], prof)
        assert pc.op_times[name] == pytest.approx(alone, rel=1e-6)
