"""Transformer model specs (dense and MoE decoders)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from ..errors import InvalidInputError


class MLP(str, Enum):
    GELU = "gelu"        # 2 GEMMs, h -> ffn -> h
    SWIGLU = "swiglu"    # 3 GEMMs, gated
    RELU2 = "relu2"      # 2 GEMMs, squared ReLU


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts FFN replacing the dense FFN in all but the first ``dense_layers``."""

    experts: int
    top_k: int
    expert_ffn_hidden: int
    shared_experts: int = 0
    dense_layers: int = 0
    capacity_factor: float = 0.0       # > 0: experts padded to capacity (drop and pad); 0: dropless

    def __post_init__(self) -> None:
        if self.experts < 1:
            raise InvalidInputError("moe_experts", self.experts, "an integer >= 1")
        if not 1 <= self.top_k <= self.experts:
            raise InvalidInputError("moe_topk", self.top_k, f"1..moe_experts={self.experts}")
        if self.expert_ffn_hidden < 1:
            raise InvalidInputError("moe_ffn_hidden", self.expert_ffn_hidden, "an integer >= 1")
        if self.capacity_factor < 0:
            raise InvalidInputError("moe_capacity_factor", self.capacity_factor,
                                    "0 (dropless) or a positive factor")
        if self.shared_experts < 0 or self.dense_layers < 0:
            raise InvalidInputError("moe_shared_experts/moe_dense_layers",
                                    (self.shared_experts, self.dense_layers), "non-negative")


@dataclass(frozen=True)
class TransformerSpec:
    """A decoder-only transformer. ``ffn_hidden`` is the dense FFN width (per gate for SwiGLU).

    ``head_dim`` defaults to ``hidden // n_heads``. ``n_kv_heads < n_heads`` is GQA/MQA.
    """

    name: str
    n_layers: int
    hidden: int
    ffn_hidden: int
    n_heads: int
    n_kv_heads: int
    vocab: int
    seq_len: int
    mlp: MLP = MLP.GELU
    tied_embeddings: bool = False
    head_dim: int = 0
    moe: MoESpec | None = None
    source: str = ""

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden", "ffn_hidden", "n_heads", "n_kv_heads", "vocab", "seq_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise InvalidInputError(f, v, "a positive integer")
        if self.n_heads % self.n_kv_heads:
            raise InvalidInputError("n_kv_heads", self.n_kv_heads,
                                    f"a divisor of n_heads={self.n_heads}")
        if self.head_dim == 0:
            if self.hidden % self.n_heads:
                raise InvalidInputError("n_heads", self.n_heads,
                                        f"a divisor of hidden={self.hidden} (or give head_dim)")
            object.__setattr__(self, "head_dim", self.hidden // self.n_heads)
        if not isinstance(self.mlp, MLP):
            try:
                object.__setattr__(self, "mlp", MLP(self.mlp))
            except ValueError:
                raise InvalidInputError("mlp", self.mlp, "gelu, swiglu or relu2") from None
        if self.moe and self.moe.dense_layers > self.n_layers:
            raise InvalidInputError("moe_dense_layers", self.moe.dense_layers,
                                    f"at most n_layers={self.n_layers}")

    # ---- derived sizes ----------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def mlp_gemms(self) -> int:
        return 3 if self.mlp == MLP.SWIGLU else 2

    def attention_params(self) -> int:
        h = self.hidden
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h

    def dense_mlp_params(self, ffn: int | None = None) -> int:
        return self.mlp_gemms * self.hidden * (ffn or self.ffn_hidden)

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer >= self.moe.dense_layers

    def layer_params(self, layer: int) -> int:
        """Parameters of one layer (weights + norms), all experts counted."""
        norms = 2 * self.hidden
        if not self.is_moe_layer(layer):
            return self.attention_params() + self.dense_mlp_params() + norms
        m = self.moe
        experts = (m.experts + m.shared_experts) * self.dense_mlp_params(m.expert_ffn_hidden)
        router = self.hidden * m.experts
        return self.attention_params() + experts + router + norms

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def total_params(self) -> int:
        return sum(self.layer_params(i) for i in range(self.n_layers)) \
            + self.embedding_params() + self.hidden

    def active_params(self) -> int:
        """Parameters touched per token (MoE: top-k + shared experts only)."""
        if self.moe is None:
            return self.total_params()
        m = self.moe
        total = self.embedding_params() + self.hidden
        for i in range(self.n_layers):
            if self.is_moe_layer(i):
                active = (m.top_k + m.shared_experts) * self.dense_mlp_params(m.expert_ffn_hidden)
                total += self.attention_params() + active + self.hidden * m.experts + 2 * self.hidden
            else:
                total += self.layer_params(i)
        return total

    def with_seq_len(self, seq_len: int) -> "TransformerSpec":
        return replace(self, seq_len=seq_len)
