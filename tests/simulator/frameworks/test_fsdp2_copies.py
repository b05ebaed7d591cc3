"""FSDP2's device copies (``frameworks.json`` host mechanism ``fsdp2_unit``) against the
framework itself: ``fully_shard`` runs here on a CPU over a fake process group, and the
bytes its all-gather copy-out (``torch.split_with_sizes_copy``) and reduce-scatter copy-in
(``torch._chunk_cat``) move are counted per parameter and compared with the mechanism's
``device_bytes_per_param_fwd`` / ``_bwd``. Then the simulator charges exactly those bytes.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from simulator.cost.host import device_copy_ops  # noqa: E402
from simulator.frameworks import HOST  # noqa: E402

def test_fsdp2_copy_bytes_per_parameter_match_the_mechanism(monkeypatch, fake_world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from calibrate.bench_host import probe_spec
    from calibrate.torch_model import build_model, synthetic_batch
    world = fake_world
    spec = probe_spec(3)
    model = build_model(spec)
    block_params = sum(p.numel() for b in model.blocks for p in b.parameters())
    total_params = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh("cpu", (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    tokens, targets = synthetic_batch(spec, 1)

    moved = {("copy_out", "fwd"): 0.0, ("copy_out", "bwd"): 0.0, ("chunk_cat", "bwd"): 0.0}
    phase = ["fwd"]
    split_copy, chunk_cat = torch.split_with_sizes_copy, torch._chunk_cat

    def spy_split(t, sizes, dim=0, *, out):
        moved[("copy_out", phase[0])] += t.numel() * t.element_size() * 2   # read + write
        return split_copy(t, sizes, dim=dim, out=out)

    def spy_cat(tensors, dim, num_chunks, *, out):
        moved[("chunk_cat", phase[0])] += sum(x.numel() * x.element_size() for x in tensors) \
            + sum(x.numel() for x in tensors) * out.element_size()
        return chunk_cat(tensors, dim, num_chunks, out=out)

    monkeypatch.setattr(torch, "split_with_sizes_copy", spy_split)
    monkeypatch.setattr(torch, "_chunk_cat", spy_cat)
    loss = model(tokens, targets)
    phase[0] = "bwd"
    loss.backward()

    m = HOST.mechanisms["fsdp2_unit"]
    # forward: every unit (blocks and root) gathered once, 2 B bf16 read + 2 B written
    assert moved[("copy_out", "fwd")] == pytest.approx(4.0 * total_params, rel=0.02)
    assert m.device_bytes_per_param_fwd == 4.0
    # backward: the blocks regathered (the root stays unsharded), every gradient chunk-cat
    # from bf16 into the fp32 reduce-scatter buffer
    assert moved[("copy_out", "bwd")] == pytest.approx(4.0 * block_params, rel=0.02)
    assert moved[("chunk_cat", "bwd")] == pytest.approx(6.0 * total_params, rel=0.02)
    assert m.device_bytes_per_param_bwd == 4.0 + 6.0
    # the simulator's ops for this chunk carry those bytes (root's backward gather included)
    c = device_copy_ops(("fsdp2_unit",), total_params, len(model.blocks), 0)
    assert c.fwd[0].bytes_moved == pytest.approx(4.0 * total_params)
    assert c.first[0].bytes_moved == pytest.approx(4.0 * total_params)     # copy-out
    assert c.rest[0].bytes_moved == pytest.approx(6.0 * total_params)      # chunk-cat
    assert c.fwd[0].kernels == c.first[0].kernels == c.rest[0].kernels == len(model.blocks)


def test_fsdp2_unit_host_cost_is_the_median_of_its_mixed_precision_rows():
    """frameworks.json fsdp2_unit's host cost per unit is the median of the measured rows for
    torchtitan-shaped blocks (9 parameter tensors) under MixedPrecisionPolicy(bf16, fp32)
    (hardware_db/data/measurements/host_mechanisms.csv, calibrate.bench_dp.fsdp2_rows)."""
    import csv
    import statistics
    from pathlib import Path

    from simulator.frameworks import HOST
    path = Path(__file__).resolve().parents[3] / "hardware_db" / "data" / "measurements" / \
        "host_mechanisms.csv"
    rows = [r for r in csv.DictReader(path.open()) if r["mechanism"] == "fsdp2_unit"
            and r["metric"].startswith("per unit of 9 tensors")]
    assert len(rows) >= 6 and all("MixedPrecisionPolicy" in r["method"] for r in rows)
    m = HOST.mechanisms["fsdp2_unit"]
    for pas, got in (("fwd", m.layer_fwd_eager_ops), ("bwd", m.layer_bwd_eager_ops)):
        med = statistics.median(float(r["eager_ops"]) for r in rows if r["metric"].endswith(pas))
        assert got == pytest.approx(med, abs=0.01), pas
