#!/usr/bin/env bash
# bench/gpu-memory.sh: does the memory plan predict what nvidia-smi shows? For GPT-2 124M
# and 1.5B on one GPU, at zero stage 0 and 3, with and without activation checkpointing and
# with the optimizer offloaded to pinned host memory, a few steps each while nvidia-smi
# samples the GPU's memory every 100 ms. The table: the plan's predicted device total (the
# arena plus its CUDA runtime row, from metrics.jsonl), nvidia-smi's peak, and the
# difference (the goal: within 5%). Also the refusal case: a 1.5B run that would not fit at
# stage 0 is refused (exit 3) with a suggestion, and the suggestion, applied, trains. Last,
# another process takes all free GPU memory mid-run: the run finishes bitwise, or ends with
# exit 4 and a resume command that finishes it bitwise.
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
export STRATA_CUDA_UNVERIFIED=1 # the device's bf16/int8 AdamW and several ranks are still marked unverified

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

# A long context: a 150M Llama at T=16384 with every block recomputed, as is, with the
# head and the MLPs in chunks, and with the residual streams in pinned memory as well
# (3 of 9 on the GPU): each plan against nvidia-smi, then what the chunks and the copies
# cost a step, and whether the copies changed a bit of the run (they must not).
cat > long.yaml <<'YAML'
model: {arch: llama, n_layer: 8, n_head: 8, n_kv_head: 2, n_embd: 1024, intermediate_size: 2816, seq_len: 16384,
        vocab_size: 32000, tie_embeddings: false, rope_theta: 500000}
train: {micro_batch: 1, dtype: bf16, activation_checkpointing: blocks}
optim: {lr: 3.0e-4, warmup_steps: 2}
YAML
LONG_CHUNKS=(--set train.logits_chunk_mb=64 --set train.mlp_chunk_mb=32)
for v in "as-is" "chunks" "chunks-acts"; do
  sets=()
  [ $v = as-is ] || sets=("${LONG_CHUNKS[@]}")
  [ $v = chunks-acts ] && sets+=(--set offload.activations=cpu)
  STRATA_ATTENTION=tc STEPS=6 measure "llama-150m-t16k-$v" long.yaml "${sets[@]}"
done
python3 - runs/llama-150m-t16k-as-is runs/llama-150m-t16k-chunks runs/llama-150m-t16k-chunks-acts <<'PY'
import json, statistics, sys
def rows(d):
    try:
        return [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"loss"' in l]
    except OSError:
        return []
print()
print("| long context (T=16384, 150M Llama, every block recomputed) | ms/step (median of steps 3-6) | losses |")
print("|---|---|---|")
runs = {d.split("t16k-")[1]: rows(d) for d in sys.argv[1:]}
for name, r in runs.items():
    ms = statistics.median(x["step_ms"] for x in r[2:]) if len(r) > 2 else float("nan")
    same = "" if name == "as-is" else (
        "bitwise the chunked run's" if name == "chunks-acts" and [x["loss"] for x in r] == [x["loss"] for x in runs["chunks"]]
        else "differ from the chunked run's: FAIL" if name == "chunks-acts"
        else "worst difference %.2e from as-is" % max((abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(r, runs["as-is"])), default=float("nan")))
    print(f"| {name} | {ms:.1f} | {same} |")
PY

# A 1.5B run at stage 0 that does not fit one GPU, an H200's 140 GiB included (micro-batch 96,
# no checkpointing: 210 GiB planned) is refused before allocating, with the cheapest change
# that fits; applied, it trains.
echo
refuse=(--set zero.stage=0 --set train.micro_batch=96 --set train.activation_checkpointing=none)
rc=0
"$S" train "$C15" "${common[@]}" --set train.steps=3 --set run.dir=runs/refused "${refuse[@]}" > refused.log 2>&1 || rc=$?
line=$(grep -o -- "--set [^ ]*\( --set [^ ]*\)*" refused.log | head -1 || true)
if [ $rc -ne 3 ] || [ -z "$line" ]; then
  echo "refusal: FAIL: 1.5B stage 0 micro-batch 96 exited $rc (3 expected) with suggestion '$line'"
  grep -E "error|verdict" refused.log | head -3
else
  echo "refusal: 1.5B stage 0 micro-batch 96 refused (exit 3); suggested: $line"
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

# Another process takes all of the GPU's free memory in the middle of a 124M run. Strata
# allocates nothing on the device after its start, so the run should finish with the losses
# of an undisturbed one; if something does allocate after all (a lazily loaded module, a
# library's workspace), the run must end with exit 4, a checkpoint and a resume command
# that, run once the memory is back, finishes the run bitwise as if nothing had happened.
echo
hog_common=("${common[@]}" --set zero.stage=0 --set train.steps=12 --set run.checkpoint_every=0)
rm -rf runs/hog-ref runs/hog
rc=0
timeout 300 "$S" train "$C124" "${hog_common[@]}" --set run.dir=runs/hog-ref > hog-ref.log 2>&1 || rc=$?
if [ $rc -ne 0 ]; then
  echo "another process takes the free memory: FAIL: the undisturbed reference run exited $rc"
else
  timeout 300 "$S" train "$C124" "${hog_common[@]}" --set run.dir=runs/hog > hog.log 2>&1 &
  run=$!
  python3 - runs/hog/metrics.jsonl "$run" > hog-taker.log 2>&1 <<'PY' &
import os, sys, time
import torch
metrics, pid = sys.argv[1], int(sys.argv[2])
def steps():
    try:
        return sum(1 for l in open(metrics) if '"loss"' in l)
    except OSError:
        return 0
while steps() < 3:
    if not os.path.exists(f"/proc/{pid}"):
        sys.exit("the run ended before step 3")
    time.sleep(0.02)
held, chunk = [], 1 << 30
while chunk >= 1 << 20:  # take every free byte, in ever smaller pieces
    try:
        held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        chunk //= 2
free, total = torch.cuda.mem_get_info()
print(f"took {sum(t.numel() for t in held) / 2**30:.2f} GiB after step {steps()}; {free / 2**20:.0f} MiB left free", flush=True)
while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
    time.sleep(0.1)
PY
  taker=$!
  rc=0
  wait $run || rc=$?
  wait $taker 2> /dev/null || true
  took=$(tail -1 hog-taker.log)
  same() { # bitwise equal losses in steps $1.. of the two runs' metrics
    python3 - "$1" runs/hog-ref/metrics.jsonl runs/hog/metrics.jsonl <<'PY'
import json, sys
first = int(sys.argv[1])
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r and r["step"] >= first}
a, b = losses(sys.argv[2]), losses(sys.argv[3])
sys.exit(0 if a and a == b else 1)
PY
  }
  if [ $rc -eq 0 ]; then
    if same 1; then v=PASS; else v="FAIL (losses differ from the undisturbed run)"; fi
    echo "another process takes the free memory ($took): the run finished its 12 steps, losses bitwise those of the undisturbed run: $v"
  elif [ $rc -eq 4 ]; then
    resume=$(grep -A1 "resume with:" hog.log | tail -1 | sed 's/^ *//')
    rc2=0
    # the printed command names the binary `strata`: run it with this one
    [ -n "$resume" ] && { (eval "set -- ${resume#strata }" && timeout 300 "$S" "$@") > hog-resume.log 2>&1 || rc2=$?; }
    if [ -n "$resume" ] && [ $rc2 -eq 0 ] && same 1; then v=PASS; else v="FAIL (resume exit $rc2; command: '$resume')"; fi
    echo "another process takes the free memory ($took): exit 4 with a checkpoint; the printed resume command finished the run bitwise: $v"
  else
    echo "another process takes the free memory ($took): FAIL: exit $rc (0 or 4 expected): $(grep -m1 -E 'error' hog.log | cut -c1-160)"
  fi
fi
} | tee table.md
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp table.md "$OUT/gpu-memory.md"
  log "table in $OUT/gpu-memory.md"
fi
