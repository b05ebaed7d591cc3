"""Host cost of framework mechanisms, measured on this CPU in eager-op units.

``python -m calibrate.bench_framework [--out CSV]`` times, on the tiny decoders of
``calibrate.bench_host`` (where kernels are nearly free, so what is left is host work):

* ``ddp_param_hooks``: torch ``DistributedDataParallel`` (bucket_cap_mb 25, a no-op comm hook,
  so the collective costs nothing) against the bare model, forward + backward; the extra
  time per parameter tensor (autograd hook, copy into the bucket, copy back) from the
  difference between 1- and 5-layer decoders;
* ``fsdp1_unit``: ``FullyShardedDataParallel`` (v1, FULL_SHARD, one unit per block,
  ``use_orig_params=True``, ``limit_all_gathers=True``) on a fake process group of 2 ranks
  (no communication), extra time per unit, forward and backward separately;
* ``fsdp2_unit``: ``fully_shard`` (FSDP2, one unit per block plus the root, default
  ``reshard_after_forward``, torchtitan's MixedPrecisionPolicy(bf16, fp32)) on a 2-rank
  device mesh over the same fake process group, against the bare model in bf16, for blocks
  of 6 and of 9 parameter tensors (``calibrate.bench_dp.fsdp2_rows``), extra time per unit,
  forward and backward separately;
* ``deepspeed_bf16_grad_loop``: the per-micro-batch loop of DeepSpeed's ``BF16_Optimizer``
  (``update_hp_grads`` as of 2022: per bf16 parameter tensor ``hp_grad.data.add_(
  lp.grad.data.to(fp32).view(shape))`` then ``lp.grad = None``), per tensor.

* ``mcore_moe_layer``: Megatron-Core's ``MoELayer`` (``calibrate.bench_mcore_host``; needs
  ``pip install megatron-core``, skipped with a message otherwise) at 2 and 8 local
  experts: the per-layer constant forward and backward, the router's share (issued before
  the dispatcher's device-to-host sync) and the per-local-expert slope of ``SequentialMLP``;
* ``mcore_layer_glue``: Megatron-Core's dense ``TransformerLayer`` (local spec, same module):
  per layer, what is left beyond the op graph's ops, the parallel linears' extra over
  ``nn.Linear`` and the unfused attention's extra;
* ``mcore_model``: a whole Megatron-Core ``GPTModel`` (same module): the model's own Python
  outside its layers per micro-batch pass;
* ``mcore_ddp_hooks``, ``mcore_dist_optimizer``: Megatron-Core's DistributedDataParallel
  (distributed optimizer, overlapped grad reduce and param gather) over the bare model per
  micro-batch, and its distributed optimizer's step in pieces (``calibrate.bench_mcore_ddp``);
* ``mcore_train_loop``: Megatron-Core's no-pipelining schedule and core_r0.8.0's pretrain_gpt
  step (get_batch, loss_func) per micro-batch outside the model (``calibrate.bench_mcore_loop``);
* ``megatron_legacy_layer``: Megatron-LM's legacy ``ParallelTransformerLayer``
  (``calibrate.bench_megatron_legacy``; needs ``MEGATRON_LM_PATH``, skipped with a message
  otherwise): per layer, forward and backward, what is left beyond the op graph's ops
  (materialized attention, dropout) for the same layer;
* ``megatron_legacy_ddp_hooks``, ``megatron_legacy_optimizer``,
  ``megatron_legacy_dist_optimizer``: Megatron-LM's legacy local ``DistributedDataParallel``
  (per parameter tensor per backward, per model, per step) and its Float16 / distributed
  optimizer's step in pieces, fixed and per parameter tensor
  (``calibrate.bench_megatron_legacy_step``; needs ``MEGATRON_LM_PATH``, run alone);
* ``hf_decoder_layer``: a HuggingFace ``transformers`` ``LlamaDecoderLayer``
  (``calibrate.bench_hf_host``; needs ``pip install transformers``, skipped otherwise): the
  same, against the op graph of a Llama-style layer;
* ``deepspeed_zero1_grad_hooks``, ``deepspeed_zero2_grad_hooks``, ``deepspeed_zero3_hooks``:
  DeepSpeed's ZeRO engine at stage 1, 2, 3 (``calibrate.bench_deepspeed``; needs ``pip
  install deepspeed``, skipped otherwise): the engine's extra over the bare model per
  parameter tensor, forward and backward, ZeRO-3's memory-efficient linear per Linear call,
  and the engine's constant per micro-batch.
* ``deepspeed_zero3_recompute``: the ZeRO-3 engine (memory_efficient_linear off) with every
  layer checkpointed as transformers 5.x does, over the bare model under the same
  checkpointing, and what that adds beyond ZeRO-3 without recompute, per parameter tensor
  of a recomputed layer; the all-gathers and reduce-scatters per layer in backward are
  counted and written into the rows' method.
* ``deepspeed_zero3_regather``: the same ZeRO-3 engine with ``stage3_max_live_parameters``
  and ``stage3_max_reuse_distance`` 0, so that, as in a model larger than those limits,
  every partitioned parameter is released after forward and all-gathered again in
  backward: its extra over the bare model and beyond ZeRO-3 keeping the parameters
  gathered, per parameter tensor; the all-gathers per layer are counted into the method.
* ``deepspeed_pipe_engine``: DeepSpeed's pipeline engine (``calibrate.bench_deepspeed_pipe``;
  skipped without DeepSpeed): ``train_batch`` of the probe in 2 stages over the bare stages,
  per micro-batch and per step for the first and the last stage, each instruction, and its
  tensor-parallel (``PartitionedTensor``) hand-offs' extra, timed in a child process.
* ``deepspeed_zero_optimizer``: DeepSpeed's ZeRO stage 1 / 2 optimizer step
  (``DeepSpeedZeroOptimizer.step`` as ``engine.step()`` runs it at the accumulation boundary,
  bf16 and fp16, ``calibrate.bench_deepspeed_step``; skipped without DeepSpeed): whole and in
  its pieces, fixed, per parameter tensor and per partition element, and its host reads.
* ``hf_trainer_loop``: HuggingFace ``Trainer``'s own host work per micro-batch and per optimizer
  step beyond the model's, and its host reads (``calibrate.bench_hf_trainer``; skipped without
  transformers).

Each is divided by the host time per op-graph op forward measured in the same run (the
host probe), giving ``eager ops`` that ``frameworks.json`` stores and the simulator scales
by the profile's ``host.op_fwd_us``. Prints the rows and appends them to ``--out``.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import sys
from pathlib import Path

from .bench_dp import (
    _ddp,
    _extra_us,
    _fsdp,
    _init_fake_pg,
    _low_us,
    _mechanism_rows,
    deepspeed_loop_us,
    fsdp2_rows,
    mcore_optimizer_loop_us,
)
from .bench_host import (
    HOST_LAYERS,
    _decoder_fns,
    _linear_fns,
    graph_ops,
)

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "hardware_db" / "data" / "measurements" / "host_mechanisms.csv"
COLUMNS = ["mechanism", "metric", "value_us", "op_fwd_us_same_run", "eager_ops", "host",
           "torch", "date", "method"]


def probe_us() -> dict[str, float]:
    """The host probe (``calibrate.bench_host``): host us per op-graph op forward and
    backward, and per ``nn.Linear`` forward."""
    lo, hi = HOST_LAYERS
    cases = {n: _decoder_fns(n)[:2] for n in HOST_LAYERS}
    cases["linear"] = _linear_fns()
    t = _low_us(cases)
    (f0, b0), (f1, b1) = graph_ops(lo), graph_ops(hi)
    return {"fwd": (t[hi][0] - t[lo][0]) / (f1 - f0), "bwd": (t[hi][1] - t[lo][1]) / (b1 - b0),
            "linear": t["linear"][0]}


def _mcore_times(mechanism: str, cases: str) -> dict | None:
    """Timings of ``calibrate.bench_mcore_host``'s ``cases`` (a function name); None, with a
    message on stderr naming ``mechanism``, when Megatron-Core is not installed."""
    from . import bench_mcore_host as mc
    why = mc.available()
    if why:
        print(f"{mechanism} skipped: {why}", file=sys.stderr)
        return None
    return _low_us(getattr(mc, cases)())


def moe_rows(base: dict, op: float) -> list[dict]:
    """``mcore_moe_layer`` rows (``calibrate.bench_mcore_host``); none, with a message on
    stderr, when Megatron-Core is not installed."""
    from . import bench_mcore_host as moe
    t = _mcore_times("mcore_moe_layer", "moe_cases")
    if t is None:
        return []
    lo, hi = moe.EXPERTS
    rows = []
    for pas, i in (("fwd", 0), ("bwd", 1)):
        slope = (t[("layer", hi)][i] - t[("layer", lo)][i]) / (hi - lo)
        const = t[("layer", lo)][i] - lo * slope - t[("harness", 0)][i]
        rows += [(f"per MoE layer, {pas}, constant", const),
                 (f"per local expert, {pas} (SequentialMLP)", slope)]
    rows.append(("router forward (before the dispatcher sync)",
                 sum(t[("router", e)][0] for e in moe.EXPERTS) / len(moe.EXPERTS)))
    how = (f"Megatron-Core MoELayer (alltoall dispatcher, aux-loss top-{moe.TOPK} router, "
           f"SequentialMLP) hidden {moe.HIDDEN}, {moe.TOKENS} tokens, {lo} vs {hi} local "
           "experts, EP 1, fake pg x2; minus the backward harness")
    return _mechanism_rows(base, op, "mcore_moe_layer", how, rows)


def _graph_ops(hidden: int, tokens: int) -> tuple[int, int, int, int, int]:
    """The op graph's (forward ops, backward ops, Linear calls, core-attention forward ops,
    core-attention backward ops) of one dense layer as Megatron's local spec runs it
    (unfused attention, no dropout), at the bench's shapes."""
    from simulator.cost.host import block_op_count, linear_calls, op_count
    from simulator.workload.ops import LayerShape, backward_ops, layer_ops
    from simulator.workload.spec import TransformerSpec
    m = TransformerSpec("bench", 1, hidden, 4 * hidden, 4, 4, 128, tokens)
    f = layer_ops(m, LayerShape(micro_batch=1, seq_len=tokens, flash=False, dropout=False))
    b = backward_ops(f)
    core = ("qk", "softmax", "av")
    return (sum(map(op_count, f)), sum(map(op_count, b)), linear_calls(f),
            int(block_op_count(f, core, False)), int(block_op_count(b, core, True)))


def dense_rows(base: dict, op: float) -> list[dict]:
    """``mcore_layer_glue`` rows (``calibrate.bench_mcore_host``): a Megatron-Core dense
    layer's host time beyond the op graph's ops, its parallel linears' extra over
    ``nn.Linear`` and its unfused attention's extra; none without Megatron-Core."""
    from . import bench_mcore_host as mc
    t = _mcore_times("mcore_layer_glue", "dense_cases")
    if t is None:
        return []
    lo, hi = mc.DENSE_LAYERS
    n_f, n_b, linears, core_f, core_b = _graph_ops(mc.HIDDEN, mc.TOKENS)
    rows = []
    for pas, i, n, core_n in (("fwd", 0, n_f, core_f), ("bwd", 1, n_b, core_b)):
        layer = (t[("block", hi)][i] - t[("block", lo)][i]) / (hi - lo)
        lin = (t[("linear", "column")][i] + t[("linear", "row")][i]) / 2 \
            - t[("linear", "torch")][i]
        core = t[("core", 0)][i] - (t[("harness", 0)][i] if i else 0.0) - core_n * op
        glue = layer - n * op - linears * lin - core
        rows += [(f"per layer, {pas} (local spec, whole layer)", layer),
                 (f"parallel linear extra over nn.Linear, {pas}", lin),
                 (f"unfused core attention extra over the op graph, {pas}", core),
                 (f"per layer, {pas}, glue", glue)]
    how = (f"Megatron-Core TransformerBlock local spec, hidden {mc.HIDDEN}, {mc.TOKENS} tokens, "
           f"{lo} vs {hi} layers, no bias/dropout; glue = layer - op graph ({n_f} fwd / {n_b} "
           f"bwd ops) - {linears} x linear extra - core attention extra")
    return _mechanism_rows(base, op, "mcore_layer_glue", how, rows)


def mcore_model_rows(base: dict) -> list[dict]:
    """``mcore_model`` rows (``calibrate.bench_mcore_host.model_cases``): a Megatron-Core
    GPTModel's Python outside its layers per micro-batch pass; none without megatron-core."""
    import types

    from . import bench_mcore_host as mc
    timed = _with_probe(types.SimpleNamespace(available=mc.available,
                                              dense_cases=mc.model_cases), "mcore_model")
    if timed is None:
        return []
    t, op = timed
    lo, hi = mc.DENSE_LAYERS
    outside = legacy_graph_ops(mc.HIDDEN, mc.TOKENS, outside=True)
    rows = _model_rows(t, op, (lo, hi), outside, "model")
    how = (f"Megatron-Core GPTModel (local spec, rope, labels), hidden {mc.HIDDEN}, "
           f"{mc.TOKENS} tokens, {lo} vs {hi} layers, timed interleaved with the host probe "
           f"(bwd op {op['bwd']:.2f} us); model pass = the {lo}-layer model - its layer - "
           f"the op graph's embedding, head and loss ({outside[0]} fwd / {outside[1]} bwd "
           "ops, Megatron's unfused cross-entropy)")
    return _mechanism_rows({**base, "op_fwd_us_same_run": round(op["fwd"], 2)}, op["fwd"],
                           "mcore_model", how, rows)


def legacy_rows(base: dict) -> list[dict]:
    """``megatron_legacy_layer`` rows (``calibrate.bench_megatron_legacy``): a Megatron-LM
    legacy layer's host time, whole and beyond the op graph's ops (forward ops at the
    probe's forward cost, backward ops at its backward cost); none without the checkout."""
    from . import bench_megatron_legacy as lg
    timed = _with_probe(lg, "megatron_legacy_layer")
    if timed is None:
        return []
    t, op = timed
    lo, hi = lg.LAYERS
    n_f, n_b = legacy_graph_ops(lg.HIDDEN, lg.TOKENS)
    rows = _layer_rows(t, op, (lo, hi), (n_f, n_b))
    rows += _model_rows(t, op, (lo, hi), legacy_graph_ops(lg.HIDDEN, lg.TOKENS, outside=True),
                        "model")
    how = (f"Megatron-LM legacy ParallelTransformer ({lg.ENV}), hidden {lg.HIDDEN}, "
           f"{lg.TOKENS} tokens, {lo} vs {hi} layers, bias, dropout 0.1, fused softmax path, "
           "real RNG tracker on the CPU generator, timed interleaved with the host probe "
           f"(bwd op {op['bwd']:.2f} us); glue = layer - op graph ({n_f} fwd ops at the "
           f"probe's fwd cost / {n_b} bwd ops at its bwd cost); recompute: full, uniform, 1 "
           "layer per checkpoint, wrapper = recompute - plain (bwd: also - the re-run "
           "forward's ops and glue); model pass = the 1-layer GPT model's micro-batch "
           "(pretrain_gpt.forward_step + loss_func) - its layer - the op graph's embedding, "
           "head and loss ops")
    return _mechanism_rows({**base, "op_fwd_us_same_run": round(op["fwd"], 2)}, op["fwd"],
                           "megatron_legacy_layer", how, rows)


def hf_rows(base: dict) -> list[dict]:
    """``hf_decoder_layer`` rows (``calibrate.bench_hf_host``): a transformers Llama decoder
    layer's host time, whole and beyond the op graph's ops for the same layer; none without
    ``transformers``."""
    from . import bench_hf_host as hf
    timed = _with_probe(hf, "hf_decoder_layer")
    if timed is None:
        return []
    t, op = timed
    lo, hi = hf.LAYERS
    n_f, n_b = llama_graph_ops(hf.HIDDEN, hf.FFN, hf.HEADS, hf.KV_HEADS, hf.TOKENS)
    rows = _layer_rows(t, op, (lo, hi), (n_f, n_b))
    e_f, e_b = llama_graph_ops(hf.HIDDEN, hf.FFN, hf.HEADS, hf.KV_HEADS, hf.TOKENS,
                               outside=True)
    rows += _model_rows(t, op, (lo, hi), (e_f, e_b), "block")
    how = (f"transformers {hf.version()} LlamaForCausalLM with labels, use_cache as the "
           f"config (on; off under checkpointing) (sdpa), hidden {hf.HIDDEN}, {hf.HEADS}/"
           f"{hf.KV_HEADS} heads, {hf.TOKENS} tokens, {lo} vs {hi} layers, train mode, timed "
           f"interleaved with the host probe (bwd op {op['bwd']:.2f} us); glue = layer - op "
           f"graph ({n_f} fwd ops at the probe's fwd cost / {n_b} bwd ops at its bwd cost); "
           "recompute: gradient_checkpointing_enable() (non-reentrant), wrapper = recompute "
           f"- plain (bwd: also - the re-run forward's ops and glue); model pass = the {lo}-"
           f"layer model - its layer - the op graph's embedding, head and loss ({e_f} fwd / "
           f"{e_b} bwd ops)")
    return _mechanism_rows({**base, "op_fwd_us_same_run": round(op["fwd"], 2)}, op["fwd"],
                           "hf_decoder_layer", how, rows)


def deepspeed_rows(base: dict, only: frozenset[str] = frozenset()) -> list[dict]:
    """``deepspeed_zero1_grad_hooks`` / ``_zero2_grad_hooks`` / ``_zero3_hooks`` /
    ``_zero3_recompute`` / ``_zero3_regather`` rows (``calibrate.bench_deepspeed``) of those
    ``only`` names (all when empty; none when it names others), the last two with the
    collectives counted per layer; none, with a message on stderr, without DeepSpeed."""
    import types

    from . import bench_deepspeed as ds
    from .bench import PRESSURE_SUSPECT
    from .store import PressureMeter
    kinds = tuple(k for k, m in ds.MECHANISMS.items() if not only or m in only)
    if not kinds:
        return []
    meter = PressureMeter().start()
    timed = _with_probe(types.SimpleNamespace(available=ds.available,
                                              dense_cases=lambda: ds.cases(kinds)),
                        "deepspeed_zero*_hooks")
    pressure = meter.stop()
    if timed is None:
        return []
    t, op = timed
    if 3 in kinds:          # ZeRO-3's linear wrapper alone, in the main probe's units
        tl, opl = _with_probe(types.SimpleNamespace(available=ds.available,
                                                    dense_cases=ds.linear_cases), "linear")
        scale = op["fwd"] / opl["fwd"]
        t.update({k: (f * scale, b * scale) for k, (f, b) in tl.items() if k[0] == "linear"})
    if pressure > PRESSURE_SUSPECT:
        print(f"deepspeed_zero*_hooks: host busy ({pressure:.0%} CPU pressure), rows suspect",
              file=sys.stderr)
    b = {**base, "op_fwd_us_same_run": round(op["fwd"], 2)}
    notes = ds.collective_notes(kinds)
    return [r for mech, metric, us in ds.metric_rows(t, kinds)
            for r in _mechanism_rows(b, op["fwd"], mech,
                                     ds.method(op, pressure, mech, notes.get(mech, "")),
                                     [(metric, us)])]


def deepspeed_pipe_rows(base: dict) -> list[dict]:
    """``deepspeed_pipe_engine`` rows (``calibrate.bench_deepspeed_pipe``); none, with a
    message on stderr, without DeepSpeed."""
    from .bench_deepspeed_pipe import rows
    return rows(base)


def _optional_rows(base: dict, want) -> list[dict]:
    """``deepspeed_pipe_engine``, ``deepspeed_zero_optimizer`` (``calibrate.
    bench_deepspeed_step``; none, with a message, without DeepSpeed), ``hf_trainer_loop``
    (``calibrate.bench_hf_trainer``, in its own probe's eager ops; none, with a message,
    without transformers) and ``mcore_ddp_hooks`` / ``mcore_dist_optimizer`` rows
    (``calibrate.bench_mcore_ddp``) and ``mcore_train_loop`` (``calibrate.bench_mcore_loop``),
    as ``want``s."""
    from .bench_deepspeed_step import MECHANISM as DS_STEP
    from .bench_deepspeed_step import rows as ds_step_rows
    from .bench_hf_trainer import rows as trainer_rows
    from .bench_mcore_ddp import framework_rows as mcore_ddp_rows
    from .bench_mcore_loop import rows as mcore_loop_rows
    return ((deepspeed_pipe_rows(base) if want("deepspeed_pipe_engine") else [])
            + (ds_step_rows(base) if want(DS_STEP) else [])
            + (trainer_rows(base) if want("hf_trainer_loop") else [])
            + mcore_ddp_rows(base, want)
            + (mcore_loop_rows(base) if want("mcore_train_loop") else []))


def _layer_rows(t: dict, op: dict[str, float], layers: tuple[int, int],
                graph: tuple[int, int]) -> list[tuple[str, float]]:
    """Per-layer (metric, us) rows from ``block`` and ``recompute`` cases at ``layers``
    (lo, hi): whole layer, glue beyond the op graph's ``graph`` (fwd, bwd) ops, the layer
    under full recompute, and the checkpoint wrapper (recompute - plain; backward also
    minus the re-run forward's ops and glue)."""
    lo, hi = layers
    n_f, n_b = graph
    per = {(k, i): (t[(k, hi)][i] - t[(k, lo)][i]) / (hi - lo)
           for k in ("block", "recompute") for i in (0, 1)}
    glue_f = per[("block", 0)] - n_f * op["fwd"]
    rows = []
    for pas, i, n in (("fwd", 0, n_f), ("bwd", 1, n_b)):
        rows += [(f"per layer, {pas} (whole layer)", per[("block", i)]),
                 (f"per layer, {pas}, glue", per[("block", i)] - n * op[pas]),
                 (f"per layer, {pas} under full recompute (whole layer)",
                  per[("recompute", i)])]
    return rows + [("full-recompute wrapper, fwd", per[("recompute", 0)] - per[("block", 0)]),
                   ("full-recompute wrapper, bwd", per[("recompute", 1)] - per[("block", 1)]
                    - n_f * op["fwd"] - glue_f)]


def _model_rows(t: dict, op: dict[str, float], layers: tuple[int, int],
                outside: tuple[int, int], kind: str) -> list[tuple[str, float]]:
    """The model's Python outside its layers, per micro-batch pass: the ``lo``-layer whole
    model (cases ``(kind, n)``) minus its layers (per layer from ``lo`` vs ``hi``) minus the
    op graph's ``outside`` (fwd, bwd) embedding, head and loss ops."""
    lo, hi = layers
    rows = []
    for pas, i, n in (("fwd", 0, outside[0]), ("bwd", 1, outside[1])):
        layer = (t[(kind, hi)][i] - t[(kind, lo)][i]) / (hi - lo)
        rows.append((f"per model pass, {pas}, outside the layers, glue",
                     t[(kind, lo)][i] - lo * layer - n * op[pas]))
    return rows


def _with_probe(bench, mechanism: str) -> tuple[dict, dict[str, float]] | None:
    """``bench.dense_cases()`` timed interleaved with the host probe (so the probe sees the
    same host load) and the probe's us per op (fwd, bwd); None, with a message on stderr
    naming ``mechanism``, when ``bench.available()`` says why not."""
    why = bench.available()
    if why:
        print(f"{mechanism} skipped: {why}", file=sys.stderr)
        return None
    cases = bench.dense_cases()
    cases.update({("probe", n): _decoder_fns(n)[:2] for n in HOST_LAYERS})
    t = _low_us(cases)
    return t, _probe_from(t)


def _probe_from(t: dict) -> dict[str, float]:
    """Host us per op-graph op (fwd, bwd) from the probe cases timed among ``t``."""
    (f0, b0), (f1, b1) = graph_ops(HOST_LAYERS[0]), graph_ops(HOST_LAYERS[1])
    lo, hi = ("probe", HOST_LAYERS[0]), ("probe", HOST_LAYERS[1])
    return {"fwd": (t[hi][0] - t[lo][0]) / (f1 - f0), "bwd": (t[hi][1] - t[lo][1]) / (b1 - b0)}


def llama_graph_ops(hidden: int, ffn: int, heads: int, kv_heads: int, tokens: int,
                    outside: bool = False) -> tuple[int, int]:
    """The op graph's (forward, backward) ops of one Llama-style layer (RMSNorm, rotary,
    grouped-query flash attention, SwiGLU, no dropout); ``outside``: of the model's ops
    outside the layers instead (embedding, final norm, LM head, eager loss)."""
    from dataclasses import replace

    from simulator.workload.ops import LayerShape
    from simulator.workload.presets import get_preset
    m = replace(get_preset("llama3-8b"), n_layers=1, hidden=hidden, ffn_hidden=ffn,
                n_heads=heads, n_kv_heads=kv_heads, vocab=128, seq_len=tokens, head_dim=0)
    sh = LayerShape(micro_batch=1, seq_len=tokens, flash=True, dropout=False, loss="eager")
    return _op_counts(m, sh, "outside" if outside else "layer")


def _op_counts(m, sh, part: str) -> tuple[int, int]:
    """(forward, backward) host ops of ``part`` of model ``m`` at shape ``sh``: one ``layer``,
    the ``embedding``, or everything ``outside`` the layers (embedding, head, loss)."""
    from simulator.cost.host import op_count
    from simulator.workload.ops import backward_ops, embedding_ops, head_ops, layer_ops
    f = {"layer": lambda: layer_ops(m, sh), "embedding": lambda: embedding_ops(m, sh),
         "outside": lambda: embedding_ops(m, sh) + head_ops(m, sh)}[part]()
    return sum(map(op_count, f)), sum(map(op_count, backward_ops(f)))


def legacy_split_rows(base: dict) -> list[dict]:
    """``megatron_legacy_model_split`` rows (``calibrate.bench_megatron_legacy.split_cases``):
    of the GPT model's Python per micro-batch, the batch code every pipeline stage runs
    (forward) and the embedding module's Python beyond its op-graph ops (first stage)."""
    import types

    from . import bench_megatron_legacy as lg
    timed = _with_probe(types.SimpleNamespace(available=lg.available,
                                              dense_cases=lg.split_cases),
                        "megatron_legacy_model_split")
    if timed is None:
        return []
    t, op = timed
    emb_f, emb_b = legacy_embedding_ops(lg.HIDDEN, lg.TOKENS)
    rows = [("per micro-batch, batch code (every stage), fwd", t[("get_batch", 0)][0]),
            ("per micro-batch, embedding (first stage), fwd, glue",
             t[("embedding", 0)][0] - emb_f * op["fwd"]),
            ("per micro-batch, embedding (first stage), bwd, glue",
             t[("embedding", 0)][1] - t[("harness", 0)][1] - emb_b * op["bwd"])]
    how = (f"Megatron-LM legacy GPT model ({lg.ENV}) of 1 layer, hidden {lg.HIDDEN}, "
           f"{lg.TOKENS} tokens: pretrain_gpt.get_batch alone, and language_model.embedding "
           f"alone beyond the op graph's embedding ops ({emb_f} fwd / {emb_b} bwd; backward "
           "minus the backward call's harness), timed interleaved with the host probe "
           f"(bwd op {op['bwd']:.2f} us)")
    return _mechanism_rows({**base, "op_fwd_us_same_run": round(op["fwd"], 2)}, op["fwd"],
                           "megatron_legacy_model_split", how, rows)


def legacy_embedding_ops(hidden: int, tokens: int) -> tuple[int, int]:
    """The op graph's (forward, backward) embedding ops of Megatron-LM's legacy GPT."""
    return _op_counts(*_legacy_bench_model(hidden, tokens), "embedding")


def legacy_graph_ops(hidden: int, tokens: int, outside: bool = False) -> tuple[int, int]:
    """The op graph's (forward, backward) ops of one layer as Megatron-LM's legacy GPT runs
    it: materialized attention (fused softmax), attention and hidden dropout; ``outside``:
    of the model's ops outside the layers instead (embedding, final norm, output layer,
    Megatron's cross-entropy)."""
    return _op_counts(*_legacy_bench_model(hidden, tokens), "outside" if outside else "layer")


def _legacy_bench_model(hidden: int, tokens: int):
    """(model, shape) of the Megatron-LM legacy benches: a GPT of width ``hidden``,
    materialized attention, dropout, Megatron's cross-entropy."""
    from simulator.workload.ops import LayerShape
    from simulator.workload.spec import TransformerSpec
    m = TransformerSpec("bench", 1, hidden, 4 * hidden, 4, 4, 128, tokens)
    return m, LayerShape(micro_batch=1, seq_len=tokens, flash=False, dropout=True,
                         loss="megatron")


def legacy_alone_rows(base: dict, only: frozenset[str]) -> list[dict] | None:
    """The Megatron-LM legacy mechanisms' rows (``calibrate.bench_megatron_legacy`` and
    ``_legacy_step``) when ``only`` names nothing else: their stand-ins stay in the process;
    None otherwise, with a message when it names them among others or is empty."""
    from .bench_megatron_legacy_step import MECHANISMS as LEGACY_STEP
    from .bench_megatron_legacy_step import framework_rows as legacy_step_rows
    legacy = {"megatron_legacy_layer": legacy_rows,
              "megatron_legacy_model_split": legacy_split_rows}
    alone = set(legacy) | set(LEGACY_STEP)
    if only and only <= alone:
        return ([r for name in sorted(only & set(legacy)) for r in legacy[name](base)]
                + legacy_step_rows(base, lambda name: name in only))
    if not only or only & alone:
        print(f"{', '.join(sorted(alone))} skipped: run them alone (--only with these names "
              "only); their stand-ins shadow the other frameworks in this process",
              file=sys.stderr)
    return None


def measure(only: frozenset[str] = frozenset()) -> list[dict]:
    """The probe rows and every mechanism's (``only``: just those mechanisms)."""
    import torch
    torch.set_num_threads(1)
    _init_fake_pg()
    probe = probe_us()
    op = probe["fwd"]
    host = f"{_cpu_model()} ({torch.get_num_threads()} thread)"
    base = {"op_fwd_us_same_run": round(op, 2), "host": host, "torch": torch.__version__,
            "date": dt.date.today().isoformat()}
    how = {"fwd": "per op-graph op, forward", "bwd": "per op-graph op, backward",
           "linear": "torch.nn.Linear forward (32x32; input requires grad)"}
    rows = _mechanism_rows(base, op, "eager_probe", "calibrate.bench_host probe: decoders "
                           f"with {HOST_LAYERS[1]} vs {HOST_LAYERS[0]} layers, hidden 32, seq 8",
                           [(how[k], v) for k, v in probe.items()])
    want = (lambda name: not only or name in only)
    if want("mcore_moe_layer"):
        rows += moe_rows(base, op)
    if want("mcore_layer_glue"):
        rows += dense_rows(base, op)
    if want("mcore_model"):
        rows += mcore_model_rows(base)
    rows += (hf_rows(base) if want("hf_decoder_layer") else []) + deepspeed_rows(base, only)
    rows += _optional_rows(base, want)
    legacy = legacy_alone_rows(base, only)
    if legacy is not None:
        return rows + legacy
    if only and not only & {"ddp_param_hooks", "fsdp1_unit", "fsdp2_unit",
                            "deepspeed_bf16_grad_loop", "mcore_optimizer"}:
        return rows
    if want("ddp_param_hooks"):
        f, b, tensors, units = _extra_us(_ddp)
        rows += _mechanism_rows(base, op, "ddp_param_hooks", "DDP(no-op comm hook) - bare, 5 vs "
                                f"1 layers ({tensors} tensors)",
                                [("per parameter tensor, fwd+bwd", (f + b) / tensors)])
    if want("fsdp2_unit"):
        rows += fsdp2_rows(base, op)
    for name, wrap, how in (("fsdp1_unit", _fsdp, "FSDP1 FULL_SHARD use_orig_params"),):
        if not want(name):
            continue
        f, b, tensors, units = _extra_us(wrap)
        rows += _mechanism_rows(base, op, name, f"{how} fake pg x2 - bare, 5 vs 1 layers "
                                f"({units} units, {tensors // units} tensors each)",
                                [(f"per unit, {pas}", v / units) for pas, v in (("fwd", f),
                                                                                ("bwd", b))])
    d = deepspeed_loop_us()
    rows += _mechanism_rows(base, op, "deepspeed_bf16_grad_loop",
                            "update_hp_grads loop body on 32x32 bf16 -> fp32 tensors",
                            [("per parameter tensor, per micro-batch", d)])
    o = mcore_optimizer_loop_us()
    rows += _mechanism_rows(base, op, "mcore_optimizer",
                            "DistributedOptimizer step after the grad-norm sync: clip's detach "
                            "and copy_group_params on 32x32 fp32 tensors",
                            [("per local parameter tensor, per step", o)])
    return rows


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.machine()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.bench_framework")
    ap.add_argument("--out", default=str(CSV), help="CSV to append the rows to")
    ap.add_argument("--dry-run", action="store_true", help="print only")
    ap.add_argument("--only", default="", help="comma-separated mechanisms to measure, print "
                    "and append (e.g. fsdp2_unit); the probe is measured too for the same-run "
                    "conversion, but not appended (the shipped profiles cite the CSV's probe "
                    "rows)")
    args = ap.parse_args(argv)
    keep = frozenset(m.strip() for m in args.only.split(",") if m.strip())
    rows = measure(keep)
    if keep:
        rows = [r for r in rows if r["mechanism"] in keep]
    w = csv.DictWriter(sys.stdout, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(rows)
    if not args.dry_run:
        out = Path(args.out)
        new = not out.exists()
        with out.open("a", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=COLUMNS)
            if new:
                w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
