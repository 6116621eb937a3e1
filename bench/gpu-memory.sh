#!/usr/bin/env bash
# bench/gpu-memory.sh: does the memory plan predict what nvidia-smi shows? For GPT-2 124M
# and 1.5B on one GPU, at zero stage 0 and 3, with and without activation checkpointing and
# with the optimizer offloaded to pinned host memory, a few steps each while nvidia-smi
# samples the GPU's memory every 100 ms. The table: the plan's predicted device total (the
# arena plus its CUDA runtime row, from metrics.jsonl), nvidia-smi's peak, and the
# difference (the goal: within 5%). Also the refusal case: a 1.5B run that would not fit at
# stage 0 is refused (exit 3) with a suggestion, and the suggestion, applied, trains.
#
# Usage: STRATA=build-gpu/strata [OUT=dir] [GPU=0] [STEPS=4] bench/gpu-memory.sh
# Needs a strata built with the CUDA backend (bench/gpu-check.sh builds one) and nvidia-smi.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=${STRATA:-build/strata}
[[ "$S" = /* ]] || S=$PWD/$S
GPU=${GPU:-0}
STEPS=${STEPS:-4}
log() { echo "[gpu-memory] $*" >&2; }
command -v nvidia-smi > /dev/null || { log "nvidia-smi not found: this benchmark needs a GPU"; exit 1; }
[ -x "$S" ] || { log "no strata binary at $S (set STRATA)"; exit 1; }
W=$(mktemp -d)
sampler=
cleanup() { [ -n "$sampler" ] && kill "$sampler" 2> /dev/null; rm -rf "$W"; }
trap cleanup EXIT
cd "$W"
cat "$ROOT"/core/*.c "$ROOT"/core/*.h "$ROOT"/shard/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
export STRATA_CUDA_UNVERIFIED=1 # zero stage 3 on CUDA is still marked unverified

common=(--set device=cuda --set 'data.train=data/train_*.bin' --set data.val= --set train.eval_every=0
        --set train.sample_tokens=0 --set train.sample_every=0 --set run.checkpoint_every=0 --set run.checkpoint_at_end=false --set train.log_every=1)
smi_used() { nvidia-smi -i "$GPU" --query-gpu=memory.used --format=csv,noheader,nounits | head -1 | tr -d ' '; }

# measure NAME CONFIG SETS...: one run with nvidia-smi sampling; prints a table row
measure() {
  local name=$1 cfg=$2; shift 2
  local dir=runs/$name
  rm -rf "$dir"
  local base; base=$(smi_used)
  nvidia-smi -i "$GPU" --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$name.smi" &
  sampler=$!
  local rc=0
  timeout 480 "$S" train "$cfg" "${common[@]}" --set train.steps="$STEPS" --set run.dir="$dir" "$@" > "$name.log" 2>&1 || rc=$?
  sleep 0.3 # one more sample after the process is gone is harmless; the peak was earlier
  kill "$sampler" 2> /dev/null || true
  wait "$sampler" 2> /dev/null || true
  sampler=
  if [ $rc -ne 0 ]; then
    echo "| $name | failed (exit $rc): $(grep -m1 -E 'error|DOES NOT FIT' "$name.log" | cut -c1-110) | | | | |"
    return
  fi
  if python3 - "$name" "$dir/metrics.jsonl" "$name.smi" "$base" <<'PY'
import json, sys
name, metrics, smi, base = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rows = [json.loads(l) for l in open(metrics)]
last = rows[-1]
predicted = last["plan_device_total_bytes"]
inproc = max(r["device_used_peak_bytes"] for r in rows)
samples = [int(x) for x in open(smi).read().split() if x.strip().isdigit()]
peak = max(samples) * 2**20 if samples else 0
diff = 100.0 * (peak - predicted) / predicted if predicted and peak else float("nan")
verdict = "ok" if abs(diff) <= 5 else "OFF"
G = 2**30
print(f"| {name} | {predicted / G:.2f} GiB | {peak / G:.2f} GiB | {diff:+.2f}% {verdict} | "
      f"{inproc / G:.2f} GiB | {base / 1024:.2f} GiB |")
PY
  then :; else echo "| $name | trained, but its metrics or samples could not be read | | | | |"; fi
}

C124=$ROOT/configs/gpt2-124m.yaml
C15=$ROOT/configs/gpt2-1.5b.yaml
{
echo "Predicted device memory (plan: arena + CUDA runtime) against nvidia-smi's peak, $STEPS steps each,"
echo "GPU $GPU: $(nvidia-smi -i "$GPU" --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
echo
echo "| run | predicted peak | nvidia-smi peak | difference | in-process peak (total - free) | nvidia-smi before |"
echo "|---|---|---|---|---|---|"
for st in 0 3; do
  for ck in none blocks; do
    measure "124m-stage$st-ckpt-$ck" "$C124" --set zero.stage=$st --set train.activation_checkpointing=$ck
  done
done
measure "124m-stage0-offload-cpu" "$C124" --set zero.stage=0 --set offload.optimizer=cpu
for st in 0 3; do
  for ck in none blocks; do
    measure "1.5b-stage$st-ckpt-$ck" "$C15" --set zero.stage=$st --set train.micro_batch=8 --set train.activation_checkpointing=$ck
  done
done
measure "1.5b-stage0-offload-cpu" "$C15" --set zero.stage=0 --set train.micro_batch=8 --set offload.optimizer=cpu

# A 1.5B run at stage 0 that does not fit one GPU (micro-batch 64, no checkpointing: ~185 GiB
# planned) is refused before allocating, with the cheapest change that fits; applied, it trains.
echo
refuse=(--set zero.stage=0 --set train.micro_batch=64 --set train.activation_checkpointing=none)
rc=0
"$S" train "$C15" "${common[@]}" --set train.steps=3 --set run.dir=runs/refused "${refuse[@]}" > refused.log 2>&1 || rc=$?
line=$(grep -o -- "--set [^ ]*\( --set [^ ]*\)*" refused.log | head -1 || true)
if [ $rc -ne 3 ] || [ -z "$line" ]; then
  echo "refusal: FAIL: 1.5B stage 0 micro-batch 64 exited $rc (3 expected) with suggestion '$line'"
  grep -E "error|verdict" refused.log | head -3
else
  echo "refusal: 1.5B stage 0 micro-batch 64 refused (exit 3); suggested: $line"
  read -r -a applied <<< "$line"
  echo
  echo "| run | predicted peak | nvidia-smi peak | difference | in-process peak (total - free) | nvidia-smi before |"
  echo "|---|---|---|---|---|---|"
  STEPS=3 measure "1.5b-refused-then-suggested" "$C15" "${refuse[@]}" "${applied[@]}"
  if grep -q '"step": 3,' runs/1.5b-refused-then-suggested/metrics.jsonl 2> /dev/null; then
    echo "the suggestion, applied, trained 3 steps: PASS"
  else
    echo "the suggestion, applied, did not train 3 steps: FAIL ($(grep -m1 error 1.5b-refused-then-suggested.log | cut -c1-120))"
  fi
fi
} | tee table.md
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp table.md "$OUT/gpu-memory.md"
  log "table in $OUT/gpu-memory.md"
fi
