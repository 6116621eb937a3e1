#!/usr/bin/env bash
# bench/bench_offload_gpu.sh: the offload measurements of issue 6, side by side in one run,
# on one GPU:
#   - GPT-2 1.5B (B=8, T=1024, bf16, no activation checkpointing), zero stage 1:
#     optimizer on the GPU, in pinned host memory (cpu) and on NVMe, against PyTorch FSDP2
#     with CPUOffloadPolicy (bench/fsdp2_offload.py) when torch is installed;
#   - each offload run's split (GPU compute, D2H, CPU AdamW, H2D, disk, waits) and its floor
#     with the step as a multiple of it, from strata train's own end-of-run report;
#   - a 7.1B-parameter GPT (34 layers, 4096 channels) at zero stage 3 with parameters and
#     optimizer state in pinned host memory: step time, loss per step, where each byte lives;
#   - the largest GPT the box holds (10b): `strata plan` on this machine's GPU and host
#     memory for 4096-channel GPTs of 50, 54, 58 ... layers (no allocation), then 20 steps of
#     the 50-layer one (10.3B) with the optimizer offloaded as far as the plan says
#     (offload.optimizer_ratio keeps the rest on the GPU): loss per step, step time, its
#     split and floor, planned against allocated per tier.
# Usage: STRATA=build-gpu/strata [NVME_DIR=/path] [OUT=dir] [OFFLOAD_PARTS="1.5b 7b 10b"] bench/bench_offload_gpu.sh
# (each part takes 5-7 minutes: under the device tool's 10-minute limit, run them one per call)
# Needs a built strata with the CUDA backend (bench/gpu-check.sh builds one).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=${STRATA:-$ROOT/build-gpu/strata}
OUT=${OUT:-$ROOT/gpu-check-out}
NVME_DIR=${NVME_DIR:-/tmp/strata-nvme}
PARTS=" ${OFFLOAD_PARTS:-1.5b 7b 10b} "
mkdir -p "$OUT" "$NVME_DIR"
log() { echo "[bench-offload] $*"; }
W=$(mktemp -d /tmp/strata-bench-offload.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
cat "$ROOT"/core/*.c "$ROOT"/core/*.h "$ROOT"/shard/*.c "$ROOT"/offload/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
export STRATA_CUDA_UNVERIFIED=1 # the device's bf16/int8 AdamW and several ranks are still marked unverified

# median step time (steps after the first two), tokens/s, model TFLOP/s (metrics.jsonl's
# tflops: 6 N + 12 L C T FLOPs a token, recomputation not counted), planned device bytes,
# offload wait
summarize() {
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
tail = rows[2:] or rows
ms = statistics.median(r["step_ms"] for r in tail)
tps = statistics.median(r["tokens_per_s"] for r in tail)
tf = statistics.median(r.get("tflops", 0) for r in tail)
dev = max(r.get("plan_device_bytes", 0) for r in rows) / 2**30
pin = max(r.get("pinned_bytes", 0) for r in rows) / 2**30
ow = statistics.median(r.get("offload_wait_ms", 0) for r in tail)
print(f"| {sys.argv[2]} | {ms / 1e3:.3f} | {tps:,.0f} | {tf:.1f} | {dev:.2f} GiB | {pin:.2f} GiB | {ow:.0f} ms |")
PY
}

if [[ "$PARTS" == *" 1.5b "* ]]; then
common=(--set device=cuda --set 'data.train=data/train_*.bin' --set data.val= --set train.eval_every=0
        --set train.sample_tokens=0 --set train.sample_every=0 --set run.checkpoint_every=0 --set run.checkpoint_at_end=false --set train.log_every=1)
{
echo "GPT-2 1.5B, B=8, T=1024, bf16, no activation checkpointing, zero stage 1, one GPU"
echo
echo "| run | s/step (median) | tokens/s | model TFLOP/s | GPU (planned) | pinned host | offload wait |"
echo "|---|---|---|---|---|---|---|"
# cpu-auto: the optimizer offloaded, but only what the GPU cannot hold (offload.optimizer_ratio: auto);
# cpu-grads: the gradients in pinned memory too, copied out during the backward (offload.gradients: cpu);
# cpu-allcores: the CPU's update on every core (offload.cpu_threads; auto leaves 2 to the kernel launches and copies)
for o in none cpu cpu-auto cpu-grads cpu-allcores nvme; do
  steps=8; [ $o = nvme ] && steps=4
  extra=(--set "offload.optimizer=$o") label="offload.optimizer: $o"
  [ $o = cpu-auto ] && extra=(--set offload.optimizer=cpu --set offload.optimizer_ratio=auto) label="offload.optimizer: cpu, optimizer_ratio: auto"
  [ $o = cpu-grads ] && extra=(--set offload.optimizer=cpu --set offload.gradients=cpu) label="offload.optimizer: cpu, gradients: cpu"
  [ $o = cpu-allcores ] && extra=(--set offload.optimizer=cpu --set "offload.cpu_threads=$(nproc)") label="offload.optimizer: cpu, cpu_threads: $(nproc) (every core)"
  if timeout 540 "$S" train "$ROOT/configs/gpt2-1.5b.yaml" "${common[@]}" --set zero.stage=1 --set train.micro_batch=8 \
       --set train.steps=$steps --set train.activation_checkpointing=none "${extra[@]}" --set "offload.nvme_path=$NVME_DIR" --set run.dir=runs/$o \
       > $o.log 2>&1; then
    summarize runs/$o "Strata, $label$(grep -o 'auto is [0-9.]*' $o.log | sed 's/^/ (/; s/$/)/')"
  else
    echo "| Strata, $label | failed: $(grep -m1 -E 'error|FAIL' $o.log | cut -c1-100) | | | | | |"
  fi
done
if python3 -c "import torch, transformers" 2> /dev/null; then
  # without recomputation, as the Strata rows; if its activations do not fit, with it (labelled)
  timeout 300 python3 "$ROOT/bench/fsdp2_offload.py" 2> fsdp2.log ||
    timeout 300 python3 "$ROOT/bench/fsdp2_offload.py" --checkpointing 2> fsdp2.log ||
    echo "| FSDP2 + CPUOffloadPolicy | failed: $(tail -1 fsdp2.log | cut -c1-100) | | | | |"
fi
echo
echo "CPU AdamW on this machine's cores (the update the offload runs; 16.8 M fp32 parameters):"
echo
"$(dirname "$S")/bench/bench_cpu_adam" 2>&1 | tail -n +1 || true
python3 -c "import torch" 2> /dev/null && python3 "$ROOT/bench/torch_adamw.py" 2>&1 | tail -n 3 || true
echo
echo
echo "The split and the floor of each offload run (strata train's end-of-run report; docs/benchmarks.md):"
for o in cpu cpu-auto cpu-grads cpu-allcores nvme; do
  echo
  echo "offload.optimizer: $o"
  grep '^\[offload\]' $o.log | sed 's/^\[offload\] */    /' || echo "    (no report: the run failed)"
done
echo
echo "strata bench io, at the NVMe runs' block size and queue depth:"
"$S" bench io --nvme-dir "$NVME_DIR" --block-kb 1024 --queue-depth 32 2>&1 | sed 's/^/    /' || true
} | tee -a "$OUT/bench_offload.md" # appended: each part adds its table
rm -rf "$NVME_DIR"/strata-* 2> /dev/null || true
fi

if [[ "$PARTS" == *" 7b "* ]]; then
log "7.1B GPT, zero stage 3, parameters and optimizer state in pinned host memory"
cat > big.yaml <<'YAML'
device: cuda
model: {n_layer: 34, n_head: 32, n_embd: 4096, seq_len: 1024, vocab_size: 50257}
data: {train: "data/train_*.bin"}
train: {steps: 6, micro_batch: 8, grad_accum: 4, dtype: bf16, activation_checkpointing: blocks,
        eval_every: 0, log_every: 1, sample_tokens: 0}
optim: {lr: 3.0e-4, warmup_steps: 2, weight_decay: 0.1, grad_clip: 1.0}
run: {dir: runs/big, checkpoint_every: 0, checkpoint_at_end: false}
zero: {stage: 3, prefetch_units: 2}
offload: {optimizer: cpu, params: cpu, buffer_count: 2}
YAML
{
echo
# 32 sequences a step (8 x 4 accumulated): the CPU update of 7.1 B parameters (213 GB of
# host memory traffic with fp32 state) runs behind the first micro-step's forward, and the
# parameter gathers (28 GB over PCIe a micro-step) behind each micro-step's compute, so the
# step approaches its compute (MegaTrain, 2026: Qwen2.5-7B at ~270 TFLOP/s on one H100)
echo "7.1B GPT (34 layers, 4096 channels, 8 x 4 sequences of 1024 a step), zero stage 3, offload.params: cpu, offload.optimizer: cpu"
echo
"$S" plan big.yaml 2>&1 | sed 's/^/    /'
big_run() { # limit_s label, extra --set...
  local limit=$1 label=$2; shift 2
  rm -rf runs/big
  if timeout "$limit" "$S" train big.yaml "$@" > big.log 2>&1; then
    echo
    echo "| run | s/step (median) | tokens/s | model TFLOP/s | GPU (planned) | pinned host | offload wait |"
    echo "|---|---|---|---|---|---|---|"
    summarize runs/big "$label"
    echo
    echo "loss per step: $(grep -o '"loss": [0-9.]*' runs/big/metrics.jsonl | cut -d' ' -f2 | tr '\n' ' ')"
    return 0
  fi
  echo "$label: failed: $(grep -m3 -E 'error|FAIL|HUNG' big.log | cut -c1-200)"
  return 1
}
# stage 3 on CUDA is not yet verified: if it fails, the same model with only the optimizer
# offloaded (the parameters, 14 GB in bf16, fit the GPU) still shows a 7B model training
big_run 300 "7.1B, stage 3, params + optimizer offloaded" ||
  big_run 270 "7.1B, stage 1, optimizer offloaded (fallback)" --set zero.stage=1 --set offload.params=none
} | tee -a "$OUT/bench_offload.md"
fi

[[ "$PARTS" == *" 10b "* ]] || exit 0
log "the largest GPT this box holds: plans, then 20 steps of 10.3B"
gpt() { # n_layer: a 4096-channel GPT-2-style config, optimizer offloaded to pinned memory
  cat > gpt$1.yaml <<YAML
device: cuda
model: {n_layer: $1, n_head: 32, n_embd: 4096, seq_len: 1024, vocab_size: 50257}
data: {train: "data/train_*.bin"}
train: {steps: 20, micro_batch: 4, grad_accum: 1, dtype: bf16, activation_checkpointing: blocks,
        eval_every: 0, log_every: 1, sample_tokens: 0}
optim: {lr: 1.0e-4, warmup_steps: 2, weight_decay: 0.1, grad_clip: 1.0}
run: {dir: runs/gpt$1, checkpoint_every: 0, checkpoint_at_end: false}
offload: {optimizer: cpu, buffer_count: 2, nvme_path: "$NVME_DIR"}
YAML
}
# the plan's fitting line for a config ("" when it fits as it is; exit 1 when nothing does)
fit_line() {
  local out rc; set +e; out=$("$S" plan "$1" 2>&1); rc=$?; set -e
  [ $rc -eq 0 ] && { echo ""; return 0; }
  grep -o 'cheapest change that fits[^:]*: .*' <<<"$out" | sed 's/^[^:]*: //' | grep . || return 1
}
{
echo
echo "The largest GPT this box holds (4096 channels, B=4, T=1024, bf16, checkpointing, optimizer offloaded; \`strata plan\` on this machine's free GPU memory, MemAvailable and the free space of $NVME_DIR):"
echo
echo "| layers | parameters | fits with |"
echo "|---|---|---|"
for L in 50 54 58 62 66 70; do
  gpt $L
  params=$( { "$S" plan gpt$L.yaml 2>&1 || true; } | grep -o '[0-9]* parameters' | head -1 | awk '{printf "%.2fB", $1 / 1e9}')
  if line=$(fit_line gpt$L.yaml); then
    echo "| $L | $params | ${line:-as it is} |"
  else
    echo "| $L | $params | nothing: $( { "$S" plan gpt$L.yaml 2>&1 || true; } | grep -o 'DOES NOT FIT ([^)]*' | head -1)) |"
    break
  fi
done
echo
gpt 50
# the optimizer offloaded as far as the GPU cannot hold it (auto); the ladder's line if that
# does not fit the host
line="--set offload.optimizer_ratio=auto"
# shellcheck disable=SC2086
if ! "$S" plan gpt50.yaml $line > /dev/null 2>&1 && ! line=$(fit_line gpt50.yaml); then
  echo "10.3B GPT: no setting fits this machine's memory (the table's reason); not trained"
  exit 0
fi
echo "10.3B GPT (50 layers, 4096 channels, B=4, T=1024), optimizer offloaded: ${line:-as configured}"
echo
# shellcheck disable=SC2086 # the plan's line is a list of --set arguments
"$S" plan gpt50.yaml $line 2>&1 | sed 's/^/    /'
# shellcheck disable=SC2086
if timeout 500 "$S" train gpt50.yaml $line > gpt50.log 2>&1; then
  echo
  echo "| run | s/step (median) | tokens/s | model TFLOP/s | GPU (planned) | pinned host | offload wait |"
  echo "|---|---|---|---|---|---|---|"
  summarize runs/gpt50 "10.3B, ${line:-offload.optimizer: cpu}"
  echo
  echo "loss per step: $(grep -o '"loss": [0-9.]*' runs/gpt50/metrics.jsonl | cut -d' ' -f2 | tr '\n' ' ')"
else
  echo "10.3B: failed or timed out: $(grep -m3 -E 'error|FAIL|HUNG' gpt50.log | cut -c1-200)"
  echo "last lines: $(tail -3 gpt50.log | cut -c1-200)"
fi
echo
grep -E '^\[(offload|plan)\]' gpt50.log | sed 's/^/    /' || true
} | tee -a "$OUT/bench_offload.md"
