#!/usr/bin/env bash
# bench/bench_plan_memory.sh: `strata plan` against the memory a run really holds, on the
# CPU backend (where device memory is host memory). For each setting: the plan's host
# total (the "= host" line of `strata plan`: device, pinned and host tiers together)
# against each rank's peak resident set (VmHWM, as /usr/bin/time's %M reports it at exit),
# (the ratio is against the run's plan to the byte, which strata plan prints rounded)
# over a run of 3 steps that evaluates, saves a checkpoint and samples a few tokens at its
# end, so the peak covers a save, an eval and sampling as well as the steps.
# A GPT of 8 layers, 1024 channels, byte vocabulary, T=64, B=1: 101 M parameters, plans
# of 1.2-2.4 GiB per rank (each run takes 10-40 s on 2 cores and 24 GiB).
# With BASE=<an older strata> each row also runs that binary and shows its peak against
# its own plan (the run's metrics: planned device + pinned bytes), to compare.
# Usage: [STRATA=build/strata] [BASE=old/strata] [NVME_DIR=/path] bench/bench_plan_memory.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=${STRATA:-$ROOT/build/strata}
BASE=${BASE:-}
TIME=/usr/bin/time
[ -x "$TIME" ] || { echo "needs GNU time at $TIME (apt-get install time)"; exit 1; }
W=$(mktemp -d /tmp/strata-bench-plan-memory.XXXXXX)
NVME_DIR=${NVME_DIR:-$W/swap}
trap 'rm -rf "$W"' EXIT
mkdir -p "$NVME_DIR"
cd "$W"
cat "$ROOT"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > pm.yaml <<YAML
device: cpu
model: {n_layer: 8, n_head: 8, n_embd: 1024, seq_len: 64, vocab_size: 256}
data: {train: "data/train_*.bin", val: "data/val_*.bin"}
train: {steps: 3, micro_batch: 1, eval_every: 3, eval_batches: 2, log_every: 1, sample_tokens: 16}
run: {dir: runs/x, checkpoint_every: 3}
offload: {nvme_path: "$NVME_DIR"}
YAML
MPI=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)

# runs BINARY WORLD --set...: trains, leaving each rank's "maxrss_kb N" in time.log;
# prints the largest in bytes, or "failed"
peak() {
  local bin=$1 n=$2; shift 2
  rm -rf runs/x time.log
  if [ "$n" -eq 1 ]; then
    "$TIME" -a -o time.log -f "maxrss_kb %M" "$bin" train pm.yaml "$@" > run.log 2>&1 || { echo failed; return; }
  else
    "${MPI[@]}" -np "$n" "$TIME" -a -o time.log -f "maxrss_kb %M" "$bin" train pm.yaml "$@" > run.log 2>&1 < /dev/null ||
      { echo failed; return; }
  fi
  grep -q "saved runs/x/ckpt/step_00000003" run.log || { echo failed; return; }
  awk '$1 == "maxrss_kb" && $2 > m {m = $2} END {printf "%.0f\n", m * 1024}' time.log
}
# the run's own plan from its metrics (rank 0): device + pinned bytes
run_plan() {
  python3 -c 'import json; r = json.loads(open("runs/x/metrics.jsonl").readline()); print(r["plan_device_bytes"] + r["plan_pinned_bytes"])'
}
gib() { python3 -c "print(f'{$1 / 2**30:.3f}')"; }

echo "| setting | world | planned (strata plan) | peak RSS, largest rank | peak / plan |$([ -n "$BASE" ] && echo " before: plan, peak, peak / plan |")"
echo "|---|---|---|---|---|$([ -n "$BASE" ] && echo "---|")"
row() { # label world --set...
  local label=$1 n=$2; shift 2
  local total planned got extra=""
  total=$("$S" plan pm.yaml --world "$n" "$@" | awk '$1 == "=" && $2 == "host" {print $3, $4}')
  planned=$(python3 -c "v, u = '$total'.split(); print(int(float(v) * {'B': 1, 'KiB': 2**10, 'MiB': 2**20, 'GiB': 2**30}[u]))")
  got=$(peak "$S" "$n" "$@")
  # the ratio is taken against the run's own plan, to the byte; strata plan printed the
  # same to its rounding (else the row says so)
  if [ "$got" != failed ]; then
    local exact
    exact=$(run_plan)
    python3 -c "import sys; sys.exit(abs($exact - $planned) > 0.005 * $exact)" ||
      total="$total (the run planned $(gib "$exact") GiB)"
    planned=$exact
  fi
  if [ -n "$BASE" ]; then
    local bgot bplan
    bgot=$(peak "$BASE" "$n" "$@")
    if [ "$bgot" = failed ]; then extra=" failed: $(grep -m1 -i "error\|abort" run.log | cut -c1-60) |"
    else bplan=$(run_plan); extra=" $(gib "$bplan") GiB, $(gib "$bgot") GiB, $(python3 -c "print(f'{$bgot / $bplan:.3f}')") |"; fi
  fi
  if [ "$got" = failed ]; then
    echo "| $label | $n | $total | failed: $(tail -1 run.log | cut -c1-60) | |$extra"
  else
    echo "| $label | $n | $total | $(gib "$got") GiB | $(python3 -c "print(f'{$got / $planned:.3f}')") |$extra"
  fi
}
row "stage 0" 1 --set zero.stage=0
row "stage 3" 1 --set zero.stage=3
row "stage 0, optimizer in pinned memory" 1 --set offload.optimizer=cpu
row "stage 0, optimizer on NVMe" 1 --set offload.optimizer=nvme
row "stage 3, optimizer and parameters on NVMe" 1 --set zero.stage=3 --set offload.optimizer=nvme --set offload.params=nvme
row "stage 0" 2 --set zero.stage=0
row "stage 1" 2 --set zero.stage=1
row "stage 2" 2 --set zero.stage=2
row "stage 3" 2 --set zero.stage=3
row "stage 1, optimizer in pinned memory" 2 --set zero.stage=1 --set offload.optimizer=cpu
