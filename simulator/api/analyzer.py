"""``ComplexityAnalyzer``: the Python API of the design brief, with an experiment ledger.

    from simulator.api.analyzer import ComplexityAnalyzer
    az = ComplexityAnalyzer(ledger="runs/ledger")
    az.analyze_model("llama3-8b", {"gpu": "h100-sxm", "tp": 2, "micro_batch": 1})
    az.auto_tune({"gpu": "h100-sxm", "n_gpus": 64}, model="llama3-8b", global_batch=512)
    az.predict_performance({"model": "llama3-8b", "gpu": "h100-sxm", "n_gpus": 64,
                            "global_batch": 512, "tp": 2, "pp": 1})

Every call appends one row (inputs and results as JSON, plus a few flat metrics) to the
ledger, a Parquet dataset directory with one part file per call, so attempts stay
comparable later (``ExperimentLedger.read()``).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..engine.simulate import simulate
from ..errors import InvalidInputError
from ..parallel.plan import Plan
from ..planning.capacity import HardwareCatalog, HardwareChoice
from ..planning.whatif import OpRoofline, ridge_flop_per_byte, roofline_ops
from ..search.driver import (
    SearchOptions,
    SearchReport,
    main_bottleneck,
    make_context,
    search,
)
from ..search.space import SearchSpace, estimate_stage_memory
from ..search.store import plan_dict
from ..workload import resolve_model
from ..workload.ops import LayerShape, backward_ops, embedding_ops, head_ops, layer_ops
from ..workload.spec import TransformerSpec

_PLAN_FIELDS = {f.name for f in fields(Plan)}


class ExperimentLedger:
    """Append-only Parquet dataset: ``<dir>/part-<ns>-<pid>-<n>.parquet``, one row each."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self._n = 0

    def append(self, method: str, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
               metrics: Mapping[str, float | None]) -> dict[str, Any]:
        import pyarrow as pa
        import pyarrow.parquet as pq
        self.dir.mkdir(parents=True, exist_ok=True)
        self._n += 1
        stamp = f"{time.time_ns()}-{os.getpid()}-{self._n}"
        row = {"entry_id": stamp, "created_utc": datetime.now(timezone.utc).isoformat(),
               "method": method, "model": str(inputs.get("model", "")),
               "gpu": str(inputs.get("gpu", "")), "n_gpus": int(inputs.get("n_gpus") or 0),
               "inputs_json": json.dumps(inputs, sort_keys=True, default=str),
               "outputs_json": json.dumps(outputs, sort_keys=True, default=str)}
        for k in ("step_time_s", "tokens_per_s_per_gpu", "mfu", "peak_memory_gb"):
            v = metrics.get(k)
            row[k] = float(v) if v is not None else float("nan")
        tmp = self.dir / f".part-{stamp}.tmp"
        pq.write_table(pa.Table.from_pylist([row]), tmp)
        tmp.replace(self.dir / f"part-{stamp}.parquet")
        return row

    def read(self) -> list[dict[str, Any]]:
        import pyarrow.parquet as pq
        rows = []
        for part in sorted(self.dir.glob("part-*.parquet")) if self.dir.is_dir() else []:
            rows += pq.read_table(part).to_pylist()
        return sorted(rows, key=lambda r: r["entry_id"])


@dataclass(frozen=True)
class ModelAnalysis:
    model: str
    params_total: int
    params_active: int
    model_flops_per_token: float           # forward + backward, PaLM convention
    model_flops_per_step: float | None
    peak_memory_bytes_per_gpu: float
    memory_capacity_bytes: float
    ridge_flop_per_byte: float
    ops: tuple[OpRoofline, ...]

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "ops"}
        d["ops"] = [{**o.__dict__, "roofline": o.roofline.value} for o in self.ops]
        return d


def model_flops_per_token(model: TransformerSpec) -> float:
    """Forward + backward model FLOPs per token of the whole model (no parallelism)."""
    sh = LayerShape(micro_batch=1, seq_len=model.seq_len)
    per_kind: dict[tuple[bool, bool], float] = {}
    total = 0.0
    for layer in range(model.n_layers):
        kind = model.layer_kind(layer)
        if kind not in per_kind:
            fwd = layer_ops(model, sh, layer)
            per_kind[kind] = sum(o.model_flops for o in fwd + backward_ops(fwd))
        total += per_kind[kind]
    edge = embedding_ops(model, sh) + head_ops(model, sh)
    total += sum(o.model_flops for o in edge + backward_ops(edge))
    return total / model.seq_len


class ComplexityAnalyzer:
    """Model analysis, auto-tuning and prediction, each call logged to the ledger."""

    def __init__(self, ledger: str | Path | None = "complexity-ledger",
                 catalog: HardwareCatalog | None = None,
                 options: SearchOptions | None = None) -> None:
        self.ledger = ExperimentLedger(ledger) if ledger else None
        self.options = options or SearchOptions(event_top=3, top_k=5)
        if catalog is None:
            from .catalog import HardwareDbCatalog  # the CLI side may load hardware_db
            catalog = HardwareDbCatalog()
        self.catalog = catalog

    # ---- helpers ----------------------------------------------------------------------
    def _model(self, model: str | TransformerSpec, seq_len: int | None) -> TransformerSpec:
        if isinstance(model, TransformerSpec):
            return model if seq_len is None else model.with_seq_len(seq_len)
        return resolve_model(str(model), seq_len)

    def _plan(self, config: Mapping[str, Any], n_gpus: int | None) -> Plan:
        kw = {k: v for k, v in config.items() if k in _PLAN_FIELDS}
        tp, pp, cp = kw.get("tp", 1), kw.get("pp", 1), kw.get("cp", 1)
        if "dp" not in kw:
            kw["dp"] = max(1, (n_gpus or tp * pp * cp) // (tp * pp * cp))
        kw.setdefault("global_batch", kw["dp"] * kw.get("micro_batch", 1))
        if kw.get("vpp", 1) > 1:
            kw.setdefault("schedule", "interleaved")
        return Plan(**kw)

    def _log(self, method, inputs, outputs, metrics) -> None:
        if self.ledger is not None:
            self.ledger.append(method, inputs, outputs, metrics)

    # ---- API --------------------------------------------------------------------------
    def analyze_model(self, model: str | TransformerSpec, config: Mapping[str, Any]) -> ModelAnalysis:
        """FLOPs, memory per GPU, arithmetic intensity and roofline class per op."""
        m = self._model(model, config.get("seq_len"))
        gpu = config.get("gpu", "h100-sxm")
        plan = self._plan(config, config.get("n_gpus"))
        cluster = self.catalog.cluster(HardwareChoice(gpu, config.get("n_gpus") or plan.world_size))
        prof = self.catalog.profile(cluster.gpu.key)
        per_token = model_flops_per_token(m)
        mem = max(s.total_bytes for s in estimate_stage_memory(m, plan))
        out = ModelAnalysis(m.name, m.total_params(), m.active_params(), per_token,
                            per_token * plan.global_batch * m.seq_len, mem, cluster.gpu.mem_bytes,
                            ridge_flop_per_byte(cluster, plan.precision),
                            tuple(roofline_ops(m, plan, cluster, prof)))
        self._log("analyze_model", {"model": m.name, "gpu": cluster.gpu.key, "n_gpus": cluster.n_gpus,
                                    "plan": plan_dict(plan)},
                  out.to_dict(), {"peak_memory_gb": mem / 1e9})
        return out

    def auto_tune(self, hardware_specs: Mapping[str, Any] | HardwareChoice | Sequence,
                  model: str | TransformerSpec, global_batch: int | Sequence[int],
                  seq_len: int | None = None, objective: str = "throughput",
                  space: SearchSpace | None = None, **options: Any) -> SearchReport:
        """The strategy search over every hardware spec and global batch given."""
        m = self._model(model, seq_len)
        choices = _choices(hardware_specs)
        batches = [global_batch] if isinstance(global_batch, int) else list(global_batch)
        ctxs = []
        for ch in choices:
            cluster = self.catalog.cluster(ch)
            prof = self.catalog.profile(cluster.gpu.key)
            ctxs += [make_context(m, cluster, prof, gb) for gb in batches]
        opts = SearchOptions(**{**_options_dict(self.options), "objective": objective,
                                **({"space": space} if space else {}), **options})
        rep = search(ctxs, opts)
        w = rep.winner
        self._log("auto_tune", {"model": m.name, "gpu": ",".join(c.gpu for c in choices),
                                "n_gpus": choices[0].n_gpus, "hardware": [c.__dict__ for c in choices],
                                "global_batch": batches, "objective": objective},
                  rep.to_dict(), _metrics(w.to_dict()) if w else {})
        return rep

    def predict_performance(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Simulate one configuration: ``model``, ``gpu``, ``n_gpus``, plan fields, ``engine``."""
        if "model" not in config:
            raise InvalidInputError("model", None, "a preset name, config.json path or TransformerSpec")
        m = self._model(config["model"], config.get("seq_len"))
        ch = HardwareChoice(config.get("gpu", "h100-sxm"), int(config.get("n_gpus") or 1),
                            config.get("nic_gbps"), config.get("nics_per_node"))
        cluster = self.catalog.cluster(ch)
        plan = self._plan(config, ch.n_gpus)
        res = simulate(m, plan, cluster, self.catalog.profile(cluster.gpu.key),
                       engine=config.get("engine", "event"))
        out = {**res.to_dict(), "main_bottleneck": main_bottleneck(res.breakdown.as_dict()).value,
               "peak_memory_gb": max(res.peak_memory_bytes) / 1e9, "plan": plan_dict(plan)}
        out.pop("stages", None)
        self._log("predict_performance", {"model": m.name, "gpu": cluster.gpu.key,
                                          "n_gpus": cluster.n_gpus, "plan": plan_dict(plan)},
                  out, _metrics(out))
        return out


def _choices(specs) -> list[HardwareChoice]:
    if isinstance(specs, HardwareChoice):
        return [specs]
    if isinstance(specs, Mapping):
        counts = specs.get("n_gpus", specs.get("gpus"))
        counts = counts if isinstance(counts, (list, tuple)) else [counts]
        return [HardwareChoice(specs["gpu"], int(n), specs.get("nic_gbps"), specs.get("nics_per_node"))
                for n in counts]
    out: list[HardwareChoice] = []
    for s in specs:
        out += _choices(s)
    if not out:
        raise InvalidInputError("hardware_specs", specs, "a GPU key and count (or a list of them)")
    return out


def _options_dict(o: SearchOptions) -> dict[str, Any]:
    return {f.name: getattr(o, f.name) for f in fields(o)}


def _metrics(d: Mapping[str, Any]) -> dict[str, float | None]:
    return {k: d.get(k) for k in ("step_time_s", "tokens_per_s_per_gpu", "mfu", "peak_memory_gb")}


__all__ = ["ComplexityAnalyzer", "ExperimentLedger", "ModelAnalysis", "model_flops_per_token"]
