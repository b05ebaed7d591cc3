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
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..boundary.files import atomic_write_text, read_json
from ..errors import CalibrationMissingError, InvalidInputError, ProfileError
from .profile_schema import check_numbers
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
    """Dense / grouped matmul time model (see ``simulator.cost.kernels.gemm_time_s``).

    ``t = launch + max(flops / min(peak * eff_max * wave * k/(k + k_half), peak * sustained),
    bytes / mem_bw)``: ``wave`` is the useful fraction of SM time of the output tiles (best
    over ``tile_shapes()``, over ``GPUSpec.sm_count`` SMs; in waves, or spread evenly when
    ``persistent``), ``k/(k + k_half)`` the k-loop saturation, ``eff_max`` the fraction of
    the dtype peak the best shapes reach at boost clock, and ``sustained_eff`` (where measured)
    the ceiling the power limit holds. A grouped kernel (MoE experts) runs at
    ``grouped_eff`` of that rate. ``mn_half`` (CPU profiles) adds the factor
    ``s/(s + mn_half)``, ``s`` the smaller output dimension. The fields after ``tile_n`` are
    optional: a profile without them gets exactly the earlier formula (one tile, waves, no
    ceiling, no grouped loss, no output-panel term).
    """

    eff_max: Mapping[str, Coefficient]          # per Dtype value, dimensionless
    k_half: Coefficient                         # elements
    launch_us: Coefficient
    tile_m: int = 128
    tile_n: int = 128
    tiles: tuple[tuple[int, int], ...] = ()     # CTA tiles to pick the best of; () = (tile_m, tile_n)
    persistent: bool = False                    # persistent (stream-K) kernels: no last-wave tail
    sustained_eff: Mapping[str, Coefficient] = field(default_factory=dict)  # power-limit ceiling
    k_half_dtype: Mapping[str, Coefficient] = field(default_factory=dict)   # where not k_half
    grouped_eff: Mapping[str, Coefficient] = field(default_factory=dict)    # grouped / dense rate
    # elements: rate x s/(s + mn_half), s = the smaller output dimension (a CPU BLAS packs
    # each operand panel once per pass over the other output dimension); None: no such term
    # (GPU profiles: their output-shape loss is the tile/wave term)
    mn_half: Coefficient | None = None

    def mn_half_value(self) -> float:
        return self.mn_half.value if self.mn_half is not None else 0.0

    def tile_shapes(self) -> tuple[tuple[int, int], ...]:
        return self.tiles or ((self.tile_m, self.tile_n),)

    def k_half_for(self, dtype: str) -> float:
        return (self.k_half_dtype.get(dtype) or self.k_half).value

    def grouped_for(self, dtype: str) -> float:
        """Rate of a grouped (per-group weights, MoE) kernel over the dense model's; 1 where
        none is measured."""
        c = _by_dtype(self.grouped_eff, dtype)
        return c.value if c is not None else 1.0

    def sustained_for(self, dtype: str) -> float:
        """Ceiling as a fraction of the dtype peak; ``inf`` where none is measured."""
        c = _by_dtype(self.sustained_eff, dtype)
        return c.value if c is not None else math.inf


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
class AttentionCurve:
    """Fused-attention efficiency of one kernel family and direction against sequence length.

    ``eff(s) = emax(head_dim) * s / (s + s_half)`` with ``s`` the key/value length one kernel
    call walks: each query tile pays a fixed cost (load Q, rescale, write O and the
    log-sum-exp) amortised over the kv loop, as a GEMM's prologue is over its k loop.
    ``emax`` is tabulated per head dimension (keys are head dims as strings) and
    interpolated in log2(head_dim), clamped at the ends. ``causal_eff``: this family's own
    causal factor where its sweep has causal rows (else ``AttentionModel.causal_eff``).
    """

    emax: Mapping[str, Coefficient]
    s_half: Coefficient                          # tokens
    causal_eff: Coefficient | None = None        # fraction

    def eff(self, seq_k: float, head_dim: int, s_half: float | None = None) -> float:
        sh = self.s_half.value if s_half is None else s_half
        return self.emax_at(head_dim) * seq_k / (seq_k + sh)

    def emax_at(self, head_dim: int) -> float:
        pts = sorted((int(k), c.value) for k, c in self.emax.items())
        if head_dim <= pts[0][0] or len(pts) == 1:
            return pts[0][1]
        for (d0, e0), (d1, e1) in zip(pts, pts[1:]):
            if head_dim <= d1:
                w = (math.log2(head_dim) - math.log2(d0)) / (math.log2(d1) - math.log2(d0))
                return e0 + w * (e1 - e0)
        return pts[-1][1]


@dataclass(frozen=True)
class AttentionModel:
    """Fused (flash-style) attention: fraction of the 16-bit peak achieved, fwd and bwd.

    Keys are dtypes for FlashAttention-2-class kernels and ``"<kernel>:<dtype>"`` for other
    kernel families (``flash3``: the Hopper/Blackwell kernels Transformer Engine runs, cuDNN
    fused attention / FA3); a GPU without an entry for a family falls back to the FA2-class
    value. Where ``curves`` has ``"<kernel>:fwd"`` / ``"<kernel>:bwd"`` (or the FA2-class
    ``"flash:..."``) the efficiency follows the sequence length and head dimension of the call
    (``AttentionCurve``); a causal call sees on average half the kv tiles per query tile and
    computes its diagonal tile in full, so its half-length constant is
    ``2 * s_half + causal_block_tokens``, times ``causal_eff`` (scheduling imbalance of the
    triangular work). Without curves, the constant fractions apply (CPU calibration).
    """

    fwd_eff: Mapping[str, Coefficient]
    bwd_eff: Mapping[str, Coefficient]
    curves: Mapping[str, AttentionCurve] = field(default_factory=dict)
    causal_eff: Coefficient | None = None
    causal_block_tokens: Coefficient | None = None

    def curve(self, kernel: str, backward: bool) -> AttentionCurve | None:
        d = "bwd" if backward else "fwd"
        return self.curves.get(f"{kernel}:{d}") or self.curves.get(f"flash:{d}")

    def curve_eff(self, kernel: str, backward: bool, seq_k: float, head_dim: int,
                  causal: bool) -> float | None:
        c = self.curve(kernel, backward)
        if c is None or seq_k <= 0 or head_dim <= 0:
            return None
        if not causal:
            return c.eff(seq_k, head_dim)
        block = self.causal_block_tokens.value if self.causal_block_tokens else 0.0
        own = c.causal_eff or self.causal_eff
        g = own.value if own else 1.0
        return g * c.eff(seq_k, head_dim, 2.0 * c.s_half.value + block)


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
class StepLatency:
    """NCCL's latency terms for one (algorithm, protocol): a fixed ``base_us`` plus a cost
    per pipeline step inside a scale-up domain and per step across the network."""

    base_us: Coefficient
    intra_step_us: Coefficient
    net_step_us: Coefficient


@dataclass(frozen=True)
class NetworkModel:
    """Coefficients of the flow-level network model (``simulator.network``) for
    collectives that span scale-up domains; single-domain collectives keep the
    ``LinkCoefficients`` of the scale-up link.

    Latency, NCCL's tuner form (``src/graph/tuning.cc``), per protocol - LL (small
    messages), LL128, Simple (large): a ring of ``s`` steps of which ``s_net`` cross the
    network costs ``base + (s - s_net) * max(intra_step, net_overhead) + s_net * net_step``
    (``net_overhead`` x3 under Simple; all-reduce under Simple x ``ring_simple_factor``; with
    one rank per domain the tree's network step, as NCCL does); a double binary tree over
    ``k`` domains ``base + 2 * ((m - 1) * intra_step + log2(k) * net_step)``; NVLSTree
    ``nvls_tree_base_us + nvls_tree_level_us * log2(k)``; an all-to-all ``a2a_peer_us`` per
    peer. Efficiencies: LL128 moves ``ll128_eff`` payload per byte (LL: the links'
    ``small_bw_eff``); ``tree_eff`` of NCCL's tree across domains; ``nvls_eff`` of the
    scale-up port under NVLS (its bytes ``S (1 + 1/m)`` per direction); ``sharp_eff`` of
    in-network reduction; ``pcie_eff`` of the GPU-to-NIC PCIe hop. Network tiers (NIC,
    leaf, spine) use the NIC kind's ``LinkCoefficients.bw_eff`` / ``small_bw_eff``.
    """

    ring_ll: StepLatency
    ring_ll128: StepLatency
    ring_simple: StepLatency
    tree_ll: StepLatency
    tree_ll128: StepLatency
    tree_simple: StepLatency
    net_overhead_us: Coefficient
    ring_simple_factor: Coefficient
    ll128_eff: Coefficient
    tree_eff: Coefficient
    nvls_tree_base_us: Coefficient
    nvls_tree_level_us: Coefficient
    a2a_peer_us: Coefficient
    sharp_eff: Coefficient
    pcie_eff: Coefficient
    nvls_eff: Coefficient | None = None

    def latency(self, algorithm: str, protocol: str) -> StepLatency:
        """``algorithm`` "ring" or "tree", ``protocol`` "LL", "LL128" or "Simple"."""
        return getattr(self, f"{algorithm}_{protocol.lower()}")


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
    network: NetworkModel | None = None           # multi-domain collectives (None: alpha-beta)
    # Host (CPU) issue cost per op; None: host time not modelled (older profiles).
    host: HostModel | None = None

    def link(self, kind: str) -> LinkCoefficients:
        if kind not in self.links:
            raise CalibrationMissingError(
                f"profile {self.name!r} has no collective coefficients for link kind {kind!r} "
                f"(has {sorted(self.links)})")
        return self.links[kind]

    def gemm_eff(self, dtype: str) -> float:
        c = _by_dtype(self.gemm.eff_max, dtype)
        if c is None:
            raise CalibrationMissingError(f"profile {self.name!r} has no GEMM efficiency for {dtype}")
        return c.value

    def attn_eff(self, dtype: str, backward: bool, kernel: str = "flash", seq_k: float = 0.0,
                 head_dim: int = 0, causal: bool = False) -> float:
        """Achieved fraction of the 16-bit peak: from the family's curve when the profile has
        one and the call's shape is given, else the constant fraction."""
        e = self.attention.curve_eff(kernel, backward, seq_k, head_dim, causal)
        if e is not None:
            return e
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
        d = _drop_clean_flags(json.loads(json.dumps(asdict(self), default=_enum_value)))
        if d["gemm"].get("mn_half") is None:      # optional term: absent, not null
            d["gemm"].pop("mn_half", None)
        for c in d["attention"].get("curves", {}).values():
            if c.get("causal_eff") is None:        # optional: the family uses the shared one
                c.pop("causal_eff", None)
        return d

    def contaminated_paths(self) -> list[str]:
        """Dotted paths of the coefficients marked contaminated."""
        return [p for p, _ in _flagged(self.to_dict(), "profile")]

    def validate(self) -> "Profile":
        """The physical range checks of a profile read from JSON (``profile_schema``),
        applied to this one (built in memory by a fitter or by user code); returns it.
        Raises ``ProfileError`` (an ``InvalidInputError``) naming the first bad number's
        path (``profile.memory.kind_eff.norm``), its value and its range."""
        check_numbers(self.to_dict())
        return self

    def write_json(self, path: str | Path) -> None:
        """Write as JSON (atomically) after ``validate``: a file this refuses to read is
        never written."""
        d = self.validate().to_dict()
        atomic_write_text(path, json.dumps(d, indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Profile":
        ver = d.get("schema_version")
        if ver != SCHEMA_VERSION:
            raise ProfileError("profile.schema_version", ver,
                               f"this build reads schema version {SCHEMA_VERSION}",
                               "re-run `complexity calibrate` or `complexity calibrate fit`")
        try:
            return _profile_from_dict(d)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProfileError("profile", type(exc).__name__,
                               "a profile JSON written by `complexity calibrate`",
                               f"missing or malformed entry {exc}") from None

    @classmethod
    def read_json(cls, path: str | Path) -> "Profile":
        p = Path(path)
        if not p.is_file():
            raise ProfileError("profile", str(p), "an existing profile JSON file")
        try:
            data = read_json("profile", p, "profile JSON file")
        except InvalidInputError as exc:
            raise ProfileError(exc.field, exc.value, exc.valid, exc.detail) from None
        if not isinstance(data, dict):
            raise ProfileError("profile", str(p), "a JSON object at top level")
        if data.get("schema_version") == SCHEMA_VERSION:
            check_numbers(data)                 # physical ranges of a file from outside
        return cls.from_dict(data)


_DTYPE_ALTERNATIVES = {"fp8": ("bf16", "fp16"), "fp16": ("bf16",), "bf16": ("fp16",),
                       "tf32": ("fp32",), "fp32": ("tf32",)}


def _by_dtype(table: Mapping[str, Coefficient], dtype: str) -> Coefficient | None:
    """The entry for ``dtype``, else for the dtype that shares its tensor-core path."""
    for key in (dtype, *_DTYPE_ALTERNATIVES.get(dtype, ())):
        if key in table:
            return table[key]
    return None


def _coef(d: Mapping[str, Any]) -> Coefficient:
    return Coefficient(**d)


def _coef_map(d: Mapping[str, Any]) -> dict[str, Coefficient]:
    return {k: _coef(v) for k, v in d.items()}


def _profile_from_dict(d: Mapping[str, Any]) -> Profile:
    g = d["gemm"]
    gemm = GemmModel(eff_max=_coef_map(g["eff_max"]), k_half=_coef(g["k_half"]),
                     launch_us=_coef(g["launch_us"]), tile_m=int(g["tile_m"]),
                     tile_n=int(g["tile_n"]),
                     tiles=tuple((int(a), int(b)) for a, b in g.get("tiles", ())),
                     persistent=bool(g.get("persistent", False)),
                     sustained_eff=_coef_map(g.get("sustained_eff", {})),
                     k_half_dtype=_coef_map(g.get("k_half_dtype", {})),
                     grouped_eff=_coef_map(g.get("grouped_eff", {})),
                     mn_half=_coef(g["mn_half"]) if g.get("mn_half") else None)
    m = d["memory"]
    memory = MemoryModel(bw_eff=_coef(m["bw_eff"]), launch_us=_coef(m["launch_us"]),
                         kind_eff=_coef_map(m.get("kind_eff", {})))
    a = d["attention"]
    attention = AttentionModel(
        fwd_eff=_coef_map(a["fwd_eff"]), bwd_eff=_coef_map(a["bwd_eff"]),
        curves={k: AttentionCurve(emax=_coef_map(c["emax"]), s_half=_coef(c["s_half"]),
                                  causal_eff=_coef(c["causal_eff"]) if c.get("causal_eff")
                                  else None)
                for k, c in a.get("curves", {}).items()},
        causal_eff=_coef(a["causal_eff"]) if a.get("causal_eff") else None,
        causal_block_tokens=(_coef(a["causal_block_tokens"]) if a.get("causal_block_tokens")
                             else None))
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
                   network=_network_from_dict(d["network"]) if d.get("network") else None,
                   host=_host_from_dict(d["host"]) if d.get("host") else None)


def _network_from_dict(d: Mapping[str, Any]) -> NetworkModel:
    def one(v: Any) -> Any:
        if not v:
            return None
        if "value" in v:
            return _coef(v)
        return StepLatency(**{k: _coef(x) for k, x in v.items()})
    return NetworkModel(**{k: one(v) for k, v in d.items()})


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
