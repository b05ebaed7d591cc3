"""Transformer model specs (dense and MoE decoders, GQA/MLA attention, local layers)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from ..boundary import limits as L
from ..boundary import spellings
from ..boundary.values import check_int
from ..errors import InvalidInputError


class MLP(str, Enum):
    GELU = "gelu"        # 2 GEMMs, h -> ffn -> h
    SWIGLU = "swiglu"    # 3 GEMMs, gated (GeGLU has the same shapes)
    RELU2 = "relu2"      # 2 GEMMs, squared ReLU


class Norm(str, Enum):
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class Position(str, Enum):
    LEARNED = "learned"      # learned absolute position embedding (GPT-2/3)
    ROPE = "rope"            # rotary (Llama, Mistral, Qwen, DeepSeek, Gemma, Nemotron-4)
    ALIBI = "alibi"          # attention bias (BLOOM)


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts FFN. A layer is sparse when it is past the ``dense_layers``
    prefix, not in ``dense_set``, and ``layer % every == phase`` (DeepSeek's
    ``moe_layer_freq`` counts from layer 0: phase 0; Qwen's ``decoder_sparse_step`` and
    Llama 4's ``interleave_moe_layer_step`` make layer ``step-1, 2*step-1, ...`` sparse:
    phase ``every-1``).

    Router facts (no FLOPs here; launch configurations need them): ``router_score``
    ``softmax`` or ``sigmoid``; ``router_expert_bias``: auxiliary-loss-free balancing with
    a per-expert bias (DeepSeek-V3 ``noaux_tc``); ``router_topk_scale``: scale of the
    routed output (``routed_scaling_factor``); ``router_groups`` / ``router_group_topk``:
    group-limited routing; ``aux_loss_coeff``: load-balancing loss weight."""

    experts: int
    top_k: int
    expert_ffn_hidden: int
    shared_experts: int = 0
    dense_layers: int = 0
    every: int = 1
    phase: int = 0
    dense_set: tuple[int, ...] = ()
    router_score: str = "softmax"
    router_expert_bias: bool = False
    router_topk_scale: float = 1.0
    router_groups: int = 0
    router_group_topk: int = 0
    aux_loss_coeff: float = 0.0
    capacity_factor: float = 0.0       # > 0: experts padded to capacity (drop and pad); 0: dropless

    def __post_init__(self) -> None:
        check_int("moe_experts", self.experts, 1, L.MAX_EXPERTS)
        check_int("moe_topk", self.top_k, 1, self.experts)
        check_int("moe_ffn_hidden", self.expert_ffn_hidden, 1, L.MAX_FFN)
        check_int("moe_shared_experts", self.shared_experts, 0, L.MAX_EXPERTS)
        check_int("moe_dense_layers", self.dense_layers, 0, L.MAX_LAYERS)
        if self.capacity_factor < 0:
            raise InvalidInputError("moe_capacity_factor", self.capacity_factor,
                                    "0 (dropless) or a positive factor")
        if self.shared_experts < 0 or self.dense_layers < 0:
            raise InvalidInputError("moe_shared_experts/moe_dense_layers",
                                    (self.shared_experts, self.dense_layers), "non-negative")
        if self.router_score not in ("softmax", "sigmoid"):
            raise InvalidInputError("moe_router_score", self.router_score, "softmax or sigmoid")
        if self.every < 1 or not 0 <= self.phase < self.every:
            raise InvalidInputError("moe_every/moe_phase", (self.every, self.phase),
                                    "every >= 1 and 0 <= phase < every")

    def is_sparse(self, layer: int) -> bool:
        return (layer >= self.dense_layers and layer % self.every == self.phase
                and layer not in self.dense_set)


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek multi-head latent attention (DeepSeek-V2 report, arXiv:2405.04434, Sec.
    2.1): queries through an optional low-rank ``q_lora_rank`` bottleneck, keys and values
    through a shared ``kv_lora_rank`` latent plus one decoupled RoPE key of
    ``qk_rope_head_dim`` shared by all heads. Field names are the HuggingFace config's."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0            # 0: queries projected directly (DeepSeek-V2-Lite)

    def __post_init__(self) -> None:
        for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidInputError(f, v, "a positive integer")
        if isinstance(self.q_lora_rank, bool) or not isinstance(self.q_lora_rank, int) \
                or self.q_lora_rank < 0:
            raise InvalidInputError("q_lora_rank", self.q_lora_rank, "an integer >= 0")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def params(self, hidden: int, heads: int) -> int:
        """Projection weights and the two latent RMSNorms of one layer:
        q_a (h x q_lora) + q_a_norm + q_b (q_lora x heads*(nope+rope)) [or q (h x heads*qk)],
        kv_a (h x (kv_lora+rope)) + kv_a_norm + kv_b (kv_lora x heads*(nope+v)),
        o (heads*v x h) -- the shapes of HF ``DeepseekV3Attention``."""
        qk, r = self.qk_head_dim, self.q_lora_rank
        q = hidden * r + r + r * heads * qk if r else hidden * heads * qk
        kv = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank \
            + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + heads * self.v_head_dim * hidden


_SIZE_LIMITS = (("n_layers", L.MAX_LAYERS), ("hidden", L.MAX_HIDDEN), ("ffn_hidden", L.MAX_FFN),
                ("n_heads", L.MAX_HEADS), ("n_kv_heads", L.MAX_HEADS), ("vocab", L.MAX_VOCAB),
                ("seq_len", L.MAX_SEQ_LEN))
_ENUMS = (("mlp", MLP, "gelu, swiglu or relu2", spellings.MLP),
          ("norm", Norm, "layernorm or rmsnorm", {}),
          ("position", Position, "learned, rope or alibi", {}))
# MLP activations whose eager code the op graph prices apart (frameworks.json
# eager_elementwise rows of the same name); "" is a fused kernel
ACT_FNS = ("", "gelu_new", "bloom_gelu")


@dataclass(frozen=True)
class TransformerSpec:
    """A decoder-only transformer. ``ffn_hidden`` is the dense FFN width (per gate for SwiGLU).

    ``head_dim`` defaults to ``hidden // n_heads``. ``n_kv_heads < n_heads`` is GQA/MQA;
    ``mla`` replaces the Q/K/V projections by DeepSeek's latent ones (``head_dim`` is then
    the value head width). ``window`` > 0 makes layers local (sliding-window attention
    over the last ``window`` positions) except every ``global_every``-th one (layer ``i``
    is global when ``(i + 1) % global_every == 0``; 0: no global layers).
    ``mtp_layers`` > 0 adds DeepSeek-V3's multi-token-prediction modules after the last
    layer (Megatron-Core ``--mtp-num-layers``): each normalises the hidden state and the
    next token's embedding, projects their concatenation 2h -> h, runs one more decoder
    layer and a second pass of the shared output layer and loss, on the last stage.
    ``extra_norm_params`` counts per-layer norm weights beyond the two hidden-size norms
    (Gemma's sandwich norms, Qwen3's QK-norm). ``norm``, ``position``, the biases and
    the soft caps change no FLOPs here; launch arguments and ``describe`` need them.
    ``split_qkv`` / ``split_gate_up`` say whether the model's own (transformers) code holds
    q, k and v / a gated MLP's gate and up as separate Linear modules (``None``: not known);
    they change no FLOPs either, only the per-tensor host costs of frameworks that run that
    code (``cost.host.ParamLayout``).
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
    mla: MLASpec | None = None
    window: int = 0
    global_every: int = 1
    norm: Norm = Norm.LAYERNORM
    position: Position = Position.LEARNED
    linear_bias: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False                 # norms on queries/keys (Qwen3, Gemma 3; MLA latents)
    extra_norm_params: int = 0
    attn_logit_softcap: float = 0.0
    final_logit_softcap: float = 0.0
    mtp_layers: int = 0                   # multi-token-prediction modules (DeepSeek-V3: 1)
    # the model's own (transformers) code: one Linear each for q, k and v / for a SwiGLU's
    # gate and up, where the op graph fuses them; None: not known (cost.host.ParamLayout)
    split_qkv: bool | None = None
    split_gate_up: bool | None = None
    # a norm follows the MLP inside the layer (Gemma 2/3's post_feedforward_layernorm, in
    # the op graph with sandwich_norms; OLMo 2's post-norms, which ln1 / ln2 stand for): it
    # saves the MLP's output, so torch's checkpoint early stop re-runs the down projection
    # (engine.recompute.early_stopped)
    post_mlp_norm: bool = False
    # Gemma 2/3's sandwich norms: a norm after each sublayer as well as before it
    # (post_attention_layernorm on the attention output, post_feedforward_layernorm on the
    # MLP output, each before its residual add): two more hidden-size norms per layer in
    # the op graph. OLMo 2's post-norms replace its pre-norms (same count, same bytes): not
    # this flag.
    sandwich_norms: bool = False
    # the MLP activation as the model's own (transformers) code names it, where eager code
    # runs it differently from one fused kernel: "gelu_new" (GPT-2's tanh approximation
    # written out), "bloom_gelu" (BLOOM's autograd Function of the same); "" otherwise.
    # Priced only for frameworks running that code eagerly.
    act_fn: str = ""
    # probability of the hidden-state dropout after the attention and MLP output
    # projections in the model's own code (GPT-2's resid_pdrop); Megatron's fused dropout
    # is a framework convention (FrameworkMemory.dropout), not this
    hidden_dropout: float = 0.0

    def __post_init__(self) -> None:
        for f, hi in _SIZE_LIMITS:
            check_int(f, getattr(self, f), 1, hi)
        if self.head_dim:
            check_int("head_dim", self.head_dim, 0, L.MAX_HIDDEN)
        if self.n_heads % self.n_kv_heads:
            raise InvalidInputError("n_kv_heads", self.n_kv_heads,
                                    f"a divisor of n_heads={self.n_heads}")
        if self.head_dim == 0:
            if self.hidden % self.n_heads:
                raise InvalidInputError("n_heads", self.n_heads,
                                        f"a divisor of hidden={self.hidden} (or give head_dim)")
            object.__setattr__(self, "head_dim", self.hidden // self.n_heads)
        for f, enum, valid, other in _ENUMS:
            v = getattr(self, f)
            if not isinstance(v, enum):
                try:
                    object.__setattr__(self, f, enum(spellings.canonical(v, other)))
                except ValueError:
                    raise InvalidInputError(f, v, valid) from None
        for f in ("post_mlp_norm", "sandwich_norms"):
            if not isinstance(getattr(self, f), bool):
                raise InvalidInputError(f, getattr(self, f), "true or false")
        for f in ("split_qkv", "split_gate_up"):
            if getattr(self, f) not in (None, True, False):
                raise InvalidInputError(f, getattr(self, f), "true, false or null")
        if self.act_fn not in ACT_FNS:
            raise InvalidInputError("act_fn", self.act_fn, " or ".join(map(repr, ACT_FNS)))
        d = self.hidden_dropout
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 <= d < 1.0:
            raise InvalidInputError("hidden_dropout", d, "a probability in [0, 1)")
        for f in ("window", "global_every", "extra_norm_params", "mtp_layers"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidInputError(f, v, "an integer >= 0")
        if self.moe and self.moe.dense_layers > self.n_layers:
            raise InvalidInputError("moe_dense_layers", self.moe.dense_layers,
                                    f"at most n_layers={self.n_layers}")

    @property
    def code_style(self) -> str:
        """Whose module structure the model's own (transformers) code follows, for host costs
        measured on one model's modules: "gpt2" for LayerNorm with learned positions (GPT-2,
        GPT-BigCode, OPT; GPT-3-shaped presets), else "llama" (assumed for every other
        family: RMSNorm and rotary or ALiBi models)."""
        learned = self.norm == Norm.LAYERNORM and self.position == Position.LEARNED
        return "gpt2" if learned else "llama"

    # ---- derived sizes ----------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of the attention output (heads x value head width)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def mlp_gemms(self) -> int:
        return 3 if self.mlp == MLP.SWIGLU else 2

    def attention_params(self) -> int:
        h = self.hidden
        if self.mla is not None:
            return self.mla.params(h, self.n_heads)
        return h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h

    def dense_mlp_params(self, ffn: int | None = None) -> int:
        return self.mlp_gemms * self.hidden * (ffn or self.ffn_hidden)

    # ---- layer kinds ------------------------------------------------------------------
    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and self.moe.is_sparse(layer)

    def is_local_layer(self, layer: int) -> bool:
        """Sliding-window (local) attention in this layer."""
        if self.window <= 0 or self.window >= self.seq_len:
            return False
        return self.global_every == 0 or (layer + 1) % self.global_every != 0

    def window_of(self, layer: int) -> int:
        """Keys a query attends to in this layer (0: all earlier positions)."""
        return self.window if self.is_local_layer(layer) else 0

    def layer_kind(self, layer: int) -> tuple[bool, bool]:
        """(MoE, local): layers of one kind have the same ops."""
        return self.is_moe_layer(layer), self.is_local_layer(layer)

    def first_layer(self, moe: bool) -> int:
        """Index of the first MoE (or dense) layer; 0 when there is none of that kind."""
        return next((i for i in range(self.n_layers) if self.is_moe_layer(i) == moe), 0)

    def n_moe_layers(self) -> int:
        return sum(map(self.is_moe_layer, range(self.n_layers)))

    # ---- parameter counts -------------------------------------------------------------
    def layer_params(self, layer: int) -> int:
        """Parameters of one layer (weights + norms), all experts counted."""
        norms = 2 * self.hidden + self.extra_norm_params
        if not self.is_moe_layer(layer):
            return self.attention_params() + self.dense_mlp_params() + norms
        m = self.moe
        experts = (m.experts + m.shared_experts) * self.dense_mlp_params(m.expert_ffn_hidden)
        router = self.hidden * m.experts
        return self.attention_params() + experts + router + norms

    def mtp_params(self) -> int:
        """Parameters of the multi-token-prediction modules, beyond the shared embedding and
        output layer: per module one decoder layer (the last layer's kind), two norms and
        the 2h -> h projection. Not in ``total_params`` (DeepSeek-V3's 671B excludes its
        MTP module); memory and work count them."""
        per = self.layer_params(self.n_layers - 1) + 2 * self.hidden + 2 * self.hidden ** 2
        return self.mtp_layers * per

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
        idle = (m.experts - m.top_k) * self.dense_mlp_params(m.expert_ffn_hidden)
        return self.total_params() - idle * self.n_moe_layers()

    def with_seq_len(self, seq_len: int) -> "TransformerSpec":
        return replace(self, seq_len=seq_len)
