"""Calibration profile: every efficiency and overhead the cost models use, with provenance.

A ``Profile`` holds dimensionless efficiencies and fixed overheads; peaks come from the
``GPUSpec`` / ``LinkSpec``. That split keeps what-if questions honest: doubling a link's
datasheet bandwidth doubles the achieved bandwidth, the efficiency stays measured.

Profiles are versioned JSON (``SCHEMA_VERSION``). Every ``Coefficient`` says where it came
from (microbenchmark rows, a datasheet, or a stated assumption) and, when fitted, its
standard error and held-out error. The formulas that consume each model live in
``simulator.cost.kernels`` and are the same functions the fitters in ``calibrate.fit`` use.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import CalibrationMissingError, ProfileError
from .specs import GPUSpec, LinkKind, LinkSpec, NodeSpec

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Coefficient:
    """One number with its unit and provenance. ``contaminated``: measured while other load
    competed for the host and never settled (``complexity calibrate`` on a busy host); the
    value is what that host gave and is likely pessimistic."""

    value: float
    unit: str
    source: str
    stderr: float | None = None
    heldout_error_pct: float | None = None
    contaminated: bool = False


@dataclass(frozen=True)
class GemmModel:
    """Dense matmul time model (see ``simulator.cost.kernels.gemm_time_s``).

    ``t = launch + max(flops / (peak * eff_max * wave(m, n) * k/(k + k_half)), bytes / mem_bw)``
    with ``wave`` the busy fraction of the tile waves of ``tile_m x tile_n`` tiles over
    ``GPUSpec.sm_count`` SMs.
    """

    eff_max: Mapping[str, Coefficient]          # per Dtype value, dimensionless
    k_half: Coefficient                         # elements
    launch_us: Coefficient
    tile_m: int = 128
    tile_n: int = 128


@dataclass(frozen=True)
class MemoryModel:
    """Bandwidth-bound kernels: ``t = launch + bytes / (mem_bw * eff)``.

    ``eff`` is ``kind_eff[kind]`` when the profile measured that kind of kernel (see
    ``workload.ops.Op.mem_kind``: "norm", "softmax", "elementwise", "activation", "copy",
    "optimizer"; CPU calibration also writes "residual" and "first_touch"), else ``bw_eff``.
    """

    bw_eff: Coefficient
    launch_us: Coefficient
    kind_eff: Mapping[str, Coefficient] = field(default_factory=dict)

    def eff(self, kind: str = "") -> float:
        c = self.kind_eff.get(kind) if kind else None
        return (c or self.bw_eff).value


@dataclass(frozen=True)
class AttentionModel:
    """Fused (flash-style) attention: fraction of the dtype peak achieved, fwd and bwd.

    Keys are dtypes for FlashAttention-2-class kernels and ``"<kernel>:<dtype>"`` for other
    kernel families (``flash3``: FA3 / cuDNN Hopper kernels); a GPU without an entry for a
    family falls back to the FA2-class value.
    """

    fwd_eff: Mapping[str, Coefficient]
    bwd_eff: Mapping[str, Coefficient]


@dataclass(frozen=True)
class LinkCoefficients:
    """Collective coefficients for one link kind (see ``simulator.network.collectives.collective_time_s``).

    Two protocol regimes, the faster wins (as NCCL picks LL vs Simple):
    small: ``steps * alpha_us + wire_bytes / (B * small_bw_eff)``;
    large: ``base_us + wire_bytes / (B * bw_eff)``;
    ``B`` is the datasheet per-direction bandwidth of the bottleneck link.
    ``in_switch_speedup`` multiplies bandwidth for all-reduce where the fabric reduces in
    the switch (NVLS / SHARP).
    """

    alpha_us: Coefficient
    small_bw_eff: Coefficient
    base_us: Coefficient
    bw_eff: Coefficient
    in_switch_speedup: Coefficient | None = None


@dataclass(frozen=True)
class HostModel:
    """CPU time the host spends issuing work (see ``simulator.cost.host``).

    ``op_fwd_us`` / ``op_bwd_us``: host time per op of the simulator's op graph (one op =
    one module-level kernel: a Linear's GEMM, a norm, an activation, the attention core;
    a memory op with ``kernels`` > 1 counts that many), in eager PyTorch forward (Python,
    dispatcher, autograd recording, kernel launch, and the views and module call around
    the op) and in backward (autograd engine, launch). ``synchronous``: the host thread
    runs the kernels itself (a CPU device), so host and device time add; otherwise (a GPU)
    the host enqueues kernels and runs ahead until a synchronisation point.
    """

    op_fwd_us: Coefficient
    op_bwd_us: Coefficient
    synchronous: bool = False


@dataclass(frozen=True)
class Profile:
    """Everything measured (or assumed, and said so) about one device type and its fabric."""

    name: str
    device_key: str
    gemm: GemmModel
    memory: MemoryModel
    attention: AttentionModel
    links: Mapping[str, LinkCoefficients]       # keyed by LinkKind value
    overlap_slowdown: Coefficient               # compute time multiplier while comm overlaps
    step_overhead_s: Coefficient                # per-step fixed cost (optimizer launch, logging)
    schema_version: int = SCHEMA_VERSION
    fingerprint: Mapping[str, str] = field(default_factory=dict)
    notes: str = ""
    # A measured device that hardware_db does not list (e.g. this CPU) travels with its
    # profile: the device description and the node it was measured in.
    device: GPUSpec | None = None
    node: NodeSpec | None = None
    # Host (CPU) issue cost per op; None: host time not modelled (older profiles).
    host: HostModel | None = None

    def link(self, kind: str) -> LinkCoefficients:
        if kind not in self.links:
            raise CalibrationMissingError(
                f"profile {self.name!r} has no collective coefficients for link kind {kind!r} "
                f"(has {sorted(self.links)})")
        return self.links[kind]

    def gemm_eff(self, dtype: str) -> float:
        if dtype in self.gemm.eff_max:
            return self.gemm.eff_max[dtype].value
        for alt in {"fp8": ("bf16", "fp16"), "fp16": ("bf16",), "bf16": ("fp16",),
                    "tf32": ("fp32",), "fp32": ("tf32",)}.get(dtype, ()):
            if alt in self.gemm.eff_max:
                return self.gemm.eff_max[alt].value
        raise CalibrationMissingError(f"profile {self.name!r} has no GEMM efficiency for {dtype}")

    def attn_eff(self, dtype: str, backward: bool, kernel: str = "flash") -> float:
        table = self.attention.bwd_eff if backward else self.attention.fwd_eff
        keys = (dtype, "bf16", "fp16", "fp32")
        if kernel != "flash":
            keys = tuple(f"{kernel}:{k}" for k in keys) + keys
        for key in keys:
            if key in table:
                return table[key].value
        raise CalibrationMissingError(f"profile {self.name!r} has no attention efficiency")

    # ---- JSON I/O -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types; a coefficient's ``contaminated`` flag appears only when set."""
        return _drop_clean_flags(json.loads(json.dumps(asdict(self), default=_enum_value)))

    def contaminated_paths(self) -> list[str]:
        """Dotted paths of the coefficients marked contaminated."""
        return [p for p, _ in _flagged(self.to_dict(), "profile")]

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Profile":
        ver = d.get("schema_version")
        if ver != SCHEMA_VERSION:
            raise ProfileError("profile.schema_version", ver,
                               f"this build reads schema version {SCHEMA_VERSION}",
                               "re-run `complexity calibrate` or `complexity calibrate fit`")
        try:
            return _profile_from_dict(d)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError("profile", type(exc).__name__,
                               "a profile JSON written by `complexity calibrate`",
                               f"missing or malformed entry {exc}") from None

    @classmethod
    def read_json(cls, path: str | Path) -> "Profile":
        p = Path(path)
        if not p.is_file():
            raise ProfileError("profile", str(p), "an existing profile JSON file")
        try:
            data = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProfileError("profile", str(p), "a readable JSON file", str(exc)) from None
        if not isinstance(data, dict):
            raise ProfileError("profile", str(p), "a JSON object at top level")
        return cls.from_dict(data)


def _coef(d: Mapping[str, Any]) -> Coefficient:
    return Coefficient(**d)


def _coef_map(d: Mapping[str, Any]) -> dict[str, Coefficient]:
    return {k: _coef(v) for k, v in d.items()}


def _profile_from_dict(d: Mapping[str, Any]) -> Profile:
    g = d["gemm"]
    gemm = GemmModel(eff_max=_coef_map(g["eff_max"]), k_half=_coef(g["k_half"]),
                     launch_us=_coef(g["launch_us"]), tile_m=int(g["tile_m"]),
                     tile_n=int(g["tile_n"]))
    m = d["memory"]
    memory = MemoryModel(bw_eff=_coef(m["bw_eff"]), launch_us=_coef(m["launch_us"]),
                         kind_eff=_coef_map(m.get("kind_eff", {})))
    a = d["attention"]
    attention = AttentionModel(fwd_eff=_coef_map(a["fwd_eff"]), bwd_eff=_coef_map(a["bwd_eff"]))
    links = {}
    for kind, lc in d["links"].items():
        sp = lc.get("in_switch_speedup")
        links[kind] = LinkCoefficients(
            alpha_us=_coef(lc["alpha_us"]), small_bw_eff=_coef(lc["small_bw_eff"]),
            base_us=_coef(lc["base_us"]), bw_eff=_coef(lc["bw_eff"]),
            in_switch_speedup=_coef(sp) if sp else None)
    return Profile(name=d["name"], device_key=d["device_key"], gemm=gemm, memory=memory,
                   attention=attention, links=links,
                   overlap_slowdown=_coef(d["overlap_slowdown"]),
                   step_overhead_s=_coef(d["step_overhead_s"]),
                   schema_version=int(d["schema_version"]),
                   fingerprint=dict(d.get("fingerprint", {})), notes=d.get("notes", ""),
                   device=GPUSpec(**d["device"]) if d.get("device") else None,
                   node=_node_from_dict(d["node"]) if d.get("node") else None,
                   host=_host_from_dict(d["host"]) if d.get("host") else None)


def _host_from_dict(d: Mapping[str, Any]) -> HostModel:
    return HostModel(op_fwd_us=_coef(d["op_fwd_us"]), op_bwd_us=_coef(d["op_bwd_us"]),
                     synchronous=bool(d.get("synchronous", False)))


def _link_from_dict(d: Mapping[str, Any]) -> LinkSpec:
    return LinkSpec(**{**d, "kind": LinkKind(d["kind"])})


def _node_from_dict(d: Mapping[str, Any]) -> NodeSpec:
    return NodeSpec(**{**d, "scale_up": _link_from_dict(d["scale_up"]),
                       "nic": _link_from_dict(d["nic"])})


def _drop_clean_flags(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop_clean_flags(v) for k, v in obj.items()
                if not (k == "contaminated" and v is False)}
    if isinstance(obj, list):
        return [_drop_clean_flags(v) for v in obj]
    return obj


def _flagged(obj: Any, path: str):
    if isinstance(obj, dict):
        if obj.get("contaminated") is True:
            yield path, obj
        for k, v in sorted(obj.items()):
            yield from _flagged(v, f"{path}.{k}")


def _enum_value(obj: Any) -> Any:
    if hasattr(obj, "value"):
        return obj.value
    raise TypeError(f"cannot serialise {type(obj).__name__}")
