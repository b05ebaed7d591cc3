"""Names to things through ``hardware_db``: GPU keys, clusters and reference profiles.

The entry-point layer (``simulator.api`` and ``simulator.cli``) is the only part of the
simulator that loads ``hardware_db``; everything below takes specs and profiles as
arguments.
"""
from __future__ import annotations

from ..errors import InvalidInputError
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec, GPUSpec
from ..planning.capacity import HardwareChoice


def make_cluster(gpu: str, n_gpus: int, gpus_per_node: int | None = None,
                 nics_per_node: int | None = None, nic_gbps: float | None = None,
                 nic_kind: str | None = None, scale_up: str | None = None,
                 node: str | None = None, oversubscription: float = 1.0,
                 **fabric) -> ClusterSpec:
    """``fabric``: ``rail_optimized``, ``core_oversubscription``, ``planes``, ``sharp``
    (see ``hardware_db.build_cluster``)."""
    import hardware_db
    return hardware_db.build_cluster(gpu, n_gpus, gpus_per_node=gpus_per_node,
                                     nics_per_node=nics_per_node, nic_gbits_per_s=nic_gbps,
                                     nic_kind=nic_kind, scale_up=scale_up, node=node,
                                     oversubscription=oversubscription, **fabric)


def load_profile_for(gpu_key: str, path: str | None, allow_mismatch: bool = False) -> Profile:
    """The profile JSON at ``path`` (which must be measured on ``gpu_key`` unless
    ``allow_mismatch``), else the shipped reference profile of ``gpu_key``."""
    if path:
        prof = Profile.read_json(path)
        if prof.device_key != gpu_key and not allow_mismatch:
            raise InvalidInputError("--profile", str(path), f"a profile measured on {gpu_key}",
                                    f"this one is for {prof.device_key}; pass "
                                    "--allow-profile-mismatch to use it anyway")
        return prof
    import hardware_db
    return hardware_db.load_profile(gpu_key)


def cluster_from_row(row) -> ClusterSpec:
    """Cluster of a published-runs row. The schema has no NIC-kind column, so NICs are
    InfiniBand-class (RoCE/Omni-Path rows use the same transferred coefficients)."""
    def num(k):
        v = (row.get(k) or "").strip()
        return int(float(v)) if v else None
    return make_cluster(row["gpu"].strip(), num("n_gpus"), num("gpus_per_node"),
                        num("nics_per_node"), num("nic_gbps"), None,
                        (row.get("scale_up") or "").strip() or None)




DEFAULT_GPU = "h100-sxm"


def resolve_device(gpu_key: str | None, prof: Profile | str | None = None,
                   allow_mismatch: bool = False) -> tuple[GPUSpec, Profile]:
    """Device + profile: a profile JSON that carries its device (a measured CPU) wins;
    otherwise the GPU key (default h100-sxm) and its shipped reference profile. A profile
    of another device than ``gpu_key`` is refused unless ``allow_mismatch``."""
    import hardware_db
    path = prof if isinstance(prof, str) else None
    if isinstance(prof, str):
        prof = Profile.read_json(prof)
    elif prof is not None:
        prof.validate()              # built in memory: the checks a JSON profile gets
    if prof is not None and prof.device is not None and not gpu_key:
        return prof.device, prof
    gpu = hardware_db.load_gpu(gpu_key or (prof.device_key if prof else DEFAULT_GPU))
    if prof is not None and prof.device_key != gpu.key and not allow_mismatch:
        raise InvalidInputError("--profile", path or prof.name,
                                f"a profile measured on {gpu.key}",
                                f"this one is for {prof.device_key}; pass "
                                "--allow-profile-mismatch to use it anyway")
    return gpu, prof if prof is not None else hardware_db.load_profile(gpu.key)



class HardwareDbCatalog:
    """Clusters and reference profiles from hardware_db (cached per choice / GPU)."""

    def __init__(self, profile_path: str | None = None, gpus_per_node: int | None = None,
                 nics_per_node: int | None = None, nic_gbps: float | None = None,
                 allow_mismatch: bool = False) -> None:
        self.profile_path = profile_path
        self.allow_mismatch = allow_mismatch
        self.defaults = (gpus_per_node, nics_per_node, nic_gbps)
        self._clusters: dict[HardwareChoice, ClusterSpec] = {}
        self._profiles: dict[str, Profile] = {}

    def cluster(self, choice: HardwareChoice) -> ClusterSpec:
        if choice not in self._clusters:
            gpn, nics, gbps = self.defaults
            self._clusters[choice] = make_cluster(
                choice.gpu, choice.n_gpus, choice.gpus_per_node or gpn,
                choice.nics_per_node or nics, choice.nic_gbps or gbps, node=choice.node,
                oversubscription=choice.oversubscription, rail_optimized=choice.rail_optimized)
        return self._clusters[choice]

    def profile(self, gpu_key: str) -> Profile:
        if gpu_key not in self._profiles:
            self._profiles[gpu_key] = load_profile_for(gpu_key, self.profile_path,
                                                       self.allow_mismatch)
        return self._profiles[gpu_key]

    def gpus_per_node(self, gpu: str) -> int:
        return self.cluster(HardwareChoice(gpu, 1)).node.gpus_per_node
