#!/usr/bin/env bash
# bench/bench_offload_cpu.sh: every place the optimizer state can live, on the CPU backend,
# side by side in one run: on the device, in pinned memory, on NVMe, split between the
# device and the tier (offload.optimizer_ratio), between pinned memory and NVMe
# (offload.nvme_ratio), in all three, at stage 3 with the parameter shards offloaded too, and
# with the gradients in pinned memory (offload.gradients).
# A GPT of 6 layers, 256 channels, T=64, B=4 (4.8 M parameters, a small batch so that the
# optimizer state weighs against the compute); median of steps 3-16.
# Every row must end at the same loss (the offload is exact); the table shows what each
# placement costs a step, its wait on the tier, and its disk traffic.
# Usage: [STRATA=build/strata] [NVME_DIR=/path] bench/bench_offload_cpu.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=${STRATA:-$ROOT/build/strata}
W=$(mktemp -d /tmp/strata-bench-offload-cpu.XXXXXX)
NVME_DIR=${NVME_DIR:-$W/swap}
trap 'rm -rf "$W"' EXIT
mkdir -p "$NVME_DIR"
cd "$W"
cat "$ROOT"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > ob.yaml <<YAML
device: cpu
model: {n_layer: 6, n_head: 4, n_embd: 256, seq_len: 64, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 16, micro_batch: 4, eval_every: 0, log_every: 1, sample_tokens: 0}
optim: {lr: 1.0e-3, warmup_steps: 2}
run: {dir: runs/x, checkpoint_at_end: false}
offload: {nvme_path: "$NVME_DIR"}
YAML
echo "| setting | ms/step | offload wait ms | disk read + write per step | loss at step 16 |"
echo "|---|---|---|---|---|"
row() { # label, --set...
  local label=$1; shift
  rm -rf runs/x
  STRATA_OFFLOAD_FLOOR=off "$S" train ob.yaml "$@" > run.log 2>&1 || { echo "| $label | failed: $(tail -1 run.log | cut -c1-80) | | | |"; return; }
  python3 - "$label" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open("runs/x/metrics.jsonl")]
tail = rows[2:]
ms = statistics.median(r["step_ms"] for r in tail)
wait = statistics.median(r.get("offload_wait_ms", 0) for r in tail)
disk = statistics.median(r.get("offload_disk_read_bytes", 0) + r.get("offload_disk_write_bytes", 0) for r in tail)
print(f"| {sys.argv[1]} | {ms:.1f} | {wait:.1f} | {disk / 2**20:.1f} MiB | {rows[-1]['loss']:.6f} |")
PY
}
row "stage 1, optimizer on the device" --set zero.stage=1
row "stage 1, optimizer in pinned memory (cpu)" --set zero.stage=1 --set offload.optimizer=cpu
row "stage 1, optimizer on NVMe" --set zero.stage=1 --set offload.optimizer=nvme
row "stage 1, cpu, optimizer_ratio 0.5 (half on the device)" --set zero.stage=1 --set offload.optimizer=cpu \
  --set offload.optimizer_ratio=0.5
row "stage 1, nvme, nvme_ratio 0.5 (half pinned)" --set zero.stage=1 --set offload.optimizer=nvme --set offload.nvme_ratio=0.5
row "stage 1, nvme, optimizer_ratio 0.67, nvme_ratio 0.5 (three tiers)" --set zero.stage=1 --set offload.optimizer=nvme \
  --set offload.optimizer_ratio=0.67 --set offload.nvme_ratio=0.5
row "stage 3, optimizer and parameters in pinned memory" --set zero.stage=3 --set offload.optimizer=cpu --set offload.params=cpu
row "stage 3, optimizer and parameters on NVMe" --set zero.stage=3 --set offload.optimizer=nvme --set offload.params=nvme
# one rank's gradients in pinned memory too (offload.gradients: cpu): copied out after each
# backward; with accumulation, back in before each micro-step's
row "stage 1, optimizer and gradients in pinned memory" --set zero.stage=1 --set offload.optimizer=cpu \
  --set offload.gradients=cpu
row "stage 3, optimizer, parameters and gradients in pinned memory" --set zero.stage=3 --set offload.optimizer=cpu \
  --set offload.params=cpu --set offload.gradients=cpu
