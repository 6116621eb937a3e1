#!/usr/bin/env bash
# CPU training step time, Strata against PyTorch, in one run: four GPT-2 shapes (the
# table of issue 16), fp32, one rank, the same thread count for both. PyTorch runs
# bench/torch_cpu_gpt.py (nanoGPT-style, same architecture, batch and AdamW). Prints a
# markdown table with both medians and PyTorch / Strata (above 1: Strata is faster).
# With LLMC_DIR pointing at an llm.c checkout, also times its train_gpt2.c on the
# GPT-2 124M shape (random weights in its checkpoint format).
#   bench/bench_cpu.sh [BUILD_DIR]     PYTHON=python-with-torch  OUT=dir (writes the table there)
#   SHAPES="1 2" runs only those rows of the table; STEPS=n timed steps per row (default 10)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build}
S=$B/strata
THREADS=${OMP_NUM_THREADS:-$(nproc)}
PY=${PYTHON:-python3}
STEPS=${STEPS:-10}
W=$(mktemp -d /tmp/strata-bench-cpu.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
cat "$ROOT"/core/*.c "$ROOT"/core/*.h > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
shard=$(ls data/train_*.bin | head -1)
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

torch_why=""
"$PY" -c "import torch, numpy" 2> /dev/null || torch_why="no torch/numpy for $PY (set PYTHON=)"

# name layers channels heads T B V
shapes=(
  "4 layers, 128 ch, T=64, B=12, V=256|4|128|4|64|12|256"
  "6 layers, 256 ch, T=64, B=16, V=256|6|256|4|64|16|256"
  "6 layers, 384 ch, T=256, B=8, V=256|6|384|6|256|8|256"
  "12 layers, 768 ch, T=64, B=4, V=50257|12|768|12|64|4|50257"
)

strata_ms() { # L C NH T B V
  rm -rf runs/b
  cat > b.yaml <<YAML
device: cpu
model: {n_layer: $1, n_head: $3, n_embd: $2, seq_len: $4, vocab_size: $6}
data: {train: "data/train_*.bin", val: ""}
train: {steps: $((STEPS + 2)), micro_batch: $5, eval_every: 0, log_every: 1000, sample_tokens: 0, dtype: fp32}
run: {dir: runs/b, checkpoint_every: 0, checkpoint_at_end: false}
YAML
  OMP_NUM_THREADS=$THREADS "$S" train b.yaml > /dev/null
  tail -n +3 runs/b/metrics.jsonl | grep -o '"step_ms": [0-9.]*' | cut -d' ' -f2 | median
}

torch_ms() { # L C NH T B V
  OMP_NUM_THREADS=$THREADS "$PY" "$ROOT/bench/torch_cpu_gpt.py" --layers "$1" --channels "$2" --heads "$3" \
      --seq "$4" --batch "$5" --vocab "$6" --steps "$STEPS" --threads "$THREADS" --data "$shard" |
    awk '/^ms_per_step/ {print $2}'
}

{
echo "| shape | threads | Strata ms/step | PyTorch ms/step | PyTorch / Strata |"
echo "|---|---|---|---|---|"
i=0
for sh in "${shapes[@]}"; do
  i=$((i + 1))
  case " ${SHAPES:-1 2 3 4} " in *" $i "*) ;; *) continue ;; esac
  IFS='|' read -r name L C NH T Bt V <<<"$sh"
  sm=$(strata_ms "$L" "$C" "$NH" "$T" "$Bt" "$V")
  if [ -z "$torch_why" ]; then
    tm=$(torch_ms "$L" "$C" "$NH" "$T" "$Bt" "$V")
    printf "| %s | %d | %.1f | %.1f | %.2fx |\n" "$name" "$THREADS" "$sm" "$tm" "$(awk "BEGIN {print $tm / $sm}")"
  else
    printf "| %s | %d | %.1f | - | - |\n" "$name" "$THREADS" "$sm"
  fi
done
[ -z "$torch_why" ] || echo "PyTorch column empty: $torch_why"
if [ -n "${LLMC_DIR:-}" ]; then
  mkdir -p llmc/dev/data/tinyshakespeare && cd llmc
  # its main loop runs 40 steps with validation and sampling; 6 timed steps are enough
  sed 's/step <= 40/step <= 6/' "$LLMC_DIR/train_gpt2.c" > train_gpt2.c && cp -r "$LLMC_DIR/llmc" .
  gcc -Ofast -march=native -fopenmp -DOMP -Wno-unused-result train_gpt2.c -o train_gpt2 -lm
  cp "../$shard" dev/data/tinyshakespeare/tiny_shakespeare_train.bin
  cp "../$shard" dev/data/tinyshakespeare/tiny_shakespeare_val.bin
  python3 "$ROOT/bench/llmc_random_model.py" gpt2_124M.bin
  OMP_NUM_THREADS=$THREADS ./train_gpt2 > llmc.log 2>&1 || true
  ms=$(grep -o 'took [0-9.]* ms' llmc.log | tail -n +2 | awk '{print $2}' | median)
  printf "\nllm.c train_gpt2.c, 12 layers, 768 ch, T=64, B=4, %d threads: %.1f ms/step\n" "$THREADS" "$ms"
  cd ..
fi
} | tee "${OUT:-.}/bench_cpu.md"
