#!/usr/bin/env bash
# CPU training step time of the Llama family, Strata against PyTorch, in one run: the shape
# of issue 28 (8 layers, 512 channels, 8 query heads over 2 key/value heads of 64, SwiGLU
# 1536 wide, T=256, B=4, byte vocabulary, untied head), fp32, one rank, the same thread
# count for both. PyTorch runs transformers' LlamaForCausalLM with sdpa attention and fused
# AdamW (bench/torch_cpu_llama.py). The two run in turn, ROUNDS times (default 3), and each
# round's ratio compares runs a minute apart: on a shared VM whose speed drifts by 5-10%
# over minutes, one run of each can land in different phases. Prints a markdown table with
# the median step of each side over the rounds and the median of the rounds' PyTorch /
# Strata (above 1: Strata is faster), then every round's ratio.
#   bench/bench_cpu_llama.sh [BUILD_DIR]     PYTHON=python-with-torch-and-transformers  STEPS=n (default 10)
#   BATCH=n: sequences per step (default 4)   ROUNDS=n (default 3)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$(cd "${1:-$ROOT/build}" && pwd)
S=$B/strata
THREADS=${OMP_NUM_THREADS:-$(nproc)}
PY=${PYTHON:-python3}
STEPS=${STEPS:-10}
W=$(mktemp -d /tmp/strata-bench-llama.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
cat "$ROOT"/core/*.c "$ROOT"/core/*.h > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
shard=$(ls data/train_*.bin | head -1)
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
L=8 C=512 NH=8 NKV=2 I=1536 T=256 BT=${BATCH:-4} V=256

cat > l.yaml <<YAML
device: cpu
model: {arch: llama, n_layer: $L, n_head: $NH, n_kv_head: $NKV, n_embd: $C, intermediate_size: $I, seq_len: $T, vocab_size: $V, tie_embeddings: false}
data: {train: "data/train_*.bin", val: ""}
train: {steps: $((STEPS + 2)), micro_batch: $BT, eval_every: 0, log_every: 1000, sample_tokens: 0, dtype: fp32}
optim: {lr: 1.0e-3, beta2: 0.95, weight_decay: 0.1, grad_clip: 1.0}
run: {dir: runs/l, checkpoint_every: 0, checkpoint_at_end: false, tensorboard: false}
YAML
why=""
"$PY" -c "import torch, transformers, numpy" 2> /dev/null || why="no torch/transformers/numpy for $PY (set PYTHON=)"
strata_ms() {
  rm -rf runs/l
  OMP_NUM_THREADS=$THREADS "$S" train l.yaml > strata.log
  tail -n +3 runs/l/metrics.jsonl | grep -o '"step_ms": [0-9.]*' | cut -d' ' -f2 | median
}
torch_ms() {
  OMP_NUM_THREADS=$THREADS "$PY" "$ROOT/bench/torch_cpu_llama.py" --layers $L --channels $C --heads $NH \
    --kv-heads $NKV --intermediate $I --seq $T --batch $BT --vocab $V --steps "$STEPS" --threads "$THREADS" \
    --data "$shard" | awk '/^ms_per_step/ {print $2}'
}
sms=() tms=() ratios=()
for ((r = 0; r < ${ROUNDS:-3}; r++)); do
  sms+=("$(strata_ms)")
  if [ -z "$why" ]; then
    tms+=("$(torch_ms)")
    ratios+=("$(awk "BEGIN {printf \"%.3f\", ${tms[-1]} / ${sms[-1]}}")")
  fi
done
sm=$(printf '%s\n' "${sms[@]}" | median)
echo "| shape | threads | Strata ms/step | PyTorch ms/step | PyTorch / Strata |"
echo "|---|---|---|---|---|"
name="Llama: $L layers, $C ch, $NH/$NKV heads, MLP $I, T=$T, B=$BT, V=$V"
if [ -z "$why" ]; then
  tm=$(printf '%s\n' "${tms[@]}" | median)
  rm_=$(printf '%s\n' "${ratios[@]}" | median)
  printf "| %s | %d | %.1f | %.1f | %.2fx |\n" "$name" "$THREADS" "$sm" "$tm" "$rm_"
  echo "rounds (Strata ms, PyTorch ms, ratio): $(for ((r = 0; r < ${#sms[@]}; r++)); do printf '%s %s %sx; ' "${sms[r]}" "${tms[r]}" "${ratios[r]}"; done)"
else
  printf "| %s | %d | %.1f | - | - |\n" "$name" "$THREADS" "$sm"
  echo "PyTorch column empty: $why"
fi
