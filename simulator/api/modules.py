"""Python entry points for any ``torch.nn.Module``: trace, report, simulate, what-if.

    from simulator.api.modules import analyze_module
    a = analyze_module(model, (x,), gpu="h100-sxm")        # meta-device trace, no weights
    a.graph.forward_flops, a.report.top(5), a.to_dict()

``ComplexityAnalyzer.analyze_model`` (``simulator.api.analyzer``) can hand a module here:
``analyze_module(module, example_inputs, gpu=cluster.gpu, prof=profile)``. A GPU key
(string) is resolved through ``hardware_db`` by ``catalog``, as the
analyzer resolves its catalog. torch is needed only to trace (imported lazily).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..hardware.profile import Profile
from ..hardware.specs import GPUSpec
from ..modules.op_report import OpReport, PriceOptions, op_report, price_graph
from ..workload.traced import TracedGraph


def trace_module(module: Any, example_inputs: Any, loss_fn: Callable | None = None,
                 name: str | None = None) -> TracedGraph:
    """Meta-device trace of one training step (see ``modules.trace_torch``)."""
    from ..modules.trace_torch import trace_module as _trace
    return _trace(module, example_inputs, loss_fn=loss_fn, name=name)


def resolve(gpu: GPUSpec | str | None, prof: Profile | str | None) -> tuple[GPUSpec, Profile]:
    """A device and its profile from objects, a GPU key, or a profile JSON path."""
    if isinstance(prof, str):
        prof = Profile.read_json(prof)
    elif isinstance(prof, Profile):
        prof.validate()              # built in memory: the checks a JSON profile gets
    if isinstance(gpu, GPUSpec) and isinstance(prof, Profile):
        return gpu, prof
    from .catalog import resolve_device  # loads hardware_db
    return resolve_device(gpu if isinstance(gpu, str) else getattr(gpu, "key", None), prof)


@dataclass(frozen=True)
class ModuleAnalysis:
    graph: TracedGraph
    report: OpReport

    def to_dict(self, ops: bool = True) -> dict[str, Any]:
        d = self.report.to_dict(ops)
        d.update({k: v for k, v in self.graph.summary().items() if k not in d})
        return d


def analyze_module(module: Any, example_inputs: Any, gpu: GPUSpec | str | None = "h100-sxm",
                   prof: Profile | str | None = None, loss_fn: Callable | None = None,
                   name: str | None = None, opts: PriceOptions = PriceOptions()) -> ModuleAnalysis:
    """Trace ``module`` on the meta device and place every op on ``gpu``'s roofline."""
    g = trace_module(module, example_inputs, loss_fn=loss_fn, name=name)
    d, p = resolve(gpu, prof)
    return ModuleAnalysis(g, op_report(g, d, p, opts))


def op_times(g: TracedGraph, gpu: GPUSpec, prof: Profile,
             opts: PriceOptions = PriceOptions()) -> tuple[float, ...]:
    return price_graph(g, gpu, prof, opts)
