"""Host cost of Megatron-LM's legacy transformer layer, measured on this CPU
(``calibrate.bench_framework --only megatron_legacy_layer``).

The layer is the real ``megatron.model.transformer.ParallelTransformer`` of a Megatron-LM
checkout (the pre-Megatron-Core model code that Megatron-LM's GPT ran until 2023 and that
Megatron-DeepSpeed forked): blocks of 1 and 5 ``ParallelTransformerLayer`` s at tiny shapes
(hidden 32, 32 tokens, 4 heads), where kernels are nearly free and what is left is host
work, with Megatron's GPT defaults: biases, hidden and attention dropout 0.1, the
TorchScript bias-GeLU and bias-dropout-add functions, query-key layer scaling, and the
fused causal softmax path (``FusedScaleMaskSoftmax.forward_fused_softmax``: one autograd
Function). Megatron-LM is not pip-installable: point ``MEGATRON_LM_PATH`` at a directory
holding its ``megatron/`` package (and ``tools/retro``, which ``megatron.arguments``
imports, and ``pretrain_gpt.py``), e.g. ``git archive 23.04 megatron tools/retro
pretrain_gpt.py | tar -x -C DIR``; without it the case is skipped with a message.

Also timed: one micro-batch of the whole GPT model as ``pretrain_gpt.forward_step`` runs it
(``get_batch``: the tensor-parallel broadcast of the batch and the causal mask and position
ids; the embedding; the output layer and the vocab-parallel cross-entropy; ``loss_func``'s
loss averaging) with 1 and 5 layers: what the 1-layer model costs beyond its layer and the
op graph's embedding, head and loss ops is the model's Python per micro-batch.

Also timed: the same blocks under full activation recompute (every layer checkpointed),
whose extra over the plain block is the checkpoint wrapper (RNG state saves and restores,
input detach, the nested ``autograd.backward``) beyond the re-run forward.

Stand-ins, each doing one op where the GPU runs one kernel: apex's
``FusedLayerNormAffineFunction`` (an autograd Function over ``torch.native_layer_norm``),
the ``scaled_upper_triang_masked_softmax_cuda`` extension (softmax and its backward), and
the other CUDA-only imports (``amp_C``, ``flash_attn``, ``transformer_engine``, tokenizer
packages) as empty modules; the CUDA generator calls of Megatron's RNG tracker and
checkpoint go to the CPU generator. The fused softmax path is taken by marking the softmax
modules' input as 16-bit (the GPU runs it in bf16/fp16; here the tensors stay fp32).
Known biases, measured by swapping each piece (a review, 3 runs each): the TorchScript
bias-GeLU / bias-dropout-add run unfused on this CPU (no LLVM fuser), +8.5..9.4 eager ops
forward and +6.6..6.9 backward over one-op stand-ins (what nvfuser's own host cost is on a
GPU is not known, so the true bias is between 0 and those); not run here: apex's persistent
layer norm with ``make_viewless_tensor`` (hidden sizes in its list, when apex contrib is
built: +3.9..4.6 forward) and a viewless layer output (+3.6..4.2 forward). Forward about
cancels; backward may be high by up to ~7.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import os
import sys
import types
from pathlib import Path

ENV = "MEGATRON_LM_PATH"
LAYERS = (1, 5)
HIDDEN, TOKENS, HEADS = 32, 32, 4
_STUBS = ("six", "regex", "apex", "amp_C", "einops", "flash_attn", "nltk", "sentencepiece",
          "tiktoken", "transformer_engine", "torchvision", "PIL")


def available() -> str:
    """'' when ``MEGATRON_LM_PATH`` holds Megatron-LM's legacy model code and its GPT
    training script, else why not."""
    root = os.environ.get(ENV, "")
    if not root:
        return f"{ENV} is not set (a directory holding Megatron-LM's megatron/ package)"
    for need in ("megatron/model/transformer.py", "pretrain_gpt.py"):
        if not (Path(root) / need).is_file():
            return f"{ENV}={root} has no {need}"
    return ""


class _Any(types.ModuleType):
    """An empty module: every attribute is another one (imports that must not fail)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any(name)

    def __call__(self, *a, **k):
        return _Any("call")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in _STUBS and name not in sys.modules:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _Any(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


def _layer_norm_module():
    import torch

    class FusedLayerNormAffineFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, shape, eps):
            out, mean, invvar = torch.native_layer_norm(x, shape, w, b, eps)
            ctx.save_for_backward(x, w, b, mean, invvar)
            ctx.shape = shape
            return out

        @staticmethod
        def backward(ctx, g):
            x, w, b, mean, invvar = ctx.saved_tensors
            gi, gw, gb = torch.ops.aten.native_layer_norm_backward(
                g, x, ctx.shape, mean, invvar, w, b, [True, True, True])
            return gi, gw, gb, None, None
    mod = types.ModuleType("apex.normalization.fused_layer_norm")
    mod.FusedLayerNormAffineFunction = FusedLayerNormAffineFunction
    return mod


def _install_stubs() -> None:
    import torch
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    sys.modules["apex.normalization.fused_layer_norm"] = _layer_norm_module()
    sys.modules["fused_layer_norm_cuda"] = types.ModuleType("fused_layer_norm_cuda")
    sm = types.ModuleType("scaled_upper_triang_masked_softmax_cuda")
    sm.forward = lambda x, scale: torch.softmax(x, -1)
    sm.backward = lambda g, y, scale: torch._softmax_backward_data(g, y, -1, y.dtype)
    sys.modules[sm.__name__] = sm
    sb = types.ModuleType("scaled_masked_softmax_cuda")
    sb.get_batch_per_block = lambda sq, sk, b, np: 4
    sys.modules[sb.__name__] = sb
    torch.cuda.current_device = lambda: "cpu"


@functools.cache
def _init_megatron():
    """Megatron's global args (GPT defaults at the bench shapes), micro-batch calculator,
    timers and a tensor-parallel size 1 model-parallel state; the CUDA RNG tracker forks
    into a null context. Once per process: Megatron's globals refuse a second set-up (both
    legacy cases in one run share it)."""
    root = os.environ[ENV]
    if root not in sys.path:
        sys.path.insert(0, root)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    _install_stubs()
    from megatron import global_vars
    from megatron.arguments import parse_args, validate_args
    from megatron.core import mpu
    from megatron.core.enums import ModelType
    from megatron.core.tensor_parallel import random as tpr
    from megatron.timers import Timers
    argv, sys.argv = sys.argv, ["bench", "--num-layers", str(LAYERS[-1]), "--hidden-size",
                                str(HIDDEN), "--num-attention-heads", str(HEADS),
                                "--seq-length", str(TOKENS), "--max-position-embeddings",
                                str(TOKENS), "--micro-batch-size", "1",
                                "--use-cpu-initialization", "--no-gradient-accumulation-fusion",
                                "--no-persist-layer-norm"]
    try:
        with contextlib.redirect_stdout(None):
            args = parse_args()
            args.world_size, args.rank = 1, 0
            validate_args(args)
    finally:
        sys.argv = argv
    args.model_type = ModelType.encoder_or_decoder
    global_vars._GLOBAL_ARGS = args
    with contextlib.redirect_stdout(None):
        global_vars._build_num_microbatches_calculator(args)
    global_vars._GLOBAL_TIMERS = Timers(args.timing_log_level, args.timing_log_option)
    if not mpu.model_parallel_is_initialized():
        mpu.initialize_model_parallel(1, 1)
    _rng_on_cpu(tpr)
    return args


def _rng_on_cpu(tpr) -> None:
    """The CUDA RNG calls Megatron's tracker and checkpoint make (get / set / seed the
    device generator) on the CPU generator instead, so the real ``fork`` and
    ``CheckpointFunction`` run with their host work."""
    import torch
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)
    tpr._set_cuda_rng_state = lambda state, device=-1: torch.set_rng_state(state)
    tpr.model_parallel_cuda_manual_seed(1234)


def _block(args, layers: int, recompute: bool = False):
    """``layers`` layers; ``recompute``: full activation recompute of every layer
    (granularity full, method uniform, 1 layer per checkpoint, as Megatron-LM's GPT runs
    ``--recompute-activations`` full)."""
    from megatron.model.enums import AttnMaskType
    from megatron.model.transformer import ParallelTransformer
    from megatron.model.utils import init_method_normal, scaled_init_method_normal
    args.num_layers = args.encoder_num_layers = layers
    args.recompute_granularity = "full" if recompute else None
    args.recompute_method, args.recompute_num_layers = ("uniform", 1) if recompute else (None, None)
    block = ParallelTransformer(init_method_normal(0.02), scaled_init_method_normal(0.02, layers),
                                self_attn_mask_type=AttnMaskType.causal)
    _fused_softmax(block)
    return block


def _gpt_forward_step(args):
    """``pretrain_gpt.forward_step`` and a batch iterator, as Megatron-LM's GPT training
    runs a micro-batch (get_batch's broadcast and masks, the model, the loss function), on
    this CPU: ``.cuda()`` returns the tensor, ``torch.cuda.LongTensor`` is the CPU one, the
    training and dataset modules (not used by a step) are empty, the tokenizer only has
    ``eod``; NumPy's removed aliases are put back for the old dataset code's import."""
    import numpy as np
    import torch
    for alias, kind in (("float", float), ("int", int), ("bool", bool)):
        if alias not in np.__dict__:
            setattr(np, alias, kind)
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.cuda.LongTensor, torch.cuda.FloatTensor = torch.LongTensor, torch.FloatTensor
    for name, attr in (("megatron.training", "pretrain"),
                       ("megatron.data.gpt_dataset", "build_train_valid_test_datasets")):
        mod = types.ModuleType(name)
        setattr(mod, attr, None)
        sys.modules[name] = mod
    from megatron import global_vars
    global_vars._GLOBAL_TOKENIZER = types.SimpleNamespace(eod=0)
    args.padded_vocab_size = 128
    args.reset_position_ids = args.reset_attention_mask = args.eod_mask_loss = False
    import pretrain_gpt
    batch = {"text": torch.randint(1, 128, (1, TOKENS + 1))}
    return pretrain_gpt, iter(lambda: batch, None)


def _gpt_cases(args) -> dict:
    """(``model``, layers) -> one micro-batch of the whole GPT model (forward step and loss;
    backward of the loss)."""
    from .bench_host import loss_backward
    gpt, data = _gpt_forward_step(args)
    out = {}
    for n in LAYERS:
        model = _gpt_model(gpt, args, n)

        def fwd(model=model):
            output, loss_func = gpt.forward_step(data, model)
            return loss_func(output)[0]
        out[("model", n)] = (fwd, loss_backward(model))
    return out


def _gpt_model(gpt, args, layers: int):
    """``pretrain_gpt.model_provider()``'s GPT model of ``layers`` layers, no recompute, on
    the fused softmax path."""
    args.num_layers = args.encoder_num_layers = layers
    args.recompute_granularity = args.recompute_method = args.recompute_num_layers = None
    model = gpt.model_provider()
    _fused_softmax(model)
    return model


def split_cases() -> dict:
    """Where the GPT model's Python runs under pipeline parallelism: (``get_batch``, 0) the
    batch code every stage runs (broadcast, masks; forward only), and (``embedding``, 0) the
    first stage's embedding module (forward, and backward of its output), on a 1-layer
    model."""
    import torch
    args = _init_megatron()
    gpt, data = _gpt_forward_step(args)
    emb = _gpt_model(gpt, args, 1).language_model.embedding
    tokens, _, _, _, position_ids = gpt.get_batch(data)

    def emb_bwd(y):
        y.float().sum().backward()
        for p in emb.parameters():
            p.grad = None
    return {("get_batch", 0): (lambda: gpt.get_batch(data), lambda _y: None),
            ("embedding", 0): (lambda: emb(tokens, position_ids), emb_bwd),
            ("harness", 0): (lambda: torch.ones(1, requires_grad=True) * 1.0, emb_bwd)}


def _fused_softmax(module) -> None:
    for mod in module.modules():
        if type(mod).__name__ == "FusedScaleMaskSoftmax":
            mod.input_in_float16 = True          # the GPU's 16-bit path: the fused kernel


def dense_cases() -> dict:
    """Timing cases for ``bench_host.time_interleaved``: (``block`` | ``recompute``, layers)
    for 1 and 5 layers, without and with full recompute -> (forward, backward of its
    output)."""
    import torch

    from .bench_mcore_host import _fwd_bwd
    args = _init_megatron()
    mask = torch.triu(torch.ones(TOKENS, TOKENS), diagonal=1).bool()[None, None]
    out = {}
    for kind in ("block", "recompute"):
        for n in LAYERS:
            x = torch.randn(TOKENS, 1, HIDDEN, requires_grad=True)
            out[(kind, n)] = _fwd_bwd(_block(args, n, kind == "recompute"), x, mask)
    return {**out, **_gpt_cases(args)}
