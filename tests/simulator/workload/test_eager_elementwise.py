"""Eager model code's elementwise ops (``frameworks.json`` "eager_elementwise"): HF
transformers' LlamaRMSNorm, rotate_half RoPE and act(gate) * up move several times the bytes
of one fused kernel. Checked against the measurement file, against the modules themselves
where transformers is installed, and in the op graph of frameworks that run such code."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from simulator.frameworks.defaults import EAGER, framework_memory
from simulator.parallel.framework_plan import with_framework
from simulator.parallel.plan import Plan
from simulator.engine.stage_work import layer_shape
from simulator.workload.ops import backward_ops, layer_ops
from simulator.workload.presets import get_preset

CSV = Path(__file__).resolve().parents[3] / "hardware_db" / "data" / "measurements" / \
    "eager_elementwise.csv"


def _csv() -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    with CSV.open(newline="") as f:
        for r in csv.DictReader(f):
            out.setdefault(r["module"], {})[r["metric"]] = float(r["value"])
    return out


def test_the_coefficients_are_the_measured_rows():
    rows = _csv()
    for key, t in EAGER.items():
        for metric in ("fwd_bytes", "bwd_bytes", "fwd_kernels", "bwd_kernels", "saved_bytes"):
            assert getattr(t, metric) == pytest.approx(rows[key][metric], abs=1e-3), (key, metric)


def test_the_modules_still_move_what_the_file_says():
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from calibrate.bench_eager import measure
    got, rows = measure(), _csv()          # the shapes of the file (cos/sin reads per head)
    for key, metrics in got.items():
        for metric, v in metrics.items():
            assert v == pytest.approx(rows[key][metric], rel=0.02), (key, metric)


def _layer(fw: str, model: str = "llama2-7b"):
    m = get_preset(model)
    plan = with_framework(Plan(micro_batch=1, global_batch=8, dp=8, precision="bf16"), fw)
    sh = layer_shape(m, plan)
    fwd = layer_ops(m, sh)
    return m, sh, {o.name: o for o in fwd + backward_ops(fwd)}


def test_a_llama_layer_under_eager_model_code():
    """hf vs megatron-core on Llama-2-7B: norms, RoPE and SwiGLU move the measured bytes
    per element, launch the measured kernels, and the norms keep 6 B per element (the fp32
    copy and the normalised input) where the fused kernel keeps its 2 B input."""
    m, sh, eager = _layer("hf")
    _, _, fused = _layer("megatron-core")
    th = sh.micro_batch * m.seq_len * m.hidden
    n, r, g = EAGER["rmsnorm"], EAGER["rope"], EAGER["swiglu"]
    assert eager["ln1"].bytes_moved == pytest.approx(n.fwd_bytes * th)
    assert eager["ln1_bwd"].bytes_moved == pytest.approx(n.bwd_bytes * th)
    assert (eager["ln1"].launches, eager["ln1_bwd"].launches) == (8, 16)
    assert eager["ln1"].saved_bytes == pytest.approx(n.saved_bytes * th)
    assert fused["ln1"].bytes_moved == pytest.approx(4 * th) and fused["ln1"].saved_bytes == 2 * th
    assert eager["rope"].bytes_moved == pytest.approx(r.fwd_bytes * 2 * th)   # Q and K (MHA)
    ffn_elems = sh.micro_batch * m.seq_len * m.ffn_hidden
    assert eager["mlp_act"].bytes_moved == pytest.approx(g.fwd_bytes * ffn_elems)
    assert eager["mlp_act"].saved_bytes == fused["mlp_act"].saved_bytes + 2 * ffn_elems
    assert eager["ln1"].kernels == 1          # the host's op count is the framework's own


@pytest.mark.parametrize("fw", ["hf", "pytorch", "fsdp", "fsdp2", "deepspeed", "torchtitan"])
def test_which_frameworks_run_eager_model_code(fw):
    assert framework_memory(fw).eager_elementwise
    for fused in ("megatron-core", "nemo", "megatron-lm", "llm-foundry"):
        assert not framework_memory(fused).eager_elementwise


def test_torchtitan_code_still_moves_what_the_file_says():
    """torchtitan's own RMSNorm and complex-number RoPE, written out from its source, counted
    like transformers' modules (rows 'torchtitan:*' of the measurement file)."""
    pytest.importorskip("torch")
    from calibrate.bench_eager import measure_torchtitan
    rows = _csv()
    got = measure_torchtitan(with_norm=True)
    for metric, v in got.pop("torchtitan:rmsnorm").items():  # its norm: transformers' ops
        assert v == pytest.approx(rows["rmsnorm"][metric], rel=0.02), metric
    for key, metrics in got.items():
        for metric, v in metrics.items():
            assert v == pytest.approx(rows[key][metric], rel=0.02), (key, metric)
            assert getattr(EAGER[key], metric) == pytest.approx(v, rel=0.02), (key, metric)


def test_torchtitan_layer_prices_its_own_eager_code():
    """torchtitan runs its Llama code eagerly (compile = false in its train configs): its
    RoPE moves its own counted bytes, its norms and SwiGLU transformers' (the same ops); its
    complex-number RoPE launches fewer backward kernels than transformers' rotate_half."""
    m, sh, tt = _layer("torchtitan")
    _, _, hf = _layer("hf")
    th = sh.micro_batch * m.seq_len * m.hidden
    n, r = EAGER["rmsnorm"], EAGER["torchtitan:rope"]
    assert sh.eager_code == "torchtitan"
    assert tt["ln1_bwd"].bytes_moved == pytest.approx(n.bwd_bytes * th)
    assert tt["rope_bwd"].bytes_moved == pytest.approx(r.bwd_bytes * 2 * th)
    assert tt["rope_bwd"].launches < hf["rope_bwd"].launches
    assert tt["mlp_act"].bytes_moved == hf["mlp_act"].bytes_moved
    assert tt["ln1_bwd"].bytes_moved == hf["ln1_bwd"].bytes_moved
    assert framework_memory("torchtitan").eager_code == "torchtitan"


def test_layernorm_and_gelu_models_are_unchanged():
    """GPT-3 (LayerNorm, learned positions, GELU): nn.LayerNorm is one fused kernel in eager
    PyTorch too, and there is no RoPE or SwiGLU."""
    _, _, eager = _layer("hf", "gpt3-175b")
    _, _, fused = _layer("megatron-core", "gpt3-175b")
    for name in ("ln1", "ln2", "mlp_act", "ln1_bwd"):
        assert eager[name].bytes_moved == fused[name].bytes_moved


def test_fp32_models_and_the_backward_peak_keep_the_fused_price():
    """The traffic was measured with 16-bit activations (an fp32 model's casts are no-ops):
    fp32 plans keep the fused ops; and the tensors a backward holds at once are the fused
    op's, not the eager op's traffic (``Op.live_bytes``)."""
    from simulator.memory.accounting import _grad_bytes
    m = get_preset("llama2-7b")
    for fw in ("hf", "megatron-core"):
        plan = with_framework(Plan(micro_batch=1, global_batch=8, dp=8, precision="fp32"), fw)
        ops = {o.name: o for o in layer_ops(m, layer_shape(m, plan))}
        assert ops["ln1"].launches == 0 and ops["rope"].launches == 0
    _, sh, eager = _layer("hf")
    _, _, fused = _layer("megatron-core")
    for name in ("ln1", "rope", "mlp_act", "ln2"):
        assert _grad_bytes(eager[name], 2) == _grad_bytes(fused[name], 2), name
        assert eager[name].bytes_moved > fused[name].bytes_moved, name


def test_eager_model_code_pays_its_python_too():
    """One assumption, two costs: a framework whose model code runs eagerly on the device
    (memory 'eager_elementwise') also pays that code's Python on the host (the measured HF
    decoder layer, host mechanism 'hf_decoder_layer'), and no fused framework does. A
    framework with its own eager code (torchtitan) pays its counted device ops but no
    transformers Python: its block's host time is not measured (said in its host source)."""
    from simulator.frameworks import HOST
    from simulator.frameworks.defaults import MEMORY
    for name, mem in MEMORY.items():
        if name == "default":
            continue
        has = "hf_decoder_layer" in HOST.framework(name).mechanisms
        assert has == (mem.eager_elementwise and not mem.eager_code), name
    assert "not measured" in HOST.framework("torchtitan").why


def test_qk_norm_is_an_op_of_the_layer():
    """Qwen3's RMSNorm on the queries and keys (q_norm, k_norm of head_dim per head) is a
    pass over Q and K like the rotation after it; Llama has none, and MLA's latent norms are
    its own ops (q_norm, kv_norm)."""
    m, sh, ops = _layer("megatron-core", "qwen3-30b-a3b")
    tokens = sh.micro_batch * m.seq_len
    qk = tokens * (m.q_dim + m.kv_dim)
    assert ops["qk_norm"].bytes_moved == pytest.approx(4 * qk)
    assert ops["qk_norm"].bytes_moved == ops["rope"].bytes_moved
    assert "qk_norm" not in _layer("megatron-core", "llama2-7b")[2]
    assert "qk_norm" not in _layer("megatron-core", "deepseek-v3")[2]
    _, _, eager = _layer("hf", "qwen3-30b-a3b")
    assert eager["qk_norm"].bytes_moved == pytest.approx(EAGER["rmsnorm"].fwd_bytes * qk)
