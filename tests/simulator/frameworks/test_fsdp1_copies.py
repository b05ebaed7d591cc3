"""FSDP1's device passes (``frameworks.json`` host mechanism ``fsdp1_unit``) against the
framework itself: ``FullyShardedDataParallel`` runs here on a CPU over a fake process group
with Composer's DEFAULT mixed precision (bf16 parameters, fp32 reduction), and every aten op
of the backward is recorded by a ``TorchDispatchMode``. The bytes of the gradient cat
(autograd's backward of the flat parameter's split), the cast to the reduce dtype and the
in-place pre-division are counted per parameter and compared with
``cost.host.fsdp_lane_ops``. Then the simulator's FSDP lane is checked to carry those passes
in series with the collectives. (Which CUDA stream each pass runs on cannot be seen on a
CPU; it follows from FSDP1's source, see the mechanism's source text.)
"""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import hardware_db  # noqa: E402
from calibrate.bench_eager import tensor_bytes as _nbytes  # noqa: E402
from simulator.cost.host import device_copy_ops, fsdp_lane_ops  # noqa: E402


def _backward_traffic(use_orig_params: bool, reduce_dtype) -> tuple[dict, int, int]:
    """{aten op: [calls, input bytes, output bytes]} over one FSDP1 backward (the second
    step's, after warm-up), the model's parameter count and its blocks' (FSDP units)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from torch.utils._python_dispatch import TorchDispatchMode

    from calibrate.bench_host import probe_spec
    from calibrate.torch_model import build_model, synthetic_batch
    spec = probe_spec(3)
    model = build_model(spec)
    total = sum(p.numel() for p in model.parameters())
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype,
                        buffer_dtype=torch.bfloat16)
    fsdp = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, mixed_precision=mp,
                auto_wrap_policy=ModuleWrapPolicy({type(model.blocks[0])}),
                device_id=torch.device("cpu"), use_orig_params=use_orig_params)
    tokens, targets = synthetic_batch(spec, 1)

    class Spy(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: dict[str, list[int]] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            a = self.ops.setdefault(func.__name__.split(".")[0], [0, 0, 0])
            a[0] += 1
            a[1] += _nbytes(list(args) + list((kwargs or {}).values()))
            a[2] += _nbytes(out)
            return out

    for _ in range(2):
        loss = fsdp(tokens, targets)
        spy = Spy()
        with spy:
            loss.backward()
        fsdp.zero_grad(set_to_none=True)
    return spy.ops, total, len(model.blocks) + 1


def _model_cats() -> float:
    """Bytes the bare model's own backward moves in cat (its fused qkv split): subtracted."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from calibrate.bench_host import probe_spec
    from calibrate.torch_model import build_model, synthetic_batch
    spec = probe_spec(3)
    model = build_model(spec).to(torch.bfloat16)
    tokens, targets = synthetic_batch(spec, 1)
    moved = [0.0]

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.__name__.startswith("cat"):
                moved[0] += _nbytes(args[0]) + _nbytes(out)
            return out

    loss = model(tokens, targets)
    with Spy():
        loss.backward()
    return moved[0]


@pytest.mark.parametrize("use_orig_params", [True, False])
def test_fsdp1_backward_passes_per_parameter_match_the_mechanism(fake_world, use_orig_params):
    ops, total, units = _backward_traffic(use_orig_params, torch.float32)
    # on the all-gather stream: one cat per unit of the 16-bit gradients into the flat one
    cat_bytes = ops["cat"][1] + ops["cat"][2] - _model_cats()
    assert ops["cat"][0] - 3 == units                    # 3: the model's own qkv cats
    gather, reduce = fsdp_lane_ops(("fsdp1_unit",), total, units, 2, 4, fake_world)
    assert [o.name for o in gather] == ["fsdp1_unit_grad_cat"]
    assert cat_bytes / total == pytest.approx(gather[0].bytes_moved / total, rel=0.08)
    assert gather[0].kernels == units
    # nothing on the compute stream beyond the layers' own ops
    c = device_copy_ops(("fsdp1_unit",), total, units, 0)
    assert not c.fwd and not c.first and not c.rest
    # post-backward stream: bf16 -> fp32 cast (2 + 4 B) and the in-place pre-division of
    # the fp32 unsharded gradient (4 + 4 B) plus the shard's post-division (2 x 4 / WORLD)
    assert (ops["_to_copy"][1] + ops["_to_copy"][2]) / total == pytest.approx(6.0, rel=0.02)
    div = (ops["div_"][1] + ops["div_"][2]) / total
    assert div == pytest.approx(8.0 + 8.0 / fake_world, rel=0.02)
    assert {o.name: o.bytes_moved / total for o in reduce} == pytest.approx(
        {"fsdp1_unit_reduce_cast": 6.0, "fsdp1_unit_reduce_predivide": 8.0})
    # one rank: no pre-division (FSDP's factor is 1 there)
    _, alone = fsdp_lane_ops(("fsdp1_unit",), total, units, 2, 4, 1)
    assert [o.name for o in alone] == ["fsdp1_unit_reduce_cast"]


def test_fsdp1_pure_mixed_precision_has_no_cast(fake_world):
    """Reducing in bf16 (Composer's PURE): no full-size cast, and the pre-division moves
    2 x 2 B per parameter."""
    ops, total, units = _backward_traffic(True, torch.bfloat16)
    # only the reduced shard is cast back to the fp32 parameters' dtype (2 + 4 B / WORLD)
    cast = (ops["_to_copy"][1] + ops["_to_copy"][2]) / total
    assert cast == pytest.approx(6.0 / fake_world, rel=0.02)
    div = (ops["div_"][1] + ops["div_"][2]) / total
    assert div == pytest.approx(4.0 + 4.0 / fake_world, rel=0.02)
    _, prep = fsdp_lane_ops(("fsdp1_unit",), total, units, 2, 2, fake_world)
    assert [o.name for o in prep] == ["fsdp1_unit_reduce_predivide"]
    assert prep[0].bytes_moved == pytest.approx(4.0 * total)


def test_fsdp_reduce_scatter_lane_carries_the_prep_passes_in_series():
    """The chunk's backward FSDP lane = re-gather + reduce-scatter + FSDP1's gradient cat,
    cast and pre-division at the GPU's copy bandwidth (4 + 6 + 8 B per parameter, three
    kernels per layer); without the mechanism the passes are gone, and the compute is the
    same either way."""
    from simulator.engine.stage_work import build_chunks, place_groups
    from simulator.parallel.framework_plan import with_framework
    from simulator.parallel.plan import Plan
    from simulator.workload.presets import get_preset
    model = get_preset("llama2-7b")
    cl = hardware_db.build_cluster("h100-sxm", 16)
    prof = hardware_db.load_profile("h100-sxm")
    base = with_framework(Plan(dp=16, micro_batch=1, global_batch=16, precision="bf16"),
                          "llm-foundry")
    lanes = {}
    for mech in (("fsdp1_unit",), ()):
        pl = dataclasses.replace(base, host_mechanisms=mech)
        ch = build_chunks(model, pl, cl, prof, place_groups(cl, pl))[0][0]
        seg = [s for s in ch.bwd.segments if s.name.startswith("fsdp all-gather")]
        lanes[mech] = (seg[0].comm_s, ch.params, len(ch.layers), ch.bwd.compute_s)
    with_prep, params, layers, compute = lanes[("fsdp1_unit",)]
    assert compute == pytest.approx(lanes[()][3])
    bw = hardware_db.load_gpu("h100-sxm").mem_bw_gbytes_per_s * 1e9 * prof.memory.eff("copy")
    launch = prof.memory.launch_us.value * 1e-6
    expected = (4.0 + 6.0 + 8.0) * params / bw + 3 * layers * launch
    assert with_prep - lanes[()][0] == pytest.approx(expected, rel=1e-6)


def test_plain_fsdp_reduces_in_the_parameter_dtype(fake_world):
    """``frameworks.json`` "fsdp" (plain PyTorch FSDP v1) reduces 16-bit gradients: with
    ``MixedPrecision(param_dtype=bf16)`` and ``reduce_dtype`` left unset, FSDP's backward
    moves what the bf16-reduce run above moves (no full-size fp32 cast, a 2 x 2 B
    pre-division), and the simulator's plan under "fsdp" reduces 2 B per gradient."""
    from simulator.memory.accounting import grad_reduce_bytes
    from simulator.parallel.framework_plan import with_framework
    from simulator.parallel.plan import Plan
    ops, total, _ = _backward_traffic(True, None)
    assert (ops["_to_copy"][1] + ops["_to_copy"][2]) / total == pytest.approx(
        6.0 / fake_world, rel=0.02)
    div = (ops["div_"][1] + ops["div_"][2]) / total
    assert div == pytest.approx(4.0 + 4.0 / fake_world, rel=0.02)
    plan = with_framework(Plan(dp=8, micro_batch=1, global_batch=8, precision="bf16"), "fsdp")
    assert plan.zero_stage == 3 and plan.host_mechanisms == ("fsdp1_unit", "hf_decoder_layer",
                                                         "optimizer_foreach")
    assert grad_reduce_bytes(plan) == 2
    assert grad_reduce_bytes(with_framework(plan, "fsdp2")) == 4
