"""Complexity Framework's simulator: predict step time, memory and cost of distributed
training before renting the GPUs.

    from simulator import ComplexityAnalyzer
    analyzer = ComplexityAnalyzer()
    baseline_metrics = analyzer.analyze_model(model, config)
    optimized_config = analyzer.auto_tune(hardware_specs)
    performance_prediction = analyzer.predict_performance(optimized_config)

The entry points load on first use (``__getattr__``), so ``import simulator`` stays fast
and imports neither torch nor hardware_db.
"""
from __future__ import annotations

from typing import Any

_LAZY = {
    "ComplexityAnalyzer": "simulator.api.analyzer",
    "ExperimentLedger": "simulator.api.ledger",
    "TrainingConfig": "simulator.api.config",
    "analyze_module": "simulator.api.modules",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
