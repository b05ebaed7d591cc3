"""Sub-commands around the Python workflow: ``describe`` (a model's architecture, parameter
counts and per-token FLOPs) and ``ledger`` (the analyzer's attempts, each against the one
before it)."""
from __future__ import annotations

import argparse
from typing import Any

from ..api.ledger import ExperimentLedger
from ..api.transformer_flow import model_flops_per_token
from ..boundary import json_out
from ..errors import InfeasiblePlanError, InvalidInputError
from ..planning.capacity import HardwareChoice
from ..planning.window import (
    SCALING_LAWS,
    WindowOverheads,
    WindowSweep,
    size_ladder,
    sweep_sizes,
)
from ..search.driver import SearchOptions
from ..workload import resolve_model
from ..workload.spec import TransformerSpec
from .registry import command


def _attention(m: TransformerSpec) -> str:
    if m.mla is not None:
        a = m.mla
        q = f"q_lora {a.q_lora_rank}" if a.q_lora_rank else "direct q"
        return (f"MLA, {m.n_heads} heads: {q}, kv_lora {a.kv_lora_rank}, "
                f"qk {a.qk_nope_head_dim}+{a.qk_rope_head_dim} (rope), v {a.v_head_dim}")
    kind = "MHA" if m.n_kv_heads == m.n_heads else ("MQA" if m.n_kv_heads == 1 else "GQA")
    return f"{kind}, {m.n_heads} heads / {m.n_kv_heads} KV heads of {m.head_dim}"


def _local(m: TransformerSpec) -> str:
    n_local = sum(map(m.is_local_layer, range(m.n_layers)))
    if not n_local:
        return "global attention in every layer"
    glob = "no global layers" if m.global_every == 0 else f"every {m.global_every}. layer global"
    return f"{n_local}/{m.n_layers} layers local (sliding window {m.window}), {glob}"


def _ffn(m: TransformerSpec) -> str:
    if m.moe is None:
        return f"dense {m.mlp.value} {m.ffn_hidden}"
    e = m.moe
    shared = f" + {e.shared_experts} shared" if e.shared_experts else ""
    return (f"MoE in {m.n_moe_layers()}/{m.n_layers} layers: {e.experts} experts{shared} of "
            f"{e.expert_ffn_hidden}, top-{e.top_k}; other layers dense {m.mlp.value} {m.ffn_hidden}")


def describe_model(m: TransformerSpec) -> dict[str, Any]:
    per_token = model_flops_per_token(m)
    return {
        "model": m.name, "n_layers": m.n_layers, "hidden": m.hidden, "vocab": m.vocab,
        "seq_len": m.seq_len, "attention": _attention(m), "local_attention": _local(m),
        "ffn": _ffn(m), "norm": m.norm.value, "position": m.position.value,
        "linear_bias": m.linear_bias, "qkv_bias": m.qkv_bias,
        "tied_embeddings": m.tied_embeddings,
        "logit_softcaps": [m.attn_logit_softcap, m.final_logit_softcap],
        "params_total": m.total_params(), "params_active": m.active_params(),
        "params_embedding": m.embedding_params(),
        "flops_per_token": per_token, "forward_flops_per_token": per_token / 3.0,
        "source": m.source,
    }


def format_description(d: dict[str, Any]) -> str:
    b = lambda x: f"{x / 1e9:,.3f} B"
    caps = d["logit_softcaps"]
    lines = [
        f"{d['model']}: {d['n_layers']} layers, hidden {d['hidden']}, vocab {d['vocab']}, "
        f"seq_len {d['seq_len']}",
        f"  attention        {d['attention']}",
        f"                   {d['local_attention']}",
        f"  feed-forward     {d['ffn']}",
        f"  norm / position  {d['norm']} / {d['position']}; linear bias {d['linear_bias']}, "
        f"qkv bias {d['qkv_bias']}, tied embeddings {d['tied_embeddings']}",
    ]
    if any(caps):
        lines.append(f"  logit soft caps  attention {caps[0]:g}, final {caps[1]:g}")
    lines += [
        f"  params_total     {d['params_total']:>18,}  ({b(d['params_total'])})",
        f"  params_active    {d['params_active']:>18,}  ({b(d['params_active'])})",
        f"  params_embedding {d['params_embedding']:>18,}  ({b(d['params_embedding'])})",
        f"  FLOPs per token  {d['flops_per_token']:.4g} (forward + backward, model FLOPs at "
        f"seq_len {d['seq_len']}; forward {d['forward_flops_per_token']:.4g})",
        f"  source           {d['source']}",
    ]
    return "\n".join(lines)


@command("describe", "A model's architecture, parameter counts and per-token FLOPs.")
def _describe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="preset key or HuggingFace config.json")
    p.add_argument("--seq-len", type=int, help="override the model's sequence length")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_describe)


def run_describe(a: argparse.Namespace) -> int:
    d = describe_model(resolve_model(a.model, a.seq_len))
    print(json_out.dumps(d, indent=2, sort_keys=True) if a.json else format_description(d))
    return 0


@command("ledger", "The analyzer's ledger: each attempt against the previous one.")
def _ledger_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", nargs="?", default="complexity-ledger",
                   help="ledger directory (ComplexityAnalyzer(ledger=...); default complexity-ledger)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_ledger)


def run_ledger(a: argparse.Namespace) -> int:
    led = ExperimentLedger(a.directory)
    rows = led.read()
    if not rows:
        raise InvalidInputError("directory", a.directory, "a ledger directory with part-*.parquet files")
    cmp = led.compare()
    if a.json:
        print(json_out.dumps({"entries": [{k: r[k] for k in ("entry_id", "method", "model", "gpu",
                                                         "n_gpus", "step_time_s")} for r in rows],
                          "comparisons": [c.to_dict() for c in cmp]},
                         indent=2, sort_keys=True, default=str))
        return 0
    first = rows[0]
    print(f"{len(rows)} attempts in {a.directory}; first: {first['method']} of {first['model']} "
          f"on {first['n_gpus']}x{first['gpu']}, step {first['step_time_s']:.4g} s")
    for i, c in enumerate(cmp, start=2):
        print(f"{i:>3}. {c.line()}")
    singles = [c for c in cmp if c.single_change and "step_time_s" in c.moved]
    if singles:
        print("single changes that moved the step time:")
        for c in sorted(singles, key=lambda c: c.moved["step_time_s"][2]):
            print(f"     {c.single_change}: {c.changed[c.single_change][0]!r} -> "
                  f"{c.changed[c.single_change][1]!r}  step time {c.moved['step_time_s'][2]:+.1f}%")
    return 0


# ---- plan --window-min without a model: which size trains best in the window ----------------
def add_window_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("short window (--window-min): model-size sweep")
    g.add_argument("--models", help="comma-separated presets / config.json to compare "
                   "(default without --model: a ladder of 7 Llama-style sizes, 0.16B-13B)")
    g.add_argument("--window-objective", default="loss", choices=["loss", "tokens"],
                   help="lowest predicted loss under --scaling-law (default), or most tokens")
    g.add_argument("--scaling-law", default="chinchilla", choices=sorted(SCALING_LAWS))
    g.add_argument("--startup-s", type=float, default=WindowOverheads.startup_s,
                   help="assumed launch + init time lost from the window (default 120 s)")
    g.add_argument("--checkpoint-gbps", type=float,
                   default=WindowOverheads.checkpoint_write_gbytes_per_s,
                   help="assumed aggregate checkpoint write rate, GB/s (default 10)")
    g.add_argument("--checkpoints", type=int, default=1, help="checkpoints saved in the window")


def run_window_sweep(a: argparse.Namespace, catalog, opts: SearchOptions,
                     names: list[str] | None, batches: list[int] | None) -> int:
    """``names``: models to compare (None: the size ladder); ``batches``: global batches
    (None: 64..512 sequences)."""
    if a.gpus is None:
        raise InvalidInputError("window-min", a.window_min, "used together with --gpus N")
    models = ([resolve_model(m, a.seq_len) for m in names] if names
              else size_ladder(a.seq_len or 2048))
    batches = batches or [64, 128, 256, 512]
    if a.startup_s < 0 or a.checkpoint_gbps <= 0 or a.checkpoints < 0:
        raise InvalidInputError("startup-s/checkpoint-gbps/checkpoints",
                                (a.startup_s, a.checkpoint_gbps, a.checkpoints),
                                "startup >= 0, write rate > 0, checkpoints >= 0")
    over = WindowOverheads(a.startup_s, a.checkpoints, checkpoint_write_gbytes_per_s=a.checkpoint_gbps)
    choice = HardwareChoice(a.gpu, a.gpus)
    catalog.cluster(choice)                      # a bad GPU key fails here, in one line
    sw = sweep_sizes(models, a.window_min * 60.0, choice, batches, catalog, opts,
                     SCALING_LAWS[a.scaling_law], over, a.window_objective)
    if a.json:
        print(json_out.dumps(sw.to_dict(), indent=2, sort_keys=True, default=str))
    else:
        print(format_window_sweep(sw))
    if sw.best is None:
        raise InfeasiblePlanError("window", "no model trains a whole step in the window", {})
    return 0


def _plan_text(p: dict[str, Any]) -> str:
    s = f"tp{p['tp']} pp{p['pp']} dp{p['dp']}"
    s += f" cp{p['cp']}" if p["cp"] > 1 else ""
    s += f" zero{p['zero_stage']}" if p["zero_stage"] else ""
    rc = f"{p['recompute']}:{p['recompute_layers']}" if p.get("recompute_layers") else p["recompute"]
    return s + f" mb{p['micro_batch']} {rc} {p['precision']}"


def format_window_sweep(sw: WindowSweep) -> str:
    o = sw.overheads
    lines = [f"{sw.window_s / 60:g}-minute window on {sw.choice.label}: which model size, batch "
             f"and strategy ({'lowest predicted loss' if sw.objective == 'loss' else 'most tokens'})",
             f"{'model':<14}{'params':>9}{'ckpt s':>8}{'batch':>7}{'steps':>7}{'tokens':>9}"
             f"{'tok/param':>10}{'loss':>7}  plan"]
    for r in sw.rows:
        d = r.to_dict()
        if r.answer is None or not r.answer.tokens:
            lines.append(f"{r.model.name:<14}{d['params'] / 1e9:>8.2f}B{r.checkpoint_s:>8.0f}  "
                         f"{r.note or 'no whole step fits in the window'}")
            continue
        p = d["plan"]
        lines.append(f"{r.model.name:<14}{d['params'] / 1e9:>8.2f}B{r.checkpoint_s:>8.0f}"
                     f"{p['global_batch']:>7}{d['steps']:>7}{d['tokens'] / 1e9:>8.2f}B"
                     f"{d['tokens_per_param']:>10.2f}{r.loss:>7.3f}  {_plan_text(p)}")
    b = sw.best
    if b is not None:
        d = b.to_dict()
        lines.append(f"answer: {b.model.name} ({d['params'] / 1e9:.2f}B params), global batch "
                     f"{d['plan']['global_batch']}, {_plan_text(d['plan'])}: {d['steps']} steps, "
                     f"{d['tokens'] / 1e9:.2f}B tokens, predicted loss {b.loss:.3f}")
    lines += [f"scaling law: L = {sw.law.E} + {sw.law.A}/N^{sw.law.alpha} + {sw.law.B}/D^{sw.law.beta} "
              f"({sw.law.source}); N counts embeddings; no batch-size term",
              f"assumed overheads: startup {o.startup_s:g} s; {o.checkpoints} checkpoint(s) of "
              f"{o.checkpoint_bytes_per_param:g} B/param at {o.checkpoint_write_gbytes_per_s:g} GB/s "
              "aggregate; training time = window - startup - checkpoint"]
    return "\n".join(lines)
