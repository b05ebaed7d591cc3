"""The short-window question: on this cluster, for this many minutes, which model size,
batch and strategy train best?

For each model on a size ladder, the window left after the (assumed) startup and
checkpoint overheads is filled with whole steps of that model's best plan
(``capacity.window_plan``, over a ladder of global batches); the tokens it trains give a
predicted loss under a stated scaling law. The answer is the lowest predicted loss (or,
with ``objective="tokens"``, the most tokens -- which always favours the smallest model).

Scaling laws (``L(N, D) = E + A / N**alpha + B / D**beta``, N = all parameters including
embeddings, D = training tokens, loss in nats/token on the authors' data):

* ``chinchilla``: Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models"
  (arXiv:2203.15556), Sec. 3.3 / Eq. 10, Approach 3: E 1.69, A 406.4, B 410.7, alpha 0.34,
  beta 0.28.
* ``besiroglu``: Besiroglu et al. 2024, "Chinchilla Scaling: A replication attempt"
  (arXiv:2404.10102), their refit of the same data: E 1.8172, A 482.01, B 2085.43,
  alpha 0.3478, beta 0.3658.

Neither law has a batch-size term: batches beyond the critical batch size (McCandlish et
al. 2018) buy fewer loss improvements per token than the law assumes, so the default
batch ladder stops at 512 sequences (1M tokens at seq 2048). The losses rank choices;
they are not a forecast for another data set or tokenizer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

from .. import progress
from ..errors import ComplexityError, InvalidInputError
from ..search.driver import SearchOptions
from ..workload.spec import MLP, Norm, Position, TransformerSpec
from .capacity import HardwareCatalog, HardwareChoice, WindowAnswer, window_plan


@dataclass(frozen=True)
class ScalingLaw:
    name: str
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str

    def loss(self, n_params: float, tokens: float) -> float:
        if n_params <= 0 or tokens <= 0:
            return math.inf
        return self.E + self.A / n_params ** self.alpha + self.B / tokens ** self.beta


SCALING_LAWS = {
    "chinchilla": ScalingLaw("chinchilla", 1.69, 406.4, 410.7, 0.34, 0.28,
                             "Hoffmann et al. 2022 (arXiv:2203.15556) Eq. 10, Approach 3"),
    "besiroglu": ScalingLaw("besiroglu", 1.8172, 482.01, 2085.43, 0.3478, 0.3658,
                            "Besiroglu et al. 2024 (arXiv:2404.10102), refit of Approach 3"),
}


@dataclass(frozen=True)
class WindowOverheads:
    """Wall-clock the window loses to things other than training steps. Every default is
    an assumption, reported with the answer:

    * ``startup_s`` 120 s: launching the processes, NCCL communicator set-up, building
      the model and the data loader's first batches (a minute or two on a few nodes is
      common; kernel autotuning or ``torch.compile`` can add minutes more);
    * one checkpoint at the end of ``checkpoint_bytes_per_param`` 14 B (bf16 weights 2 +
      fp32 master 4 + Adam moments 8, a Megatron-style full checkpoint) written at
      ``checkpoint_write_gbytes_per_s`` 10 GB/s aggregate (a shared parallel file system;
      local NVMe is faster, object storage slower)."""

    startup_s: float = 120.0
    checkpoints: int = 1
    checkpoint_bytes_per_param: float = 14.0
    checkpoint_write_gbytes_per_s: float = 10.0

    def checkpoint_s(self, n_params: float) -> float:
        return self.checkpoints * n_params * self.checkpoint_bytes_per_param / (
            self.checkpoint_write_gbytes_per_s * 1e9)

    def to_dict(self) -> dict[str, Any]:
        return {"startup_s": self.startup_s, "checkpoints": self.checkpoints,
                "checkpoint_bytes_per_param": self.checkpoint_bytes_per_param,
                "checkpoint_write_gbytes_per_s": self.checkpoint_write_gbytes_per_s,
                "assumed": True}


# (layers, d_model, head_dim): the GPT-3 paper's Table 2.1 depths and widths from 125M to
# 13B, built as Llama-style decoders (RMSNorm, RoPE, SwiGLU at 8/3 d rounded to 256,
# untied 32000-token vocabulary). An assumed family: the question is "which size", so
# every size shares one recipe.
_LADDER = ((12, 768, 64), (24, 1024, 64), (24, 1536, 64), (24, 2048, 128),
           (32, 2560, 128), (32, 4096, 128), (40, 5120, 128))


def size_ladder(seq_len: int = 2048, vocab: int = 32000) -> list[TransformerSpec]:
    out = []
    for layers, d, hd in _LADDER:
        ffn = int(round(8 * d / 3 / 256)) * 256
        spec = TransformerSpec(f"ladder-{layers}l-{d}", n_layers=layers, hidden=d, ffn_hidden=ffn,
                               n_heads=d // hd, n_kv_heads=d // hd, vocab=vocab, seq_len=seq_len,
                               mlp=MLP.SWIGLU, norm=Norm.RMSNORM, position=Position.ROPE,
                               linear_bias=False,
                               source="size ladder: GPT-3 Table 2.1 depth/width, Llama-style blocks")
        out.append(replace(spec, name=f"ladder-{spec.total_params() / 1e9:.2g}b"))
    return out


@dataclass(frozen=True)
class SizeRow:
    model: TransformerSpec
    answer: WindowAnswer | None            # None: no plan fits, or no time left
    train_s: float
    checkpoint_s: float
    loss: float
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        a = self.answer
        return {"model": self.model.name, "params": self.model.total_params(),
                "train_s": self.train_s, "checkpoint_s": self.checkpoint_s,
                "tokens": a.tokens if a else 0, "steps": a.steps if a else 0,
                "tokens_per_param": (a.tokens / self.model.total_params()) if a else 0.0,
                "predicted_loss": None if math.isinf(self.loss) else self.loss,
                "plan": a.best.to_dict() if a and a.best else None, "note": self.note}


@dataclass(frozen=True)
class WindowSweep:
    window_s: float
    choice: HardwareChoice
    law: ScalingLaw
    objective: str
    overheads: WindowOverheads
    rows: tuple[SizeRow, ...]

    @property
    def best(self) -> SizeRow | None:
        ok = [r for r in self.rows if r.answer is not None and r.answer.tokens > 0]
        if not ok:
            return None
        if self.objective == "tokens":
            return max(ok, key=lambda r: (r.answer.tokens, -r.model.total_params()))
        return min(ok, key=lambda r: (r.loss, r.model.total_params()))

    def to_dict(self) -> dict[str, Any]:
        b = self.best
        return {"window_min": self.window_s / 60.0, "hardware": self.choice.label,
                "objective": self.objective, "scaling_law": {**self.law.__dict__},
                "overheads": self.overheads.to_dict(),
                "best": b.to_dict() if b else None, "rows": [r.to_dict() for r in self.rows]}


def sweep_sizes(models: Sequence[TransformerSpec], window_s: float, choice: HardwareChoice,
                batches: Sequence[int], catalog: HardwareCatalog, options: SearchOptions,
                law: ScalingLaw = SCALING_LAWS["chinchilla"],
                overheads: WindowOverheads = WindowOverheads(),
                objective: str = "loss") -> WindowSweep:
    """Every model on ``choice`` for ``window_s`` minus the overheads."""
    if objective not in ("loss", "tokens"):
        raise InvalidInputError("objective", objective, "loss or tokens")
    if not models:
        raise InvalidInputError("models", [], "one or more models")
    rows = []
    for m in progress.track(models, "plan: model sizes", describe=lambda x: x.name):
        n = m.total_params()
        ck = overheads.checkpoint_s(n)
        train = window_s - overheads.startup_s - ck
        if train <= 0:
            rows.append(SizeRow(m, None, train, ck, math.inf, "no time left after overheads"))
            continue
        try:
            ans = window_plan(m, train, choice, batches, catalog, options)
        except ComplexityError as exc:
            rows.append(SizeRow(m, None, train, ck, math.inf, f"no plan: {exc}"))
            continue
        rows.append(SizeRow(m, ans, train, ck, law.loss(n, ans.tokens)))
    return WindowSweep(window_s, choice, law, objective, overheads, tuple(rows))
