"""Parquet store of evaluated search candidates, so a large sweep can stop and resume.

A store is a directory (a Parquet dataset): ``part-NNNNNN.parquet`` files of flat records,
one row per evaluated (inputs, plan, engine), plus ``inputs.json`` mapping each inputs
fingerprint to the model, cluster and profile it stands for. A candidate's ``key`` is a
SHA-256 of its inputs fingerprint, plan and engine, so the same candidate always gets the
same key and a resumed sweep skips what is already on disk.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import InvalidInputError
from ..hardware.profile import Profile
from ..hardware.specs import ClusterSpec
from ..parallel.plan import Plan
from ..workload.spec import TransformerSpec


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def cluster_inputs(cluster: ClusterSpec) -> dict[str, Any]:
    """The cluster's defining facts, fabric included (an optional topology graph is derived
    from them)."""
    skip = ("gpu", "node", "graph")
    return {"gpu": asdict(cluster.gpu), "node": asdict(cluster.node),
            **{f.name: getattr(cluster, f.name) for f in fields(cluster) if f.name not in skip}}


def inputs_record(model: TransformerSpec, cluster: ClusterSpec, profile: Profile) -> dict[str, Any]:
    return {"model": asdict(model), "cluster": cluster_inputs(cluster),
            "profile": profile.to_dict()}


def inputs_fingerprint(model: TransformerSpec, cluster: ClusterSpec, profile: Profile) -> str:
    return _sha(_canonical(inputs_record(model, cluster, profile)))


_PLAN_FIELDS = tuple(f.name for f in fields(Plan))


def plan_dict(plan: Plan) -> dict[str, Any]:
    """Plan fields with enums as their values, flat: the memory conventions become
    ``memory_<field>`` columns."""
    out = {}
    for name in _PLAN_FIELDS:
        v = getattr(plan, name)
        if name == "memory":
            for f in fields(v):
                x = getattr(v, f.name)
                out[f"memory_{f.name}"] = getattr(x, "value", x)
            continue
        out[name] = getattr(v, "value", v)
    return out


def candidate_key(fingerprint: str, plan: Plan, engine: str) -> str:
    return _sha(_canonical({"inputs": fingerprint, "plan": plan_dict(plan), "engine": engine}))[:32]


class ResultStore:
    """Append-only Parquet dataset of candidate records, keyed by ``key``."""

    def __init__(self, directory: str | Path, flush_every: int = 1000) -> None:
        self.dir = Path(directory)
        if self.dir.exists() and not self.dir.is_dir():
            raise InvalidInputError("results", str(self.dir), "a directory (Parquet dataset)")
        self.flush_every = flush_every
        self._buffer: list[dict[str, Any]] = []
        self._known: dict[str, dict[str, Any]] = {}
        self._inputs: dict[str, Any] = {}
        self._loaded = False

    # ---- reading ----------------------------------------------------------------------
    def load(self) -> dict[str, dict[str, Any]]:
        """Every record on disk, by key (later parts win)."""
        if self._loaded:
            return self._known
        import pyarrow.parquet as pq
        for part in sorted(self.dir.glob("part-*.parquet")) if self.dir.is_dir() else []:
            for rec in pq.read_table(part).to_pylist():
                self._known[rec["key"]] = rec
        inputs = self.dir / "inputs.json"
        if inputs.is_file():
            self._inputs = json.loads(inputs.read_text())
        self._loaded = True
        return self._known

    def get(self, key: str) -> dict[str, Any] | None:
        return self.load().get(key)

    # ---- writing ----------------------------------------------------------------------
    def register_inputs(self, fingerprint: str, record: Mapping[str, Any]) -> None:
        self.load()
        if fingerprint not in self._inputs:
            self._inputs[fingerprint] = record
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "inputs.json").write_text(_canonical(self._inputs))

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        for r in records:
            self._known[r["key"]] = dict(r)
            self._buffer.append(dict(r))
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq
        self.dir.mkdir(parents=True, exist_ok=True)
        n = len(list(self.dir.glob("part-*.parquet")))
        path = self.dir / f"part-{n:06d}.parquet"
        tmp = path.with_suffix(".tmp")
        pq.write_table(pa.Table.from_pylist(self._buffer), tmp)
        tmp.replace(path)                 # a part is either whole or absent
        self._buffer = []
