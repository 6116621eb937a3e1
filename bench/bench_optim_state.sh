#!/usr/bin/env bash
# bench/bench_optim_state.sh: what optim.state (fp32 | bf16 | int8 Adam moments) buys and
# costs, as markdown tables (docs/benchmarks.md, "Optimizer state in 8 bits"):
#  1. bytes a parameter of the optimizer state, from `strata plan` (no GPU needed);
#  2. CPU AdamW throughput by state type (the offload tier's update) against PyTorch's AdamW
#     on the same cores (bench_cpu_adam, bench/torch_adamw.py; PyTorch from STRATA_PYTHON,
#     .dev/venv or python3, skipped without it);
#  3. NVMe bytes a step with the optimizer state on NVMe, and what the step costs (CPU
#     backend, a 4.8 M-parameter GPT, median of steps 3-16);
#  4. the largest Llama-family model (Llama 3 8B's width, more or fewer layers) one H100 box
#     holds, 80 GB GPU, 120 GiB host memory, 64 GiB disk, by `strata plan` and its ladder:
#     with fp32 state (a change that keeps the optimizer's numerics) and with int8;
#  5. QUALITY=1: training quality, configs/tinyshakespeare.yaml (1000 steps) and
#     configs/quickstart.yaml (1500 steps, Debian's fortunes) to their ends with fp32 and
#     int8 state: the validation loss at each evaluation (minutes each on 2 cores).
# Usage: [STRATA=build/strata] [QUALITY=1] bench/bench_optim_state.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=${STRATA:-$ROOT/build/strata}
BUILD=$(dirname "$S")
W=$(mktemp -d /tmp/strata-bench-optim-state.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
mkdir -p swap

echo "## 1. Optimizer state, bytes a parameter (strata plan)"
echo
echo "| model, setting | parameters | fp32 | bf16 | int8 |"
echo "|---|---|---|---|---|"
cat > llama8b.yaml <<YAML
device: cuda
model: {arch: llama, n_layer: 32, n_head: 32, n_kv_head: 8, n_embd: 4096, intermediate_size: 14336, seq_len: 4096, vocab_size: 128256, tie_embeddings: false, rope_theta: 500000}
data: {train: "data/train_*.bin"}
train: {steps: 1000, micro_batch: 1, grad_accum: 16, dtype: bf16, activation_checkpointing: blocks}
offload: {nvme_path: "$W/swap"}
YAML
bpp_row() { # label, config, plan arguments...
  local label=$1 cfg=$2; shift 2
  local cells="" params=""
  for st in fp32 bf16 int8; do
    out=$(CUDA_VISIBLE_DEVICES='' "$S" plan "$cfg" --set optim.state=$st "$@" 2>&1 || true)
    params=$(grep -o '[0-9]* parameters' <<<"$out" | head -1 | awk '{printf "%.2f B", $1 / 1e9}')
    cells="$cells | $(grep -o 'optimizer state: [0-9.]*' <<<"$out" | grep -o '[0-9.]*$')"
  done
  echo "| $label | $params$cells |"
}
bpp_row "GPT-2 124M, world 1" "$ROOT/configs/gpt2-124m.yaml"
bpp_row "GPT-2 1.5B, world 1" "$ROOT/configs/gpt2-1.5b.yaml"
bpp_row "GPT-2 1.5B, world 8 stage 3" "$ROOT/configs/gpt2-1.5b.yaml" --world 8 --set zero.stage=3
bpp_row "Llama 3 8B shape, world 1, state on NVMe" llama8b.yaml --set offload.optimizer=nvme
bpp_row "Llama 3 8B shape, world 8 stage 3, state and parameters on NVMe" llama8b.yaml --world 8 --set zero.stage=3 \
  --set offload.optimizer=nvme --set offload.params=nvme
echo

echo "## 2. CPU AdamW by state type, and PyTorch's AdamW on the same cores"
echo
"$BUILD/bench/bench_cpu_adam"
PY=${STRATA_PYTHON:-}
[ -n "$PY" ] || PY=$("$ROOT/launcher/python-env.sh" 2>/dev/null || true)
if [ -n "$PY" ] && "$PY" -c "import torch" 2>/dev/null; then
  echo
  echo "| PyTorch (fp32 moments) | threads | ms | Gparam/s | GB/s |"
  echo "|---|---|---|---|---|"
  "$PY" "$ROOT/bench/torch_adamw.py"
else
  echo "(no PyTorch: its rows skipped)"
fi
echo

echo "## 3. Optimizer state on NVMe: bytes a step (CPU backend, 4.8 M parameters, stage 1)"
echo
cat "$ROOT"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > ob.yaml <<YAML
device: cpu
model: {n_layer: 6, n_head: 4, n_embd: 256, seq_len: 64, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 16, micro_batch: 4, eval_every: 0, log_every: 1, sample_tokens: 0}
optim: {lr: 1.0e-3, warmup_steps: 2}
run: {dir: runs/x, checkpoint_at_end: false}
offload: {nvme_path: "$W/swap"}
zero: {stage: 1}
YAML
echo "| optim.state, optimizer on | ms/step | offload wait ms | disk read per step | disk write per step | loss at step 16 |"
echo "|---|---|---|---|---|---|"
for st in fp32 bf16 int8; do
  for where in none nvme; do
    rm -rf runs/x
    STRATA_OFFLOAD_FLOOR=off "$S" train ob.yaml --set optim.state=$st --set offload.optimizer=$where > run.log 2>&1 ||
      { echo "| $st, $where | failed: $(tail -1 run.log | cut -c1-80) | | | | |"; continue; }
    python3 - "$st, $([ $where = none ] && echo device || echo NVMe)" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open("runs/x/metrics.jsonl")]
tail = rows[2:]
med = lambda k: statistics.median(r.get(k, 0) for r in tail)
print(f"| {sys.argv[1]} | {med('step_ms'):.1f} | {med('offload_wait_ms'):.1f} | {med('offload_disk_read_bytes') / 2**20:.2f} MiB | "
      f"{med('offload_disk_write_bytes') / 2**20:.2f} MiB | {rows[-1]['loss']:.6f} |")
PY
  done
done
echo

echo "## 4. The largest Llama-family model one H100 box holds (80 GB GPU, 120 GiB host, 64 GiB disk)"
echo
# Llama 3 8B's width (4096 channels, 32 heads, 8 KV heads, 14336 MLP, vocab 128256, untied),
# T=4096, 16 sequences a step, bf16, activation checkpointing; n_layer bisected: the most
# layers for which the plan fits as it is or the ladder finds a change that fits (for fp32
# state, one that keeps the optimizer's numerics)
# (exit 3, does not fit, is an answer here, not a failure)
plan_at() { CUDA_VISIBLE_DEVICES='' "$S" plan llama8b.yaml --set model.n_layer="$1" --set optim.state="$2" \
  --gpu-gb 80 --host-gb 120 --nvme-gb 64 "${@:3}" 2>&1 || true; }
fits() { # n_layer state: the plan fits, or a change that keeps the state type does
  local out
  out=$(plan_at "$1" "$2")
  grep -q "verdict: fits" <<<"$out" || grep -v "changes the optimizer's numerics" <<<"$out" | grep -qE "cheapest change that (fits|keeps)"
}
change_at() { plan_at "$1" "$2" | grep -v "changes the optimizer's numerics" | { grep -oE "cheapest change that (fits|keeps)[^:]*: .*" || true; } |
  sed 's/^[^:]*: //' | head -1; }
echo "| optim.state | largest n_layer | parameters | the change that fits it | the same change at one more layer |"
echo "|---|---|---|---|---|"
for st in fp32 int8; do
  lo=1 hi=160
  while [ $lo -lt $hi ]; do
    mid=$(( (lo + hi + 1) / 2 ))
    if fits $mid $st; then lo=$mid; else hi=$((mid - 1)); fi
  done
  params=$(plan_at $lo $st | grep -o '[0-9]* parameters' | head -1 | awk '{printf "%.2f B", $1 / 1e9}')
  change=$(change_at $lo $st)
  # shellcheck disable=SC2086 # the change is a list of --set arguments
  why=$(plan_at $((lo + 1)) $st $change | { grep -o 'DOES NOT FIT (.*' || true; } | sed 's/^DOES NOT FIT (//; s/)$//')
  echo "| $st | $lo | $params | \`$change\` | $why |"
  # shellcheck disable=SC2086
  plan_at $lo $st $change > plan_$st.txt
done
for st in fp32 int8; do
  echo
  echo "The plan with $st state:"
  echo
  echo '```'
  grep -vE "^\s*$" plan_$st.txt
  echo '```'
done

if [ "${QUALITY:-0}" = 1 ]; then
  echo
  echo "## 5. Training quality: the validation loss with fp32 and int8 state"
  val() { grep -o '"step": [0-9]*, .*"val_loss": [0-9.]*' "$1/metrics.jsonl" | sed 's/"step": \([0-9]*\),.*"val_loss": \([0-9.]*\)/\1 \2/'; }
  quality() { # name config data-prepare-args...
    local name=$1 cfg=$2; shift 2
    for st in fp32 int8; do
      /usr/bin/time -f "%e" -o time_${name}_$st.txt "$S" train "$cfg" --set optim.state=$st --set run.dir=runs/$name-$st \
        --set train.sample_tokens=0 --set run.checkpoint_every=0 --set run.checkpoint_at_end=false > $name-$st.log 2>&1
    done
    echo
    echo "$name ($cfg; $(cat time_${name}_fp32.txt) s fp32, $(cat time_${name}_int8.txt) s int8):"
    echo
    echo "| step | val loss, fp32 state | val loss, int8 state | difference |"
    echo "|---|---|---|---|"
    join <(val runs/$name-fp32) <(val runs/$name-int8) | awk '{printf "| %d | %.4f | %.4f | %+.2f%% |\n", $1, $2, $3, 100 * ($3 - $2) / $2}'
  }
  corpus="$ROOT/../shared/data/tinyshakespeare.txt"
  if [ -f "$corpus" ]; then
    "$S" prepare --text "$corpus" --out data/tinyshakespeare --val-fraction 0.1 > /dev/null
    quality tinyshakespeare "$ROOT/configs/tinyshakespeare.yaml"
  fi
  fortunes=()
  for f in /usr/share/games/fortunes/*; do case "$f" in *.dat|*.u8) continue ;; esac; [ -f "$f" ] && fortunes+=("$f"); done
  if [ ${#fortunes[@]} -gt 0 ]; then
    "$S" prepare --text "${fortunes[@]}" --out data/quickstart --val-fraction 0.05 > /dev/null
    quality quickstart "$ROOT/configs/quickstart.yaml"
  fi
fi
