"""The bad-input corpus of ``test_bad_input.py``: every case is (category, id, what to run,
the field its one-line error must name).

Categories:

* ``flag``: every numeric flag of every command, with values outside its range from
  ``simulator.cli.checks.FLAG_BOUNDS`` (one below, one above), non-numbers, fractions for
  integers, and ``inf`` / ``nan`` / ``-inf``;
* ``output``: every flag that writes a file or directory, with a path that cannot be
  written (missing directory, a directory where a file goes, a file where a directory
  goes, an empty path);
* ``hf``: HuggingFace ``config.json`` keys with wrong types, out-of-range sizes, and whole
  files that are not configs (the issue's ``num_key_value_heads: [8]``, ``head_dim: -128``,
  ``head_dim: 1e9``, a 200k-deep JSON, ...);
* ``runs_file``: runs CSVs the whole command must refuse (semicolon-separated, a required
  column missing, empty, not UTF-8);
* ``profile``: calibration profiles with an out-of-range coefficient (efficiency 0 or above
  1, negative latency, ``step_overhead_s: -100``, NaN), of another GPU, of another schema;
* ``plan``: plans the hardware or the model cannot run (FP8 or ``flash3`` on an A100, tp
  not dividing the heads, a global batch the event engine would play for minutes);
* ``row`` (checked separately, in one ``predict`` run): runs-CSV rows with one bad cell,
  each of which must come back ``invalid: <column>: ...`` while the good rows are
  predicted.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from simulator.cli.checks import FLAG_BOUNDS, OUTPUT_PATHS
from simulator.cli.main import build_parser

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
RUNS = str(REPO / "validation" / "published_runs.csv")
ZOO = str(REPO / "examples" / "module_zoo.py") + ":mlp"
MODEL_ARGS = ["--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "8"]

# the smallest argv each command parses (the bad flag is appended to it)
BASE_ARGV: dict[str, list[str]] = {
    "collective": ["--op", "all_reduce", "--size", "1M", "--gpus", "8", "--gpu", "h100-sxm"],
    "simulate": MODEL_ARGS, "predict": ["--runs", RUNS], "report": ["--runs", RUNS],
    "list": ["gpus"], "analyze": [ZOO], "simulate-module": [ZOO], "compression-whatif": [ZOO],
    "precision-whatif": [ZOO], "validate-module": [ZOO, "--profile", "p.json"],
    "calibrate-loaded": ["--out", "p.json"], "describe": ["--model", "llama2-7b"],
    "ledger": ["ledger-dir"], "search": MODEL_ARGS, "scaling": MODEL_ARGS, "whatif": MODEL_ARGS,
    "bottleneck": MODEL_ARGS, "plan": ["--gpu", "h100-sxm", "--model", "llama2-7b",
                                       "--tokens", "1B"],
    "compare": ["--model", "llama2-7b", "--tokens", "1B", "--gpu-list", "h100-sxm",
                "--gpus-list", "8"],
    "calibrate": [], "validate-run": ["--model", "tiny-2l-128", "--profile", "p.json"],
    "validate-memory": [], "doctor": ["--trace", "t.json"],
}


@dataclass
class Case:
    category: str
    id: str
    argv: list[str] = field(default_factory=list)
    field: str = ""                  # text the error line must contain
    write: Callable[[Path], list[str]] | None = None   # builds files, returns extra argv
    outputs: tuple[str, ...] = ()    # paths (relative to tmp) that must not exist after


def subparsers() -> dict[str, argparse.ArgumentParser]:
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e18 else repr(float(x))


def _bad_values(kind: type, lo: float, hi: float, lo_open: bool) -> list[str]:
    vals = ["abc", "inf", "nan", "-inf"] if kind is float else ["abc", "1.5", "inf"]
    below = lo if lo_open else lo - 1
    vals.append(_num(below))
    if math.isfinite(hi):
        vals.append(_num(hi + 1 if kind is int else hi * 10 + 1))
    return vals


def flag_cases() -> list[Case]:
    out = []
    for cmd, parser in subparsers().items():
        base = BASE_ARGV.get(cmd)
        if base is None:
            continue
        for a in parser._actions:
            if a.type not in (int, float) or not a.option_strings:
                continue
            lo, hi, lo_open = FLAG_BOUNDS[a.dest]
            flag = a.option_strings[0]
            for v in _bad_values(a.type, lo, hi, lo_open):
                # argparse refuses these itself (naming the flag): not a number for its
                # type, or ``-inf``, which it reads as an option
                parse_error = v in ("abc", "-inf") or (a.type is int and v in ("1.5", "inf"))
                out.append(Case("flag", f"{cmd} {flag} {v}", [cmd, *base, flag, v],
                                flag if parse_error else a.dest))
    return out


def _output_values(directory: bool) -> list[tuple[str, str]]:
    """(id, path relative to tmp; ``{tmp}`` is replaced) of unwritable paths."""
    vals = [("empty", ""), ("parent-is-a-file", "{tmp}/a-file/x.out")]
    if directory:
        vals.append(("a-file", "{tmp}/a-file"))
    else:
        vals += [("missing-dir", "{tmp}/no-such-dir/x.png"), ("a-directory", "{tmp}")]
    return vals


def output_cases() -> list[Case]:
    out = []
    dir_outs = {("calibrate", "out")}
    for cmd, parser in subparsers().items():
        base = BASE_ARGV.get(cmd)
        if base is None:
            continue
        for a in parser._actions:
            if a.dest not in OUTPUT_PATHS or not a.option_strings:
                continue
            if a.dest == "trace" and cmd != "simulate":
                continue
            directory = OUTPUT_PATHS[a.dest] or (cmd, a.dest) in dir_outs
            for vid, v in _output_values(directory):
                argv = [cmd, *base]
                if a.option_strings[0] in argv:      # an output in the base argv
                    i = argv.index(a.option_strings[0])
                    argv = argv[:i] + argv[i + 2:]
                out.append(Case("output", f"{cmd} {a.option_strings[0]} {vid}",
                                argv + [a.option_strings[0], v], a.dest,
                                outputs=("no-such-dir",)))
    return out


# ---- HuggingFace configs ---------------------------------------------------------------------
HF_BASE = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 512,
           "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1024,
           "vocab_size": 32000, "max_position_embeddings": 2048}
DEEPSEEK = {"model_type": "deepseek_v3", "num_hidden_layers": 4, "hidden_size": 512,
            "num_attention_heads": 8, "intermediate_size": 1024, "vocab_size": 32000,
            "max_position_embeddings": 2048, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 256}
_HF_INT_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "vocab_size",
                "max_position_embeddings", "head_dim")
_HF_BAD_INTS = [("neg", -128), ("zero", 0), ("frac", 1.5), ("str", "8"), ("bool", True),
                ("list", [8]), ("huge", 10**12), ("dict", {"a": 1})]


def _json_writer(name: str, text: str) -> Callable[[Path], list[str]]:
    def write(tmp: Path) -> list[str]:
        p = tmp / name
        p.write_text(text)
        return ["--model", str(p)]
    return write


def hf_cases() -> list[Case]:
    out = []
    for key in _HF_INT_KEYS:
        for vid, v in _HF_BAD_INTS:
            cfg = {**HF_BASE, key: v}
            out.append(Case("hf", f"{key}={vid}", ["describe"], f"config.{key}",
                            _json_writer("config.json", json.dumps(cfg))))
    for key in ("v_head_dim", "kv_lora_rank", "qk_rope_head_dim", "num_experts_per_tok",
                "moe_intermediate_size", "n_routed_experts"):
        for vid, v in (("neg", -1), ("frac", 2.5), ("str", "x")):
            out.append(Case("hf", f"deepseek {key}={vid}", ["describe"], f"config.{key}",
                            _json_writer("config.json", json.dumps({**DEEPSEEK, key: v}))))
    for key, v in (("tie_word_embeddings", "no"), ("tie_word_embeddings", 1),
                   ("mlp_only_layers", 5), ("mlp_only_layers", ["a"]),
                   ("mlp_only_layers", [-1]), ("rope_scaling", 3), ("text_config", [1]),
                   ("final_logit_softcapping", -1.0), ("hidden_act", 7),
                   ("model_type", "bert"), ("model_type", 5), ("sliding_window", -5),
                   ("attention_bias", "yes")):
        out.append(Case("hf", f"{key}={v!r}", ["describe"], f"config.{key}",
                        _json_writer("config.json", json.dumps({**HF_BASE, key: v}))))
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"):
        cfg = {k: v for k, v in HF_BASE.items() if k != key}
        out.append(Case("hf", f"missing {key}", ["describe"], f"config.{key}",
                        _json_writer("config.json", json.dumps(cfg))))
    deep = '{"model_type": "llama", "x": ' + "[" * 200_000 + "]" * 200_000 + "}"
    for vid, text in (("200k-deep", deep), ("not-json", "{model_type: llama"),
                      ("top-level-list", "[1, 2]"), ("empty", ""), ("nan", '{"hidden_size": NaN}'),
                      ("truncated", json.dumps(HF_BASE)[:-10])):
        out.append(Case("hf", f"file {vid}", ["describe"], "config_path",
                        _json_writer("config.json", text)))
    out.append(Case("hf", "missing config file", ["describe", "--model", "/no/such/config.json"],
                    "config_path"))
    out.append(Case("hf", "1e6 layers (simulate)", ["simulate", "--gpu", "h100-sxm", "--gpus", "8",
                                                    "--global-batch", "8"],
                    "config.num_hidden_layers",
                    _json_writer("c.json", json.dumps({**HF_BASE, "num_hidden_layers": 10**6}))))
    return out


# ---- runs CSV (whole file) ---------------------------------------------------------------------
def _runs_writer(text: str | bytes) -> Callable[[Path], list[str]]:
    def write(tmp: Path) -> list[str]:
        p = tmp / "runs.csv"
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        return ["--runs", str(p), "--out", str(tmp / "out.csv")]
    return write


def runs_file_cases() -> list[Case]:
    lines = Path(RUNS).read_text().splitlines()
    header = lines[0].split(",")
    out = [Case("runs_file", "semicolon", ["predict"], "runs",
                _runs_writer("\n".join(l.replace(",", ";") for l in lines[:3]) + "\n"),
                outputs=("out.csv",)),
           Case("runs_file", "tab", ["predict"], "runs",
                _runs_writer("\n".join(l.replace(",", "\t") for l in lines[:3]) + "\n"),
                outputs=("out.csv",)),
           Case("runs_file", "empty", ["predict"], "runs", _runs_writer(""), outputs=("out.csv",)),
           Case("runs_file", "header only", ["predict"], "runs", _runs_writer(lines[0] + "\n"),
                outputs=("out.csv",)),
           Case("runs_file", "not utf-8", ["predict"], "runs",
                _runs_writer(lines[0].encode() + b"\n\xff\xfe\x00bad\n"), outputs=("out.csv",)),
           Case("runs_file", "missing runs file", ["predict", "--runs", "/no/such/runs.csv"], "runs"),
           Case("runs_file", "report semicolon", ["report"], "runs",
                lambda tmp: _runs_writer("\n".join(l.replace(",", ";") for l in lines[:3]))(tmp)[:2]
                + ["--out-dir", str(tmp / "rep")], outputs=("rep",))]
    for cols in (["gpu"], ["n_gpus"], ["tp"], ["pp"], ["global_batch"], ["model", "n_layers"],
                 ["model", "hidden"]):
        drop = {header.index(c) for c in cols}
        text = "\n".join(",".join(c for j, c in enumerate(_split(l)) if j not in drop)
                         for l in lines[:3]) + "\n"
        out.append(Case("runs_file", f"no {'/'.join(cols)} column", ["predict"], cols[-1],
                        _runs_writer(text), outputs=("out.csv",)))
    return out


def _split(line: str) -> list[str]:
    import csv
    return [('"' + c.replace('"', '""') + '"') if ("," in c or '"' in c) else c
            for c in next(csv.reader([line]))]


# ---- profiles ----------------------------------------------------------------------------------
def _coefficients(obj, path="profile"):
    if isinstance(obj, dict):
        if "value" in obj and "unit" in obj:
            yield path, obj
            return
        for k, v in obj.items():
            yield from _coefficients(v, f"{path}.{k}")


_BAD_BY_UNIT = {"fraction": [0, -0.5, 1.5], "us": [-1], "s": [-100], "elements": [-1],
                "tokens": [-1], "multiplier": [0, -2], "ratio": [0]}


def _profile_writer(mutate: Callable[[dict], None], raw: Callable[[str], str] | None = None,
                    gpu: str = "h100-sxm") -> Callable[[Path], list[str]]:
    def write(tmp: Path) -> list[str]:
        import hardware_db
        d = hardware_db.load_profile(gpu).to_dict()
        mutate(d)
        text = json.dumps(d)
        p = tmp / "profile.json"
        p.write_text(raw(text) if raw else text)
        return ["--profile", str(p)]
    return write


def _set_path(path: str, value):
    keys = path.split(".")[1:]
    def mutate(d):
        for k in keys:
            d = d[k]
        d["value"] = value
    return mutate


def profile_cases() -> list[Case]:
    import hardware_db
    d = hardware_db.load_profile("h100-sxm").to_dict()
    sim = ["simulate", *MODEL_ARGS, "--no-interval"]
    out = []
    seen_units: dict[str, int] = {}
    for path, c in _coefficients(d):
        n = seen_units.get(c["unit"], 0)
        seen_units[c["unit"]] = n + 1
        if n % 6:                          # every 6th coefficient of each unit
            continue
        for v in _BAD_BY_UNIT.get(c["unit"], []) + ["0.5"]:
            out.append(Case("profile", f"{path}={v!r}", list(sim), path,
                            _profile_writer(_set_path(path, v)), outputs=()))
    def tile(d):
        d["gemm"]["tile_m"] = -1
    def nan(d):
        d["gemm"]["eff_max"]["bf16"]["value"] = 0.5
    def version(d):
        d["schema_version"] = 999
    def device(d):
        d["device_key"] = "a100-sxm-80gb"
    out += [Case("profile", "tile_m=-1", list(sim), "profile.gemm.tile_m", _profile_writer(tile)),
            Case("profile", "NaN", list(sim), "profile",
                 _profile_writer(nan, lambda t: t.replace('"value": 0.5', '"value": NaN', 1))),
            Case("profile", "schema 999", list(sim), "schema_version", _profile_writer(version)),
            Case("profile", "A100 profile for an H100", list(sim), "profile",
                 _profile_writer(device)),
            Case("profile", "not json", list(sim), "profile",
                 _profile_writer(lambda d: None, lambda t: t[:100])),
            Case("profile", "step_overhead_s=-100", list(sim), "profile.step_overhead_s",
                 _profile_writer(_set_path("profile.step_overhead_s", -100)))]
    return out


# ---- plans the hardware or the model cannot run ----------------------------------------------
def plan_cases() -> list[Case]:
    a100 = ["simulate", "--model", "llama2-7b", "--gpu", "a100-sxm-80gb", "--gpus", "8",
            "--global-batch", "8", "--no-interval"]
    h100 = ["simulate", *MODEL_ARGS, "--no-interval"]
    return [Case("plan", "fp8 on A100", a100 + ["--precision", "fp8"], "precision"),
            Case("plan", "flash3 on A100", a100 + ["--attention", "flash3"], "attention"),
            Case("plan", "tp 3", h100 + ["--tp", "3"], "tp"),
            Case("plan", "tp 16 on 8", h100 + ["--tp", "16"], "tp"),
            Case("plan", "pp 64 > layers", ["simulate", "--model", "llama2-7b", "--gpu",
                                            "h100-sxm", "--gpus", "64", "--pp", "64",
                                            "--global-batch", "64"], "pp"),
            Case("plan", "ep on dense", h100 + ["--ep", "2"], "ep"),
            Case("plan", "global batch 1e6 (event engine)",
                 ["simulate", "--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "8",
                  "--global-batch", "1000000", "--no-interval"], "global_batch"),
            Case("plan", "gpus 1e8", ["simulate", "--model", "llama2-7b", "--gpu", "h100-sxm",
                                      "--gpus", "100000000", "--global-batch", "8"], "gpus"),
            Case("plan", "nics-per-node 1e9", h100 + ["--nics-per-node", "1000000000"],
                 "nics_per_node"),
            Case("plan", "search gpus 1..1e12", ["search", "--model", "llama2-7b", "--gpu",
                                                 "h100-sxm", "--gpus", "1..1000000000000",
                                                 "--global-batch", "1024"], "gpus"),
            Case("plan", "search flash1 on B200", ["search", "--model", "llama2-7b", "--gpu",
                                                   "b200", "--gpus", "8", "--global-batch",
                                                   "64", "--attention", "flash1"], "attention"),
            Case("plan", "model with module", h100 + ["--module", ZOO], "model"),
            Case("plan", "unknown gpu", ["simulate", "--model", "llama2-7b", "--gpu", "tpu-v9",
                                         "--gpus", "8", "--global-batch", "8"], "gpu"),
            Case("plan", "unknown model", ["simulate", "--model", "nope", "--gpu", "h100-sxm",
                                           "--gpus", "8", "--global-batch", "8"], "model"),
            Case("plan", "precision fp4", h100 + ["--precision", "fp4"], "precision"),
            Case("plan", "recompute some", h100 + ["--recompute", "some"], "recompute"),
            Case("plan", "engine warp", h100 + ["--engine", "warp"], "engine"),
            Case("plan", "zero stage 4", h100 + ["--zero-stage", "4"], "zero_stage")]


def all_cases() -> list[Case]:
    return flag_cases() + output_cases() + hf_cases() + runs_file_cases() + profile_cases() \
        + plan_cases()


# ---- rows of one runs CSV ------------------------------------------------------------------------
ROW_BAD_CELLS: list[tuple[str, str]] = [
    *[(c, v) for c in ("n_layers", "hidden", "ffn_hidden", "n_heads", "seq_len", "vocab",
                       "n_gpus", "gpus_per_node", "nics_per_node", "tp", "pp", "dp", "cp", "ep",
                       "vpp", "micro_batch", "global_batch", "zero_stage")
      for v in ("abc", "-1", "inf", "1.5", "99999999999")],
    ("nic_gbps", "inf"), ("nic_gbps", "-5"), ("nic_gbps", "nan"), ("gpu", ""),
    ("gpu", "tpu-v9"), ("moe_experts", "0"), ("moe_topk", "x"),
]
ROW_BAD_MEASURED = ["abc", "-1", "0", "inf", "nan"]
