"""Tracing any torch.nn.Module into the operator graph (meta device, no weights)."""
from __future__ import annotations

import collections
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
ZOO = ROOT / "examples" / "module_zoo.py"


def test_import_simulator_without_torch():
    """Every simulator module imports with torch unavailable (it is imported lazily)."""
    mods = ["simulator", "simulator.cli.main", "simulator.cli.module", "simulator.modules.ddp",
            "simulator.modules.fsdp", "simulator.modules.compression", "simulator.modules.precision_whatif",
            "simulator.modules.op_report", "simulator.modules.run", "simulator.modules.calib",
            "simulator.api.modules", "simulator.modules.trace_torch",
            "simulator.modules.trace_state", "simulator.workload.traced",
            "simulator.workload.aten_cost"]
    code = ("import sys; sys.modules['torch'] = None\n"
            + "".join(f"import {m}\n" for m in mods)
            + "from simulator.cli.main import build_parser; build_parser()\n"
            + "assert sys.modules['torch'] is None\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def zoo():
    spec = importlib.util.spec_from_file_location("module_zoo_test", ZOO)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _meta(factory):
    with torch.device("meta"):
        res = factory()
    return res[0], res[1], (res[2] if len(res) == 3 else None)


def _flop_counter(module, inputs, loss_fn):
    from torch.utils.flop_counter import FlopCounterMode
    fc = FlopCounterMode(display=False)
    with fc:
        out = module(*inputs)
        (loss_fn(out) if loss_fn else out.sum()).backward()
    return fc


def _by_type(g) -> dict[str, float]:
    acc: dict[str, float] = collections.defaultdict(float)
    for o in g.ops:
        if o.flops:
            key = "aten.bmm" if o.aten.startswith("fused.sdpa") else ".".join(o.aten.split(".")[:2])
            acc[key] += o.flops
    return dict(acc)


CASES = {
    "resnet50": lambda z: z.resnet50(batch=2, image=64),
    "vit": lambda z: z.vit_small(batch=2, image=64),
    "gpt": lambda z: z.gpt_small(batch=2, seq=64),
    "custom": lambda z: z.custom_mlp(batch=16),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_flops_match_flop_counter_mode(zoo, case):
    from simulator.modules.trace_torch import trace_module
    module, inputs, loss_fn = _meta(lambda: CASES[case](zoo))
    g = trace_module(module, inputs, loss_fn=loss_fn, name=case)
    fc = _flop_counter(module, inputs, loss_fn)
    theirs = {str(k): float(v) for k, v in fc.get_flop_counts()["Global"].items()}
    mine = _by_type(g)
    assert set(mine) == set(theirs)
    for k, v in theirs.items():
        assert mine[k] == pytest.approx(v, rel=0.01), k
    assert g.total_flops == pytest.approx(fc.get_total_flops(), rel=0.01)
    _per_module_agrees(module, inputs, g, fc)


def _inclusive(g, path: str, phases: tuple[str, ...]) -> float:
    return sum(o.flops for o in g.ops if o.phase in phases
               and (o.module == path or o.module.startswith(path + ".")))


def _per_module_agrees(module, inputs, g, fc) -> None:
    """Forward FLOPs per module (submodules included) agree everywhere; forward + backward
    agree for every module that has children (FlopCounterMode's backward windows of sibling
    leaves that share an input overlap, so leaf-level backward is not comparable)."""
    from torch.utils.flop_counter import FlopCounterMode
    root = type(module).__name__
    fwd = FlopCounterMode(display=False)
    with fwd, torch.no_grad():
        module(*inputs)
    parents = {n for n, m in module.named_modules() if any(True for _ in m.children())}
    for counts, phases, keep in ((fwd.get_flop_counts(), ("forward",), lambda p: True),
                                 (fc.get_flop_counts(), ("forward", "backward"), parents.__contains__)):
        for name, c in counts.items():
            path = name[len(root) + 1:]
            if name.startswith(root + ".") and keep(path):
                assert _inclusive(g, path, phases) == pytest.approx(sum(c.values()), rel=0.01), name


def test_grouped_convolution_counts_true_weight_gradient_flops(zoo):
    """FlopCounterMode charges a grouped convolution's weight gradient ``groups`` times the
    forward FLOPs; the trace charges the real work (= the forward FLOPs). Everything else
    agrees exactly."""
    from simulator.modules.trace_torch import trace_module
    module, inputs, loss_fn = _meta(lambda: zoo.resnext_tiny())
    g = trace_module(module, inputs)
    fc = _flop_counter(module, inputs, loss_fn)
    grouped = [o for o in g.ops if o.aten == "aten.convolution.default" and o.op.batch > 1]
    assert grouped
    overcount = sum((o.op.batch - 1) * o.flops for o in grouped)
    assert g.total_flops + overcount == pytest.approx(fc.get_total_flops(), rel=1e-6)


def test_custom_autograd_function_is_reported(zoo):
    from simulator.modules.trace_torch import trace_module
    module, inputs, _ = _meta(zoo.custom_mlp)
    g = trace_module(module, inputs)
    assert g.custom_functions == ("LinearFn", "SquaredReLU")
    lin = [o for o in g.ops if o.custom == "LinearFn"]
    assert {o.phase for o in lin} == {"forward", "backward"}
    assert sum(o.flops for o in lin if o.phase == "backward") == 2 * sum(
        o.flops for o in lin if o.phase == "forward")
    assert any("LinearFn" in n for n in g.notes)
    assert {r.param for r in g.grad_ready} == {"w1", "b1", "fc2.weight", "fc2.bias"}


def test_graph_structure_gpt(zoo):
    from simulator.modules.trace_torch import trace_module
    module, inputs, loss_fn = _meta(lambda: zoo.gpt_small(batch=2, seq=64))
    g = trace_module(module, inputs, loss_fn=loss_fn)
    attn = [o for o in g.ops if o.aten.startswith("fused.sdpa")]
    assert len(attn) == 12 and {o.kind.value for o in attn} == {"attention"}
    ops = {o.index: o for o in g.ops}
    for o in g.ops:                      # dependencies point backwards in time
        assert all(d < o.index for d in o.deps)
    qkv = next(o for o in g.ops if o.module == "blocks.0.attn.qkv" and o.phase == "forward")
    assert qkv.params == ("blocks.0.attn.qkv.bias", "blocks.0.attn.qkv.weight")
    assert qkv.kind.value == "gemm" and (qkv.op.m, qkv.op.n, qkv.op.k) == (128, 1536, 512)
    assert qkv.bytes_read > 0 and qkv.bytes_written == 128 * 1536 * 4
    # tied embedding: one parameter, its gradient ready after both uses
    names = [p.name for p in g.params]
    assert "head.weight" not in names and "tok.weight" in names
    ready = [r.param for r in g.grad_ready]
    assert sorted(ready) == sorted(names)
    assert ready.index("blocks.5.fc2.weight") < ready.index("blocks.0.fc1.weight")
    assert ops[g.grad_ready[-1].after_op].phase == "backward"
    assert g.saved_activation_bytes > 0 and g.forward_flops > 0 and g.backward_flops > 0


def test_trace_does_not_touch_a_real_module(zoo):
    from simulator.modules.trace_torch import trace_module
    module, inputs = zoo.mlp(batch=4, dim=64, hidden=128, depth=1)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    module.eval()
    g = trace_module(module, inputs)
    assert g.param_count == sum(p.numel() for p in module.parameters())
    assert not module.training                                  # mode restored
    for n, p in module.named_parameters():
        assert p.device.type == "cpu" and p.grad is None and torch.equal(p, before[n])


def test_factory_builds_on_meta(zoo):
    from simulator.modules.trace_torch import trace_factory
    g = trace_factory(lambda: zoo.resnet50(batch=2, image=64))
    assert g.meta["built_on"] == "meta"
    assert g.param_count == 25_557_032                           # ResNet-50


def test_untraceable_model_gives_one_line(zoo):
    from simulator.modules.trace_torch import TraceError, trace_factory
    with pytest.raises(TraceError) as exc:
        trace_factory(zoo.branchy, name="branchy")
    msg = str(exc.value)
    assert "\n" not in msg and "_local_scalar_dense" in msg and "data-dependent" in msg


def test_cli_analyze_json_and_errors(tmp_path, capsys):
    from simulator.cli.main import main
    png = tmp_path / "roof.png"
    assert main(["analyze", f"{ZOO}:custom_mlp", "--gpu", "a100-sxm-80gb", "--json",
                 "--png", str(png)]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("forward_flops", "backward_flops", "params", "ops"):
        assert key in d
    assert d["params"] == 525_568 and d["custom_functions"] == ["LinearFn", "SquaredReLU"]
    op = d["ops"][0]
    for key in ("name", "kind", "flops", "bytes", "intensity", "bound"):
        assert key in op
    assert png.stat().st_size > 1000
    assert main(["analyze", f"{ZOO}:branchy"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot trace" in err
    assert main(["analyze", "no_such_file.py:f"]) == 2
