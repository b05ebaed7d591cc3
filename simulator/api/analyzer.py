"""``ComplexityAnalyzer``: the four-line workflow of the design brief, with a ledger.

    from simulator import ComplexityAnalyzer
    analyzer = ComplexityAnalyzer()
    baseline_metrics = analyzer.analyze_model(model, config)
    optimized_config = analyzer.auto_tune(hardware_specs)
    performance_prediction = analyzer.predict_performance(optimized_config)

``model``: a preset name, a HuggingFace ``config.json`` path or dict, a
``TransformerSpec``, or any ``torch.nn.Module`` (with ``input_shape`` or
``example_inputs`` in the config). ``config``: a dict or ``TrainingConfig`` (``gpu``,
``n_gpus``, ``seq_len``, ``global_batch``, ``micro_batch``, ``precision``, parallel
layout, ``input_shape`` ...). ``hardware_specs``: ``{"gpu": "h100-sxm", "gpus": 32}``, a
GPU key, a ``HardwareChoice``, a ``ClusterSpec``, or a list of them. ``auto_tune`` and
``predict_performance`` work on the model of the last ``analyze_model`` (or ``model=``).

Every call appends one row to the ledger (``ExperimentLedger``: Parquet, inputs, outputs,
diff against the previous attempt); ``analyzer.ledger.compare()`` or ``complexity ledger``
shows which single change moved what.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import InvalidInputError
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..planning.capacity import HardwareCatalog, HardwareChoice
from ..search.driver import SearchOptions, SearchReport
from ..workload import from_hf_config, resolve_model
from ..workload.spec import TransformerSpec
from . import module_flow, transformer_flow
from .config import TrainingConfig
from .ledger import ExperimentLedger
from .results import BaselineMetrics, Prediction
from .transformer_flow import model_flops_per_token

_MODEL_VALID = ("a preset name, a config.json path, a HuggingFace config dict, a "
                "TransformerSpec, or a torch.nn.Module")


def _is_module(obj: Any) -> bool:
    """A torch.nn.Module, recognised without importing torch for other inputs."""
    mods = [c.__module__ + "." + c.__name__ for c in type(obj).__mro__]
    return "torch.nn.modules.module.Module" in mods


@dataclass
class _Current:
    """The model the analyzer is working on (set by ``analyze_model``)."""

    name: str
    spec: TransformerSpec | None = None
    module: Any = None
    graph: Any = None                     # the module's traced graph (traced once)
    config: TrainingConfig = TrainingConfig()


class ComplexityAnalyzer:
    """Model analysis, auto-tuning and prediction, each call logged to the ledger."""

    def __init__(self, ledger: str | Path | None = "complexity-ledger",
                 catalog: HardwareCatalog | None = None,
                 options: SearchOptions | None = None) -> None:
        self.ledger = ExperimentLedger(ledger) if ledger else None
        self.options = options or SearchOptions(event_top=3, top_k=5)
        if catalog is None:
            from .catalog import HardwareDbCatalog  # the entry layer may load hardware_db
            catalog = HardwareDbCatalog()
        self.catalog = catalog
        self.current: _Current | None = None
        self.last_search: SearchReport | list[Prediction] | None = None

    # ---- resolution -------------------------------------------------------------------
    def _resolve(self, model: Any, cfg: TrainingConfig) -> _Current:
        if isinstance(model, TransformerSpec):
            spec = model if cfg.seq_len is None else model.with_seq_len(cfg.seq_len)
            return _Current(spec.name, spec=spec, config=cfg)
        if isinstance(model, (str, Path)):
            spec = resolve_model(str(model), cfg.seq_len)
            return _Current(spec.name, spec=spec, config=cfg)
        if isinstance(model, Mapping):
            spec = from_hf_config(model, seq_len=cfg.seq_len)
            return _Current(spec.name, spec=spec, config=cfg)
        if _is_module(model):
            return _Current(type(model).__name__, module=model, config=cfg)
        raise InvalidInputError("model", type(model).__name__, _MODEL_VALID)

    def _target(self, cfg: TrainingConfig) -> tuple[ClusterSpec, Profile]:
        cluster = self.catalog.cluster(HardwareChoice(cfg.gpu, cfg.n_gpus))
        return cluster, self.catalog.profile(cluster.gpu.key)

    def _need_model(self, model: Any, cfg: TrainingConfig) -> _Current:
        if model is not None:
            cur = self._resolve(model, cfg)
            if cur.module is not None:
                cur.graph = module_flow.trace(cur.module, cfg)
            self.current = cur
        if self.current is None:
            raise InvalidInputError("model", None, "call analyze_model(model, config) first, "
                                    "or pass model=" + " (" + _MODEL_VALID + ")")
        return self.current

    def _log(self, method: str, inputs: dict[str, Any], outputs: dict[str, Any],
             metrics: Mapping[str, float | None]) -> None:
        if self.ledger is not None:
            self.ledger.append(method, inputs, outputs, metrics)

    # ---- the workflow -----------------------------------------------------------------
    def analyze_model(self, model: Any = None,
                      config: TrainingConfig | Mapping[str, Any] | None = None,
                      **config_keys: Any) -> BaselineMetrics:
        """Baseline FLOPs, memory, arithmetic intensity, bottleneck and step time of
        ``model`` on ``config`` (keyword arguments: config keys, e.g. ``n_gpus=8``)."""
        if model is None:
            raise InvalidInputError("model", None, _MODEL_VALID)
        cfg = TrainingConfig.coerce(_merged(config, config_keys))
        cur = self._resolve(model, cfg)
        cluster, prof = self._target(cfg)
        if cur.spec is not None:
            out = transformer_flow.analyze(cur.spec, cfg, cluster, prof)
        else:
            out, cur.graph = module_flow.analyze(cur.module, cfg, cluster, prof)
        cur.config = cfg                  # as given: auto_tune may still choose what was left open
        self.current = cur
        self._log("analyze_model", _inputs(cur.name, cfg), out.to_dict(), out.metrics())
        return out

    def auto_tune(self, hardware_specs: Any = None, *, model: Any = None,
                  global_batch: int | None = None, **options: Any) -> TrainingConfig:
        """Search the strategy space on ``hardware_specs`` and return the best config.

        Transformers: every valid TP/PP/DP/CP/EP, ZeRO, micro-batch, recompute plan
        (``simulator.search``); modules: DDP at three bucket caps and FSDP, in the
        config's precision (fp32 and bf16 when none was set)."""
        base = self.current.config if self.current and model is None else TrainingConfig()
        if global_batch is not None:
            base = base.with_(global_batch=global_batch)
        cur = self._need_model(model, base)
        targets = [(c, self.catalog.profile(c.gpu.key)) for c in self._clusters(hardware_specs, base)]
        if cur.spec is not None:
            unknown = sorted(set(options) - set(SearchOptions.__dataclass_fields__))
            if unknown:
                raise InvalidInputError(unknown[0], options[unknown[0]], "a SearchOptions field: "
                                        + ", ".join(SearchOptions.__dataclass_fields__))
            opts = SearchOptions(**{**self.options.__dict__, **options})
            if "space" not in options:             # the config's dispatcher, unless told
                opts = replace(opts, space=replace(opts.space,
                                                   moe_dispatcher=base.moe_dispatcher))
            best, self.last_search = transformer_flow.tune(cur.spec, base, targets, opts)
            found = self.last_search.to_dict()
            w = self.last_search.winner.to_dict()
            metrics = {k: w.get(k) for k in ("step_time_s", "tokens_per_s_per_gpu", "mfu",
                                             "peak_memory_gb")}
        else:
            best, self.last_search = module_flow.tune(cur.graph, base, targets)
            found = {"candidates": [p.to_dict() for p in self.last_search]}
            metrics = next(p.metrics() for p in self.last_search if p.config == best)
        cur.config = best
        self._log("auto_tune", {"model": cur.name, "config": base.to_dict(),
                                "hardware": [f"{c.n_gpus}x{c.gpu.key}" for c, _ in targets]},
                  {"best": best.to_dict(), "search": found}, metrics)
        return best

    def predict_performance(self, config: TrainingConfig | Mapping[str, Any] | None = None, *,
                            model: Any = None, **config_keys: Any) -> Prediction:
        """Simulate ``config`` (default: the current one; keyword arguments change single
        keys, e.g. ``n_gpus=16``) and return the prediction with its breakdown."""
        if config_keys:
            base = config if config is not None else (
                self.current.config if self.current else TrainingConfig())
            config = _merged(base, config_keys)
        if isinstance(config, Mapping) and "model" in config and model is None:
            config = dict(config)
            model = config.pop("model")
        cfg = TrainingConfig.coerce(config) if config is not None else (
            self.current.config if self.current else TrainingConfig())
        cur = self._need_model(model, cfg)
        cluster, prof = self._target(cfg)
        if cur.spec is not None:
            out = transformer_flow.predict(cur.spec, cfg, cluster, prof)
        else:
            out = module_flow.predict(cur.graph, cfg, cluster, prof)
        self._log("predict_performance", _inputs(cur.name, cfg), out.to_dict(), out.metrics())
        return out

    # ---- hardware ---------------------------------------------------------------------
    def _clusters(self, specs: Any, cfg: TrainingConfig) -> list[ClusterSpec]:
        if specs is None:
            specs = {"gpu": cfg.gpu, "gpus": cfg.n_gpus}
        if isinstance(specs, ClusterSpec):
            return [specs]
        if isinstance(specs, HardwareChoice):
            return [self.catalog.cluster(specs)]
        if isinstance(specs, str):
            return [self.catalog.cluster(HardwareChoice(specs, cfg.n_gpus))]
        if isinstance(specs, Mapping):
            return [self.catalog.cluster(c) for c in _choices(specs)]
        if isinstance(specs, Sequence) and specs:
            return [c for s in specs for c in self._clusters(s, cfg)]
        raise InvalidInputError("hardware_specs", type(specs).__name__,
                                'a GPU key, {"gpu": "h100-sxm", "gpus": 32}, a HardwareChoice, '
                                "a ClusterSpec, or a list of them")


def _merged(config: TrainingConfig | Mapping[str, Any] | None,
            keys: Mapping[str, Any]) -> TrainingConfig | Mapping[str, Any] | None:
    """``config`` with single keys changed (each checked by ``TrainingConfig``)."""
    if not keys:
        return config
    if isinstance(config, TrainingConfig):
        config = config.to_dict() | ({"example_inputs": config.example_inputs}
                                     if config.example_inputs is not None else {})
    if config is not None and not isinstance(config, Mapping):
        return config                                   # coerce names the bad type
    return {**(config or {}), **keys}


def _inputs(model: str, cfg: TrainingConfig) -> dict[str, Any]:
    """Ledger inputs of a call on one configuration, as the user gave it (same keys as
    ``auto_tune``'s, so consecutive attempts diff key by key)."""
    return {"model": model, "config": cfg.to_dict(), "hardware": [f"{cfg.n_gpus}x{cfg.gpu}"]}


def _choices(specs: Mapping[str, Any]) -> list[HardwareChoice]:
    unknown = set(specs) - {"gpu", "gpus", "n_gpus", "nic_gbps", "nics_per_node", "gpus_per_node"}
    if unknown or "gpu" not in specs:
        raise InvalidInputError("hardware_specs", dict(specs),
                                "keys gpu (required), gpus, nic_gbps, nics_per_node, gpus_per_node")
    counts = specs.get("gpus", specs.get("n_gpus", 1))
    counts = counts if isinstance(counts, (list, tuple)) else [counts]
    return [HardwareChoice(str(specs["gpu"]), n, specs.get("nic_gbps"), specs.get("nics_per_node"),
                           specs.get("gpus_per_node")) for n in counts]


__all__ = ["ComplexityAnalyzer", "ExperimentLedger", "TrainingConfig", "BaselineMetrics",
           "Prediction", "model_flops_per_token"]
