#!/usr/bin/env bash
# CPU training throughput: the quickstart model and a GPT-2 124M-shaped model (12 layers,
# 768 channels, vocab 50257, B=4, T=64 as llm.c's train_gpt2.c uses), fp32, one rank.
# With LLMC_DIR pointing at an llm.c checkout, also runs its train_gpt2.c on the same shape
# (random weights in its checkpoint format) for a side-by-side per-token comparison.
#   bench/bench_cpu.sh [BUILD_DIR]        (OUT=dir also writes the table there)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build}
S=$B/strata
THREADS=${OMP_NUM_THREADS:-$(nproc)}
W=$(mktemp -d /tmp/strata-bench-cpu.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
cat "$ROOT"/core/*.c "$ROOT"/core/*.h > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
row() { # name steps args...
  local name=$1 steps=$2; shift 2
  rm -rf runs/b
  OMP_NUM_THREADS=$THREADS "$S" train "$@" --set train.steps=$steps --set run.dir=runs/b --set run.checkpoint_every=0 \
      --set train.eval_every=0 --set train.sample_tokens=0 --set data.train='data/train_*.bin' --set data.val= \
      --set device=cpu > /dev/null
  local rows; rows=$(tail -n +3 runs/b/metrics.jsonl)
  local ms; ms=$(grep -o '"step_ms": [0-9.]*' <<<"$rows" | cut -d' ' -f2 | median)
  local tps; tps=$(grep -o '"tokens_per_s": [0-9.]*' <<<"$rows" | cut -d' ' -f2 | median)
  printf "| %s | %d | %.1f | %.0f |\n" "$name" "$THREADS" "$ms" "$tps"
}
{
echo "| run | threads | ms/step (median) | tokens/s |"
echo "|---|---|---|---|"
row "strata quickstart (0.8M, B16 T128)" 30 "$ROOT/configs/quickstart.yaml"
row "strata GPT-2 124M shape (B4 T64)" 8 "$ROOT/configs/gpt2-124m.yaml" --set train.micro_batch=4 --set train.seq_len=64 \
    --set train.dtype=fp32
if [ -n "${LLMC_DIR:-}" ]; then
  mkdir -p llmc/dev/data/tinyshakespeare && cd llmc
  # its main loop runs 40 steps with validation and sampling; 6 timed steps are enough
  sed 's/step <= 40/step <= 6/' "$LLMC_DIR/train_gpt2.c" > train_gpt2.c && cp -r "$LLMC_DIR/llmc" .
  gcc -Ofast -march=native -fopenmp -DOMP -Wno-unused-result train_gpt2.c -o train_gpt2 -lm
  cp ../data/train_000000.bin dev/data/tinyshakespeare/tiny_shakespeare_train.bin
  cp ../data/train_000000.bin dev/data/tinyshakespeare/tiny_shakespeare_val.bin
  python3 "$ROOT/bench/llmc_random_model.py" gpt2_124M.bin
  OMP_NUM_THREADS=$THREADS ./train_gpt2 > llmc.log 2>&1 || true
  ms=$(grep -o 'took [0-9.]* ms' llmc.log | tail -n +2 | awk '{print $2}' | median)
  printf "| llm.c train_gpt2.c GPT-2 124M (B4 T64) | %d | %.1f | %.0f |\n" "$THREADS" "$ms" "$(python3 -c "print(256/($ms/1000))")"
  cd ..
fi
} | tee "${OUT:-.}/bench_cpu.md"
