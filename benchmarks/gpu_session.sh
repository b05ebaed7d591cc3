#!/usr/bin/env bash
# One GPU session for issue 20: a budgeted GPU calibration and `validate-run --device cuda`
# for two models, everything written under $OUT (the device tool brings $OUT back).
#
#   bash benchmarks/gpu_session.sh [BUDGET_S]        # from the repository root, on the GPU host
#
# Needs python3 with torch (CUDA build), numpy, scipy, pyarrow, networkx (the lent H200
# image has them); nothing is installed. Wall time on one H200: about BUDGET_S (default
# 240) + 2-3 minutes. Files (at most 8, as the device tool returns them):
#   session.log            every command, its output and exit code; nvidia-smi before/after
#   plan.txt               the dry-run plan (points, estimated seconds) for this host
#   measurements.tar.gz    calib/measurements/*.parquet: the raw rows (with clocks per point)
#   profile.json           the GPU profile fitted from them
#   validate_<model>.json  validate-run --device cuda --json, one per model
#   summary.txt            measured vs predicted step time with the calibrated profile and
#                          with the shipped reference profile, signed error of each
set -u
BUDGET=${1:-240}
OUT=${OUT:-$PWD/gpu_session_out}
WORK=${WORK:-/tmp/gpu_session_work}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOG="$OUT/session.log"
: >"$LOG"

run() {   # run a command, log it with its exit code; never stop the session
    echo "+ $*" >>"$LOG"
    local t0=$SECONDS
    "$@" >>"$LOG" 2>&1
    local rc=$?
    echo "= exit $rc after $((SECONDS - t0)) s" >>"$LOG"
    return $rc
}
cx() { "$PY" -m simulator.cli.main "$@"; }

run nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv
run "$PY" -c "import torch, scipy, pyarrow, networkx; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0))"
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$NGPU" -lt 1 ]; then echo "no GPU visible to torch; stopping" >>"$LOG"; exit 1; fi

# 1. the plan, then the calibration (resumable: a second call continues where this stopped)
cx calibrate --device cuda --dry-run --budget-s "$BUDGET" --out "$WORK/calib" >"$OUT/plan.txt" 2>>"$LOG"
run timeout $((BUDGET + 180)) "$PY" -m simulator.cli.main calibrate --device cuda \
    --budget-s "$BUDGET" --out "$WORK/calib"
[ -f "$WORK/calib/profile.json" ] && cp "$WORK/calib/profile.json" "$OUT/profile.json"
tar -C "$WORK/calib" -czf "$OUT/measurements.tar.gz" measurements 2>>"$LOG"
run nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv

# 2. real training steps vs prediction: a small GPT (launch-heavy) and a 1.1B Llama (GEMM-heavy)
PROFILE="$WORK/calib/profile.json"
[ -f "$PROFILE" ] || PROFILE=reference
validate() {   # name model micro_batch seq strategy: JSON to $OUT, progress to the log
    echo "+ validate-run $*" >>"$LOG"
    local t0=$SECONDS
    timeout 300 "$PY" -m simulator.cli.main validate-run --device cuda --model "$2" \
        --profile "$PROFILE" --nproc "$NGPU" --micro-batch "$3" --seq-len "$4" --steps 10 \
        --warmup 3 --strategy "$5" --json >"$OUT/validate_$1.json" 2>>"$LOG"
    echo "= exit $? after $((SECONDS - t0)) s" >>"$LOG"
    [ -s "$OUT/validate_$1.json" ] || rm -f "$OUT/validate_$1.json"
}
validate gpt2-124m gpt2-124m 16 1024 ddp
validate tinyllama benchmarks/configs/tinyllama-1.1b.json 4 2048 ddp
if [ "$NGPU" -ge 2 ]; then validate tinyllama-fsdp benchmarks/configs/tinyllama-1.1b.json 4 2048 fsdp; fi

# 3. the same runs predicted with the shipped reference profile
"$PY" - "$OUT" "$NGPU" >"$OUT/summary.txt" 2>>"$LOG" <<'EOF'
import json, os, sys
from calibrate.gpu_run import discover, resolve_gpu
from calibrate.validate_gpu import gpu_run_spec, load_gpu_profile, predict_gpu
out, ngpu = sys.argv[1], int(sys.argv[2])
runs = {"gpt2-124m": ("gpt2-124m", "ddp"),
        "tinyllama": ("benchmarks/configs/tinyllama-1.1b.json", "ddp"),
        "tinyllama-fsdp": ("benchmarks/configs/tinyllama-1.1b.json", "fsdp")}
key = resolve_gpu(discover(), None)
ref = load_gpu_profile("reference", key)[0]
print(f"{'run':16s} {'measured ms':>11s} {'calibrated ms':>13s} {'error':>7s} "
      f"{'reference ms':>12s} {'error':>7s}  ({ngpu} x {key})")
for name, (model, strategy) in runs.items():
    path = os.path.join(out, f"validate_{name}.json")
    if not os.path.exists(path):
        print(f"{name:16s} no result (see session.log)")
        continue
    r = json.load(open(path))
    rs = gpu_run_spec(model, r["nproc"], r["micro_batch"], r["seq_len"], r["steps"],
                      r["warmup"], strategy, key, ngpu)
    p_ref, m = predict_gpu(rs, ref).step_time_s, r["measured_step_time_s"]
    print(f"{name:16s} {m * 1e3:11.2f} {r['predicted_step_time_s'] * 1e3:13.2f} "
          f"{r['error_pct']:+6.1f}% {p_ref * 1e3:12.2f} {100 * (p_ref - m) / m:+6.1f}%")
EOF
echo "session done; files in $OUT" >>"$LOG"
