"""Host cost of Megatron-Core's layers, measured on this CPU (``calibrate.bench_framework``).

**MoE layer** (``moe_cases``): the real ``megatron.core.transformer.moe.moe_layer.MoELayer``
(all-to-all token dispatcher, dropless, aux-loss top-k router, ``SequentialMLP`` experts of
the local spec) at tiny shapes (hidden 32, 16 tokens), where kernels are nearly free and
what is left is host work, with 2 and 8 local experts (expert parallelism 1 on a fake
2-rank process group: the dispatcher's permutation, its device-to-host copy of the
tokens-per-expert counts and its sync still run; the all-to-all itself is an op the op
graph already prices). Rows: ``router`` (the router module's forward: gating GEMM,
softmax/top-k, aux loss; before the dispatcher's sync), ``layer`` (the whole MoE layer,
forward and backward), each at 2 and 8 local experts, and ``harness`` (the backward call
around a leaf tensor: loss sum, autograd engine start, input gradient), which is
subtracted; ``calibrate.bench_framework`` derives the per-layer constant and the
per-local-expert slope of ``SequentialMLP``.

**Dense layer** (``dense_cases``): ``TransformerBlock`` of 1 and 5 ``TransformerLayer`` s of
the local spec (``get_gpt_layer_local_spec``: Megatron's own ColumnParallel/RowParallel
linears, unfused ``DotProductAttention``; no bias, no dropout), per layer from the
difference; its ``ColumnParallelLinear`` / ``RowParallelLinear`` against an eager
``torch.nn.Linear``; its core attention module against the harness. The layer's Python
glue (module dispatch, tensor-parallel mappings, reshapes, residual functions) is what is
left after the op graph's own ops, the parallel linears' extra over ``nn.Linear`` (Transformer
Engine replaces those: ``te_modules``) and the unfused attention's extra (Transformer Engine
runs fused attention).

**Model** (``model_cases``): a whole ``GPTModel`` (the same local-spec layers, rotary
positions, its embedding, output layer and vocab-parallel cross-entropy) of 1 and 5 layers,
one micro-batch to the loss and back: what the 1-layer model costs beyond its layer and the
op graph's embedding, head and loss ops is the model's own Python per pass.

Megatron-Core is not a dependency of this project: ``pip install megatron-core`` (0.16.1 was
measured) to run it; without it the cases are skipped with a message. Its CUDA-only calls
are replaced by CPU stand-ins (streams and events that do nothing; ``torch.cuda.
current_device`` -> "cpu"; the model-parallel RNG tracker's ``fork`` does nothing), and the
Transformer Engine names its ``moe_utils`` imports only when TE is installed are set to
``None`` (its own fallback path), so the measured code is the framework's Python path
without TE fusions (``--moe-permute-fusion`` / ``--moe-router-fusion`` off, the defaults).
Eager ops = microseconds / the same run's host time per op-graph op forward.
"""
from __future__ import annotations

import contextlib

EXPERTS = (2, 8)
HIDDEN, FFN, TOKENS, TOPK = 32, 64, 16, 2


class _NoStream:
    """Stand-in for ``torch.cuda.Stream`` / ``Event`` on a CPU: every call is a no-op."""

    def __init__(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def wait_stream(self, *a):
        pass

    def record_event(self, *a):
        return _NoStream()


def _cpu_shims() -> None:
    import torch
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
    get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.Stream = _NoStream
    torch.cuda.current_stream = lambda *a, **k: _NoStream()
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.current_device = lambda: "cpu"
    import megatron.core.transformer.moe.moe_utils as mu
    for name in ("fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss", "fused_permute",
                 "fused_permute_with_probs", "fused_sort_chunks_by_index",
                 "fused_sort_chunks_by_index_with_probs", "fused_topk_with_score_function",
                 "fused_unpermute", "te_general_gemm"):
        if not hasattr(mu, name):
            setattr(mu, name, None)


def recompiled(module, name: str, old: str, new: str):
    """``module.name`` (a function) recompiled from its own source with the literal ``old``
    reading ``new``, in its module's namespace (Megatron's CUDA type-name assertions)."""
    import inspect
    src = inspect.getsource(getattr(module, name))
    assert old in src
    code = compile(src.replace(old, new), module.__file__, "exec")
    exec(code, module.__dict__)     # noqa: S102 - Megatron's own source, one literal changed
    return getattr(module, name)


@contextlib.contextmanager
def one_thread_no_warnings():
    """torch on one thread, and Megatron-Core's fallback warnings (no TE, no apex) silenced,
    for a timed run (``bench_mcore_ddp``'s and ``bench_mcore_loop``'s)."""
    import warnings

    import torch
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def available() -> str:
    """'' when Megatron-Core imports, else why not."""
    try:
        import megatron.core  # noqa: F401
    except ImportError as exc:               # not installed, or a dependency missing
        return f"megatron-core not importable ({type(exc).__name__}: {exc})"
    return ""


def _init_parallel() -> None:
    from megatron.core import parallel_state as ps
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(expert_model_parallel_size=1, create_gloo_process_groups=False)


def _layer(experts: int):
    import torch
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig
    _init_parallel()
    cfg = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, num_moe_experts=experts,
        moe_router_topk=TOPK, moe_ffn_hidden_size=FFN, moe_token_dispatcher_type="alltoall",
        moe_aux_loss_coeff=1e-2, moe_router_load_balancing_type="aux_loss",
        use_cpu_initialization=True, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False,
        params_dtype=torch.float32, moe_grouped_gemm=False)
    spec = get_moe_module_spec(use_te=False, num_experts=experts, moe_grouped_gemm=False)
    return MoELayer(cfg, submodules=spec.submodules)


def moe_cases() -> dict:
    """Timing cases for ``bench_host.time_interleaved``: (``router`` | ``layer``, experts)
    -> (forward, backward-of-forward's-output)."""
    import torch
    _cpu_shims()
    out = {}
    for e in EXPERTS:
        layer = _layer(e)
        x = torch.randn(TOKENS, 1, HIDDEN, requires_grad=True)

        def fwd(layer=layer, x=x):
            return layer(x)[0]

        def bwd(y, layer=layer, x=x):
            y.float().sum().backward()
            for p in layer.parameters():
                p.grad = None
            x.grad = None

        def router(layer=layer, x=x):
            return layer.router(x)             # with autograd, as in the layer's forward
        out[("layer", e)] = (fwd, bwd)
        out[("router", e)] = (router, lambda _y: None)
    x = torch.randn(TOKENS, 1, HIDDEN, requires_grad=True)

    def harness_bwd(y, x=x):                 # what the layer's backward case adds around it
        y.float().sum().backward()
        x.grad = None
    out[("harness", 0)] = ((lambda x=x: x), harness_bwd)
    return out


DENSE_LAYERS = (1, 5)


def _dense_config(layers: int):
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig(num_layers=layers, hidden_size=HIDDEN, num_attention_heads=4,
                             use_cpu_initialization=True, add_bias_linear=False,
                             params_dtype=torch.float32, hidden_dropout=0.0,
                             attention_dropout=0.0)


def _fwd_bwd(module, *inputs, **kw):
    """(forward, backward of its output) of ``module`` on ``inputs`` (first output if a
    tuple); backward clears every gradient it made."""
    def fwd():
        y = module(*inputs, **kw)
        return y[0] if isinstance(y, tuple) else y

    def bwd(y):
        y.sum().backward()
        for t in list(inputs) + list(module.parameters()):
            if hasattr(t, "grad"):
                t.grad = None
    return fwd, bwd


def dense_cases() -> dict:
    """Timing cases: (``block``, layers) for 1 and 5 layers, (``linear``, kind) for
    Megatron's column / row parallel linears and ``torch.nn.Linear``, and ``core`` /
    ``harness`` for the unfused core attention and the backward call around a leaf."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_block import TransformerBlock
    _cpu_shims()
    _init_parallel()
    spec = get_gpt_layer_local_spec()
    mask = torch.triu(torch.ones(TOKENS, TOKENS), diagonal=1).bool()[None, None]
    out = {}
    for n in DENSE_LAYERS:
        x = torch.randn(TOKENS, 1, HIDDEN, requires_grad=True)
        out[("block", n)] = _fwd_bwd(TransformerBlock(_dense_config(n), spec), x,
                                     attention_mask=mask)
    cfg, init = _dense_config(1), torch.nn.init.xavier_normal_
    x = torch.randn(TOKENS, 1, HIDDEN, requires_grad=True)
    out[("linear", "column")] = _fwd_bwd(ColumnParallelLinear(
        HIDDEN, HIDDEN, config=cfg, init_method=init, bias=False, gather_output=False), x)
    out[("linear", "row")] = _fwd_bwd(RowParallelLinear(
        HIDDEN, HIDDEN, config=cfg, init_method=init, bias=False, input_is_parallel=True,
        skip_bias_add=True), x)
    out[("linear", "torch")] = _fwd_bwd(torch.nn.Linear(HIDDEN, HIDDEN, bias=False), x)
    core = TransformerBlock(cfg, spec).layers[0].self_attention.core_attention
    q, k, v = (torch.randn(TOKENS, 1, 4, HIDDEN // 4, requires_grad=True) for _ in range(3))
    out[("core", 0)] = _fwd_bwd(core, q, k, v, mask, attn_mask_type=AttnMaskType.causal)
    out[("harness", 0)] = _fwd_bwd(torch.nn.Identity(), x)
    return out


def model_cases() -> dict:
    """Timing cases: (``model``, layers) for 1 and 5 layers -> one micro-batch of a whole
    Megatron-Core ``GPTModel`` (local spec, rotary positions, labels: the model computes
    its vocab-parallel cross-entropy) -> (forward to the summed loss, its backward)."""
    import torch
    from megatron.core.models.gpt import GPTModel

    from .bench_host import loss_backward
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    _cpu_shims()
    _init_parallel()
    ids = torch.randint(0, 128, (1, TOKENS))
    pos = torch.arange(TOKENS)[None]
    mask = torch.triu(torch.ones(TOKENS, TOKENS), diagonal=1).bool()[None, None]
    out = {}
    for n in DENSE_LAYERS:
        model = GPTModel(_dense_config(n), transformer_layer_spec=get_gpt_layer_local_spec(),
                         vocab_size=128, max_sequence_length=TOKENS,
                         position_embedding_type="rope")

        def fwd(model=model):
            return model(ids, pos, mask, labels=ids).sum()
        out[("model", n)] = (fwd, loss_backward(model))
    return out
