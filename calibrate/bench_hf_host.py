"""Host cost of a HuggingFace transformers decoder layer, measured on this CPU
(``calibrate.bench_framework --only hf_decoder_layer``).

The layer is the real ``transformers`` ``LlamaDecoderLayer`` inside a ``LlamaForCausalLM`` of 1
and 5 layers (with labels: the loss is computed) at tiny shapes (hidden 32, 4 query and 2 key/value heads, MLP 64, 32 tokens), in
training mode, with the ``sdpa`` attention implementation (what a GPU run uses unless it
asks for flash-attention-2): RMSNorm written out in eager ops, rotary embeddings applied per
layer (``rotate_half``), grouped-query key/value repeat, SwiGLU as ``act(gate) * up``. Kernels
are nearly free at these shapes, so what is left is host work: the layer's ops and its
module Python. The per-model work (embedding, rotary table, causal mask, final norm, LM head,
loss) is the same for 1 and 5 layers and cancels in the per-layer numbers; what the 1-layer
model costs beyond its layer and the op graph's embedding, head and loss ops is that work's
Python, per forward and backward pass. Also timed: the same models with transformers'
gradient checkpointing, whose extra over the plain model beyond the re-run forward is the
checkpoint wrapper's host work. ``transformers`` is not a dependency of this project:
``pip install transformers`` to run it; without it the case is skipped with a message.

``python -m calibrate.bench_hf_host [--runs 3] [--out CSV]`` compares a transformers GPT-2
block with that Llama layer in the same runs (``gpt2_cases``: ``GPT2LMHeadModel`` at 1 and 5
blocks, n_embd 32, 4 heads, GPT2Config's defaults otherwise, with dropout 0.1, none, and the
hidden-state dropouts only), per layer in eager ops, each run quiet or dropped (``noise``), and
counts the aten ops each layer issues (``layer_aten_ops``) to fit host time against them.
"""
from __future__ import annotations

LAYERS = (1, 5)
HIDDEN, FFN, HEADS, KV_HEADS, TOKENS, VOCAB = 32, 64, 4, 2, 32, 128


def available() -> str:
    """'' when ``transformers`` imports, else why not."""
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"transformers not importable ({type(exc).__name__}: {exc})"
    return ""


def version() -> str:
    import transformers
    return transformers.__version__


def _model(layers: int, recompute: bool):
    """A ``LlamaForCausalLM`` of ``layers`` layers with the config's defaults, so training
    without checkpointing keeps ``use_cache`` on (as a Trainer run does: a key/value cache
    is built every forward); ``recompute``: transformers' gradient checkpointing of every
    layer (``gradient_checkpointing_enable()``, torch's non-reentrant checkpoint by
    default), which turns the cache off."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_attention_heads=HEADS,
                      num_key_value_heads=KV_HEADS, num_hidden_layers=layers,
                      vocab_size=VOCAB, max_position_embeddings=2 * TOKENS)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).train()
    if recompute:
        model.gradient_checkpointing_enable()
    return model


def dense_cases() -> dict:
    """Timing cases for ``bench_host.time_interleaved``: (``block`` | ``recompute``, n)
    for 1 and 5 layers, without and with gradient checkpointing -> (forward, backward of
    its output)."""
    import torch

    from .bench_host import loss_backward
    ids = torch.randint(0, VOCAB, (1, TOKENS))
    out = {}
    for kind in ("block", "recompute"):
        for n in LAYERS:
            model = _model(n, kind == "recompute")

            def fwd(model=model):
                return model(input_ids=ids, labels=ids).loss
            out[(kind, n)] = (fwd, loss_backward(model))
    return out


# ---- GPT-2's block against Llama's layer (python -m calibrate.bench_hf_host) ------------------
# GPT2LMHeadModel at tiny shapes (n_inner: GPT2Config's default 4 x n_embd), train mode, sdpa,
# with GPT2Config's default dropouts (0.1 each), with none, and with the hidden-state dropouts
# only (attn_pdrop 0: on a CPU, sdpa with dropout_p > 0 leaves the fused kernel for its math
# path, ~10 more aten ops, where a GPU's flash / efficient kernel takes the dropout inside).
# On a CPU nn.Dropout is itself unfused (empty_like, bernoulli_, div_, mul: at::dropout fuses
# only CUDA-like inputs, aten/src/ATen/native/Dropout.cpp is_fused_kernel_acceptable).
GPT2_HIDDEN, GPT2_HEADS, GPT2_POSITIONS = 32, 4, 64
GPT2_VARIANTS = {"gpt2": {},
                 "gpt2_nodrop": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
                 "gpt2_residdrop": {"attn_pdrop": 0.0}}
VARIANTS = ("llama", *GPT2_VARIANTS)
RUNS = 3
FOREIGN_MAX = 0.10      # other processes' CPU share of the host (calibrate.bench_comm's bound)
SLOW = 1.5              # a probe this much over the host's recorded median (bench_deepspeed_pipe)
PAUSE_BUDGET_S = 600.0  # total pause while waiting for a quiet host


def _gpt2_model(layers: int, variant: str):
    """A ``GPT2LMHeadModel`` of ``layers`` blocks, GPT2Config's defaults (use_cache on, as
    the Llama model) but for ``GPT2_VARIANTS[variant]``'s dropouts and the tiny shape."""
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_embd=GPT2_HIDDEN, n_head=GPT2_HEADS, n_positions=GPT2_POSITIONS,
                     vocab_size=VOCAB, n_layer=layers, bos_token_id=VOCAB - 1,
                     eos_token_id=VOCAB - 1, **GPT2_VARIANTS[variant])
    cfg._attn_implementation = "sdpa"
    return GPT2LMHeadModel(cfg).train()


def variant_model(variant: str, layers: int):
    """The model of ``variant`` (``VARIANTS``): Llama as ``dense_cases``' plain ``block``."""
    return _model(layers, False) if variant == "llama" else _gpt2_model(layers, variant)


def gpt2_cases(variants=VARIANTS) -> dict:
    """Timing cases ``(variant, n)`` for ``n`` in ``LAYERS`` -> (forward with labels,
    backward of its loss with the gradients then dropped)."""
    import torch

    from .bench_host import loss_backward
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (1, TOKENS))
    out = {}
    for v in variants:
        for n in LAYERS:
            model = variant_model(v, n)
            out[(v, n)] = ((lambda model=model: model(input_ids=ids, labels=ids).loss),
                           loss_backward(model))
    return out


def count_aten(fn):
    """(result of ``fn()``, Counter of the aten overloads it dispatched, by name)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.c = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.c[func.__name__] += 1
            return func(*args, **(kwargs or {}))
    with Count() as mode:
        out = fn()
    return out, mode.c


def non_view(counts) -> int:
    """Ops of ``counts`` that are not views or allocations (``bench_eager._FREE``)."""
    from .bench_eager import _FREE
    return sum(v for k, v in counts.items() if k.split(".")[0] not in _FREE)


def layer_aten_ops(variant: str) -> dict[str, dict[str, float]]:
    """Per layer (``LAYERS`` difference, so the model's own ops cancel), forward and
    backward: {"fwd" | "bwd": {op name: count}} of the timed calls of ``gpt2_cases``."""
    cases = gpt2_cases((variant,))
    (f0, b0), (f1, b1) = [_pass_counts(*cases[(variant, n)]) for n in LAYERS]
    per = LAYERS[1] - LAYERS[0]
    return {p: {k: (hi[k] - lo[k]) / per for k in sorted(set(lo) | set(hi)) if hi[k] != lo[k]}
            for p, lo, hi in (("fwd", f0, f1), ("bwd", b0, b1))}


def _pass_counts(fwd, bwd):
    from collections import Counter
    bwd(fwd())                                          # warm (lazy inits), grads dropped
    loss, f = count_aten(fwd)
    _, b = count_aten(lambda: bwd(loss))
    return Counter(f), Counter(b)


def graph_ops(variant: str) -> tuple[int, int]:
    """The op graph's (forward, backward) ops of one layer of ``variant`` at the bench's
    shapes: Llama's (RMSNorm, rotary, GQA flash attention, SwiGLU: 11 / 15) or GPT-2's as
    the hf framework runs it (eager model code: LayerNorm, flash attention, gelu_new, biases,
    and with resid_pdrop its two hidden-state dropouts: 12 / 16, else 10 / 14)."""
    from dataclasses import replace

    from simulator.cost.host import op_count
    from simulator.workload.ops import LayerShape, backward_ops, layer_ops
    from simulator.workload.presets import get_preset
    from simulator.workload.spec import MLP, TransformerSpec
    if variant == "llama":
        m = replace(get_preset("llama3-8b"), n_layers=1, hidden=HIDDEN, ffn_hidden=FFN,
                    n_heads=HEADS, n_kv_heads=KV_HEADS, vocab=VOCAB, seq_len=TOKENS, head_dim=0)
        sh = LayerShape(micro_batch=1, seq_len=TOKENS, flash=True, dropout=False, loss="eager")
    else:
        drop = GPT2_VARIANTS[variant].get("resid_pdrop", 0.1)
        m = TransformerSpec("bench-gpt2", 1, GPT2_HIDDEN, 4 * GPT2_HIDDEN, GPT2_HEADS,
                            GPT2_HEADS, VOCAB, TOKENS, mlp=MLP.GELU, split_qkv=False,
                            act_fn="gelu_new", hidden_dropout=drop)
        sh = LayerShape(micro_batch=1, seq_len=TOKENS, flash=True, dropout=drop > 0,
                        loss="eager", eager_elementwise=True)
    f = layer_ops(m, sh)
    return sum(map(op_count, f)), sum(map(op_count, backward_ops(f)))


def _host_name() -> str:
    import torch
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
    except (OSError, StopIteration):
        import platform
        cpu = platform.machine()
    return f"{cpu} ({torch.get_num_threads()} thread)"


def _recorded_probe_us(host: str) -> float | None:
    """Median probe forward us of ``host`` in host_mechanisms.csv (None: no rows)."""
    import csv
    import statistics
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "hardware_db" / "data" / "measurements" \
        / "host_mechanisms.csv"
    if not path.exists():
        return None
    ops = [float(r["op_fwd_us_same_run"]) for r in csv.DictReader(path.open())
           if r["host"] == host]
    return statistics.median(ops) if ops else None


def noise(pressure: float, foreign: float, op_us: float, usual_us: float | None) -> str:
    """'' for a quiet run, else why not: CPU pressure over ``bench.PRESSURE_MAX`` (Linux PSI,
    as ``bench_host.time_interleaved`` records it), other processes over ``FOREIGN_MAX`` of
    the host's CPUs (``store.ForeignLoadMeter``, steal included), or a probe over ``SLOW`` x
    this host's recorded median."""
    from .bench import PRESSURE_MAX
    why = [f"CPU pressure {pressure:.0%}"] * (pressure > PRESSURE_MAX) \
        + [f"foreign load {foreign:.0%}"] * (foreign > FOREIGN_MAX)
    if usual_us and op_us > SLOW * usual_us:
        why.append(f"probe {op_us:.1f} us > {SLOW:g} x {usual_us:.1f}")
    return "; ".join(why)


def quiet_run(cases: dict, usual_us: float | None, wait_s: float = PAUSE_BUDGET_S
              ) -> dict | None:
    """``cases`` timed interleaved with the host probe (10th percentile of
    ``bench_host.time_interleaved``'s trials, us), re-timed after a backoff pause while the
    run was noisy (``noise``), within ``wait_s`` of pauses: {"t", "op" (probe us per op-graph
    op, fwd / bwd), "pressure", "foreign"}; None if the host never went quiet."""
    import sys
    import time

    from .bench import backoff_s
    from .bench_host import HOST_LAYERS, _decoder_fns
    from .bench_host import graph_ops as probe_ops
    from .bench_host import time_interleaved
    from .store import ForeignLoadMeter
    cases = {**cases, **{("probe", n): _decoder_fns(n)[:2] for n in HOST_LAYERS}}
    (f0, b0), (f1, b1) = (probe_ops(n) for n in HOST_LAYERS)
    lo, hi = (("probe", n) for n in HOST_LAYERS)
    waited, attempt = 0.0, 0
    while True:
        meter = ForeignLoadMeter().start()
        r = time_interleaved(cases)
        foreign = meter.foreign(meter.stop()[0])
        pressure = next(iter(r.values()))[0].pressure
        t = {k: (f.p10_s * 1e6, b.p10_s * 1e6) for k, (f, b, _, _) in r.items()}
        op = {"fwd": (t[hi][0] - t[lo][0]) / (f1 - f0), "bwd": (t[hi][1] - t[lo][1]) / (b1 - b0)}
        why = noise(pressure, foreign, op["fwd"], usual_us)
        if not why:
            return {"t": t, "op": op, "pressure": pressure, "foreign": foreign}
        if waited >= wait_s:
            print(f"host never quiet ({why}): run dropped", file=sys.stderr)
            return None
        pause = backoff_s(attempt)
        print(f"noisy run ({why}): re-timing after {pause:g} s", file=sys.stderr)
        time.sleep(pause)
        waited, attempt = waited + pause, attempt + 1


def per_layer_ops(res: dict) -> dict[tuple[str, str], float]:
    """{(variant, "fwd" | "bwd"): a layer's host time in eager ops (us / the same run's
    probe forward us per op)} of a ``quiet_run`` result."""
    lo, hi = LAYERS
    t, op = res["t"], res["op"]["fwd"]
    return {(v, p): (t[(v, hi)][i] - t[(v, lo)][i]) / (hi - lo) / op
            for v in VARIANTS if (v, lo) in t for i, p in enumerate(("fwd", "bwd"))}


# every variant's rows belong to the GPT-2 mechanism, the variant named in the metric, as
# host_mechanisms.csv lines 829-876 hold them (the Llama rows there are this run's reference)
MECHANISM = "hf_gpt2_layer"
DESCRIBE = {"llama": "LlamaForCausalLM (hidden 32, 4/2 heads, MLP 64)",
            "gpt2": "GPT2LMHeadModel (n_embd 32, 4 heads, n_inner 128, gelu_new), GPT2Config's "
                    "dropouts 0.1 (resid, embd, attn: sdpa's math path on a CPU)",
            "gpt2_nodrop": "GPT2LMHeadModel (n_embd 32, 4 heads, n_inner 128, gelu_new), "
                           "resid_pdrop = embd_pdrop = attn_pdrop = 0",
            "gpt2_residdrop": "GPT2LMHeadModel (n_embd 32, 4 heads, n_inner 128, gelu_new), "
                              "resid_pdrop = embd_pdrop = 0.1, attn_pdrop = 0 (fused sdpa)"}


def run_rows(res: dict, counts: dict, base: dict) -> list[dict]:
    """host_mechanisms.csv rows of one ``quiet_run``: per variant, a layer's host time forward
    and backward, whole and beyond its op graph's ops (``graph_ops``) at the probe's cost."""
    import transformers
    op = res["op"]
    per = per_layer_ops(res)
    rows = []
    for v in VARIANTS:
        if (v, "fwd") not in per:
            continue
        graph = dict(zip(("fwd", "bwd"), graph_ops(v)))
        aten = "; ".join(f"{p} {sum(counts[v][p].values()):g} aten ops, "
                         f"{non_view(counts[v][p]):g} not views" for p in ("fwd", "bwd"))
        how = (f"transformers {transformers.__version__} {DESCRIBE[v]}, with labels, use_cache "
               f"as the config (on), sdpa, {TOKENS} tokens, {LAYERS[0]} vs {LAYERS[1]} layers, "
               f"train mode, timed interleaved with the host probe (bwd op {op['bwd']:.2f} us; "
               f"CPU pressure {res['pressure']:.1%}, foreign load {res['foreign']:.1%}); glue = "
               f"layer - op graph ({graph['fwd']} fwd ops at the probe's fwd cost / "
               f"{graph['bwd']} bwd at its bwd cost); per layer {aten}")
        for p in ("fwd", "bwd"):
            us = per[(v, p)] * op["fwd"]
            for metric, val in ((f"per layer, {p} (whole layer)", us),
                                (f"per layer, {p}, glue", us - graph[p] * op[p])):
                rows.append({**base, "mechanism": MECHANISM, "metric": f"{v}: {metric}",
                             "value_us": round(val, 2), "eager_ops": round(val / op["fwd"], 3),
                             "op_fwd_us_same_run": round(op["fwd"], 2), "method": how})
    return rows


def line_fit(xs, ys) -> tuple[float, float, list[float]]:
    """Least-squares ``y = a + b x``: (a, b, residuals y - fit)."""
    import numpy as np
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b), [float(y - a - b * x) for x, y in zip(xs, ys)]


def summary(per_runs: list[dict], counts: dict) -> str:
    """Per variant and pass: the median eager ops per layer over the runs with their range,
    the aten ops, the ratio to Llama's (per run, then median), and lines host ~ a + b x
    aten ops (non-view, and all) fitted forward, backward and both, with residuals."""
    import statistics
    lines, pts = [], []
    for v in VARIANTS:
        for p in ("fwd", "bwd"):
            xs = [r[(v, p)] for r in per_runs]
            ratio = [r[(v, p)] / r[("llama", p)] for r in per_runs]
            nv, every = non_view(counts[v][p]), sum(counts[v][p].values())
            pts.append((v, p, nv, statistics.median(xs), every))
            lines.append(f"{v:15} {p}  {statistics.median(xs):6.2f} eager ops "
                         f"[{min(xs):.2f}-{max(xs):.2f}]  aten {every:g} (non-view {nv:g})"
                         f"  / llama {statistics.median(ratio):.3f} "
                         f"[{min(ratio):.3f}-{max(ratio):.3f}]")
    return "\n".join(lines + _fit_lines(pts))


def _fit_lines(pts: list[tuple]) -> list[str]:
    """``summary``'s fits over ``pts`` (variant, pass, non-view ops, eager ops, all ops), and
    Llama's eager ops per non-view op carried to the other variants."""
    lines = []
    for x, ops in ((2, "non-view"), (4, "all")):
        for name, keep in (("fwd", ("fwd",)), ("bwd", ("bwd",)), ("fwd+bwd", ("fwd", "bwd"))):
            sel = [q for q in pts if q[1] in keep]
            a, b, res = line_fit([q[x] for q in sel], [q[3] for q in sel])
            rms = (sum(e * e for e in res) / len(res)) ** 0.5
            lines.append(f"fit {name}: {a:.2f} + {b:.3f} x {ops} aten ops (rms {rms:.2f}); "
                         "residuals " + ", ".join(f"{q[0]} {q[1]} {e:+.2f}"
                                                  for q, e in zip(sel, res)))
    for p in ("fwd", "bwd"):
        k = next(q[3] / q[2] for q in pts if q[:2] == ("llama", p))
        lines.append(f"Llama's eager ops per non-view op, {p}: {k:.3f}; carried to GPT-2: "
                     + ", ".join(f"{q[0]} {k * q[2]:.2f} (measured {q[3]:.2f})"
                                 for q in pts if q[1] == p and q[0] != "llama"))
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m calibrate.bench_hf_host [--runs 3] [--out CSV]``: GPT-2's block against
    Llama's layer, each run quiet (``quiet_run``) or dropped; rows printed (and appended to
    ``--out``: never the repository's CSV unless named), then ``summary``."""
    import argparse
    import csv
    import datetime as dt
    import sys

    import torch
    ap = argparse.ArgumentParser(prog="python -m calibrate.bench_hf_host")
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--out", default="", help="CSV to append the rows to")
    ap.add_argument("--wait", type=float, default=PAUSE_BUDGET_S,
                    help="seconds of pauses, per run, while waiting for a quiet host")
    args = ap.parse_args(argv)
    why = available()
    if why:
        print(f"skipped: {why}", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    counts = {v: layer_aten_ops(v) for v in VARIANTS}
    cases, host = gpt2_cases(), _host_name()
    base = {"host": host, "torch": torch.__version__, "date": dt.date.today().isoformat()}
    usual = _recorded_probe_us(host)
    rows, per_runs = [], []
    for _ in range(args.runs):
        res = quiet_run(cases, usual, args.wait)
        if res is None:
            break
        per_runs.append(per_layer_ops(res))
        rows += run_rows(res, counts, base)
    cols = ["mechanism", "metric", "value_us", "op_fwd_us_same_run", "eager_ops", "host",
            "torch", "date", "method"]
    csv.DictWriter(sys.stdout, fieldnames=cols).writerows(rows)
    if args.out and rows:
        with open(args.out, "a", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols)
            if fh.tell() == 0:
                w.writeheader()
            w.writerows(rows)
    for v in VARIANTS:
        for p in ("fwd", "bwd"):
            print(f"# {v} {p}: {dict(counts[v][p])}")
    if per_runs:
        print(summary(per_runs, counts))
    return 0 if len(per_runs) == args.runs else 2


if __name__ == "__main__":
    raise SystemExit(main())
