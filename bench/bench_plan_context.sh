#!/usr/bin/env bash
# bench/bench_plan_context.sh: what a long context asks of the GPU, by `strata plan` (no GPU
# needed). Llama 3.1 8B's shape (32 layers, 4096 channels, MLP 14336, vocab 128256), one
# sequence a micro-step, bf16, every block recomputed, the optimizer offloaded: the
# activations the device holds at each context length as is, then adding in turn the head
# in chunks (train.logits_chunk_mb), the MLPs in chunks (train.mlp_chunk_mb) and the
# residual streams in pinned memory (offload.activations); then, for an 80 GB GPU and a
# 24 GB one with 120 GiB of host memory (and a disk for the 24 GB one), the change the
# ladder names at each length. The README's long-context table is its first table.
# Usage: [STRATA=build/strata] [CONTEXTS="4096 ... 131072"] bench/bench_plan_context.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=${STRATA:-$ROOT/build/strata}
CONTEXTS=${CONTEXTS:-4096 16384 32768 65536 131072}
W=$(mktemp -d /tmp/strata-bench-plan-context.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
cat > ctx.yaml <<'YAML'
device: cuda
model: {arch: llama, n_layer: 32, n_head: 32, n_kv_head: 8, n_embd: 4096, intermediate_size: 14336,
        vocab_size: 128256, seq_len: 4096, tie_embeddings: false, rope_theta: 500000}
data: {train: "data/train_*.bin"}
train: {steps: 20, micro_batch: 1, dtype: bf16, activation_checkpointing: blocks}
offload: {optimizer: cpu}
YAML
plan() { CUDA_VISIBLE_DEVICES='' "$S" plan ctx.yaml "$@" 2>&1 || true; }
# the activations column of the device row
acts() { plan --gpu-gb 1000 --host-gb 1000 "$@" | awk '$1 == "device" && NF > 8 {print $8, $9}'; }
echo "Llama 3.1 8B's shape, B=1, every block recomputed, optimizer offloaded: activations on the device"
echo "(each column adds its setting to the one before)"
echo
echo "| context | as is | + train.logits_chunk_mb: 256 | + train.mlp_chunk_mb: 256 | + offload.activations: cpu |"
echo "|---|---|---|---|---|"
for T in $CONTEXTS; do
  c=(--set "model.seq_len=$T")
  a0=$(acts "${c[@]}")
  c+=(--set train.logits_chunk_mb=256); a1=$(acts "${c[@]}")
  c+=(--set train.mlp_chunk_mb=256); a2=$(acts "${c[@]}")
  c+=(--set offload.activations=cpu); a3=$(acts "${c[@]}")
  echo "| $T | $a0 | $a1 | $a2 | $a3 |"
done
echo
echo "The change the ladder names (strata plan CONFIG --gpu-gb G --host-gb 120 [--nvme-gb 1000 with a disk]):"
echo
echo "| context | 80 GB GPU | 24 GB GPU, a disk for the optimizer state |"
echo "|---|---|---|"
mkdir -p swap
for T in $CONTEXTS; do
  s80=$(plan --set "model.seq_len=$T" --gpu-gb 80 --host-gb 120 |
        sed -n 's/^  verdict: fits$/fits as it is/p; s/^  cheapest change that fits[^:]*: //p' | head -1)
  s24=$(plan --set "model.seq_len=$T" --gpu-gb 24 --host-gb 120 --nvme-gb 1000 --set "offload.nvme_path=$W/swap" |
        sed -n 's/^  verdict: fits$/fits as it is/p; s/^  cheapest change that keeps the optimizer.s numerics[^:]*: //p; s/^  cheapest change that fits (about [^;]*): //p' | head -1)
  echo "| $T | ${s80:-nothing fits} | ${s24:-nothing fits} |"
done
