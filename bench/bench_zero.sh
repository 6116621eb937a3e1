#!/usr/bin/env bash
# ZeRO on the CPU backend: step time and bytes moved per rank per stage, at world 1, 2, 4,
# with and without overlap of collectives and backward. Prints a markdown table.
#   bench/bench_zero.sh [BUILD_DIR]      (OUT=dir also writes the table there)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build}
S=$B/strata
MPI=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
W=$(mktemp -d /tmp/strata-bench-zero.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
cat "$ROOT"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > z.yaml <<'YAML'
device: cpu
model: {n_layer: 6, n_head: 4, n_embd: 256, seq_len: 64, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 12, micro_batch: 8, eval_every: 0, log_every: 100, sample_tokens: 0}
run: {dir: runs/z, checkpoint_every: 0}
YAML
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
{
echo "| world | stage | overlap | step ms (median) | bytes sent per rank per step | comm wait ms | tokens/s |"
echo "|---|---|---|---|---|---|---|"
for n in 1 2 4; do
  for st in 0 1 2 3; do
    for ov in true false; do
      [ $n -eq 1 ] && [ $ov = false ] && continue
      rm -rf runs/z
      # the global batch stays 32 sequences: micro-batch 32/n
      args=(train z.yaml --set zero.stage=$st --set zero.overlap_comm=$ov --set train.micro_batch=$((32 / n)))
      if [ $n -eq 1 ]; then OMP_NUM_THREADS=1 "$S" "${args[@]}" > /dev/null; else "${MPI[@]}" -np $n "$S" "${args[@]}" > /dev/null; fi
      rows=$(tail -n +3 runs/z/metrics.jsonl)   # skip warm-up steps
      ms=$(grep -o '"step_ms": [0-9.]*' <<<"$rows" | cut -d' ' -f2 | median)
      wait=$(grep -o '"comm_wait_ms": [0-9.]*' <<<"$rows" | cut -d' ' -f2 | median)
      bytes=$(grep -o '"comm_bytes": [0-9]*' <<<"$rows" | tail -1 | cut -d' ' -f2)
      tps=$(grep -o '"tokens_per_s": [0-9.]*' <<<"$rows" | cut -d' ' -f2 | median)
      printf "| %d | %d | %s | %.1f | %s | %.1f | %.0f |\n" $n $st $ov "$ms" "$bytes" "$wait" "$tps"
    done
  done
done
} | tee "${OUT:-.}/bench_zero.md"
