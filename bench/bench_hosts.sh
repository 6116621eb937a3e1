#!/usr/bin/env bash
# A step across hosts against the same step on one host: six CPU ranks as one host (h1:6,
# shared memory between them) and as three hosts of two (TCP over veth links between network
# namespaces, tests/netns_hosts.sh), ZeRO stages 0, 1 and 3. Per row: ms per step (median
# of steps 3 on), the bytes the collectives move per rank per step (metrics.jsonl's
# comm_bytes, ring accounting, and by collective), and the bytes that crossed the hosts' links per step
# (received on every eth0, from a run of 25 steps less one of 5, over 20). Needs root,
# iproute2 and Open MPI. Prints a markdown table.
#   sudo bench/bench_hosts.sh [BUILD_DIR]      (OUT=dir also writes the table there)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$(cd "${1:-$ROOT/build}" && pwd) # the script works in a directory of its own
S=$B/strata
# shellcheck source=tests/netns_hosts.sh
source "$ROOT/tests/netns_hosts.sh"
W=$(mktemp -d /tmp/strata-bench-hosts.XXXXXX)
trap 'hosts_down; rm -rf "$W"' EXIT
trap 'exit 1' INT TERM
hosts_up 3 "sb$$" "$W"
cd "$W"
cat "$ROOT"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > h.yaml <<'YAML'
device: cpu
model: {n_layer: 4, n_head: 4, n_embd: 128, seq_len: 64, vocab_size: 256}
data: {train: "data/train_*.bin", val: ""}
train: {micro_batch: 4, eval_every: 0, log_every: 1000, sample_tokens: 0}
optim: {warmup_steps: 0, schedule: constant}
run: {dir: runs/h, checkpoint_every: 0, checkpoint_at_end: false, tensorboard: false}
YAML
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
wire() { local t=0 h; for h in h1 h2 h3; do t=$((t + $(host_rx_bytes $h))); done; echo $t; }
run() { # HOSTS STAGE STEPS
  rm -rf runs/h
  timeout 600 ./on h1 mpirun "${HOSTS_MPI[@]}" --host "$1" -np 6 "$S" train h.yaml --set zero.stage="$2" \
    --set train.steps="$3" > run.log 2>&1 || { tail -5 run.log; exit 1; }
}
{
echo "| layout | stage | ms/step (median) | collective bytes per rank per step | all-reduce / reduce-scatter / all-gather / broadcast | bytes over the links per step (all hosts) |"
echo "|---|---|---|---|---|---|"
for st in 0 1 3; do
  for hosts in h1:6 h1:2,h2:2,h3:2; do
    w0=$(wire); run "$hosts" $st 5; w1=$(wire); run "$hosts" $st 25; w2=$(wire)
    rows=$(tail -n +3 runs/h/metrics.jsonl)
    ms=$(grep -o '"step_ms": [0-9.]*' <<<"$rows" | cut -d' ' -f2 | median)
    last() { grep -o "\"$1\": [0-9]*" <<<"$rows" | tail -1 | cut -d' ' -f2; }
    bytes=$(last comm_bytes)
    kinds="$(last comm_allreduce_bytes) / $(last comm_reduce_scatter_bytes) / $(last comm_allgather_bytes) / $(last comm_broadcast_bytes)"
    layout="one host, 6 ranks"
    [ "$hosts" = h1:6 ] || layout="3 hosts x 2 ranks"
    link=$(( ((w2 - w1) - (w1 - w0)) / 20 ))
    [ $link -ge 0 ] || link=0 # a stray neighbour-discovery packet on idle links
    printf "| %s | %d | %.1f | %s | %s | %d |\n" "$layout" $st "$ms" "$bytes" "$kinds" $link
  done
done
} | tee "${OUT:-.}/bench_hosts.md"
