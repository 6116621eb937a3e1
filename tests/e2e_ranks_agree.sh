#!/usr/bin/env bash
# End to end under mpirun (issue 31 item 9): ranks started with different configs, data or
# tokenizers are refused at start, before any collective work, with exit 2 and one line
# from rank 0 naming the ranks and the keys with both values, instead of hanging
# (train.steps), aborting inside MPI (model.n_layer, zero.stage) or training on silently
# (optim.lr). What may differ per machine (data at another path with the same shards,
# train.threads) still trains.
set -euo pipefail
S=${STRATA:?set by ctest}
command -v mpirun > /dev/null || { echo "mpirun not found: skipping"; exit 77; }
MPI=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
W=$(mktemp -d /tmp/strata-e2e-ranks-agree.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
# two ranks, each with its own command line: rank 0 gets $A, rank 1 gets $B
two() { set +e; out=$(timeout 120 "${MPI[@]}" -np 1 "$S" train r.yaml $A : -np 1 "$S" train r.yaml $B 2>&1); rc=$?; set -e; }
expect() { # CODE TEXT WHAT
    [ "$rc" -eq "$1" ] || fail "$3: exit $rc, expected $1: $out"
    grep -qF -- "$2" <<<"$out" || fail "$3: message lacks '$2': $out"
    pass "$3"
}

cat "$STRATA_SOURCE_DIR"/core/*.h > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null 2>&1
cp -r data copy                                   # the same shards at another path
mkdir more && cp data/*.bin more/ && cp data/train_000000.bin more/train_000001.bin # one shard more
mkdir tok && cp data/*.bin tok/                   # the same shards, another tokenizer
sed 's/"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false/"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":true/' \
    data/tokenizer.json > tok/tokenizer.json
cat > r.yaml <<'YAML'
device: cpu
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 256}
data: {train: "data/train_*.bin", val: ""}
train: {steps: 10, micro_batch: 2, eval_every: 0, log_every: 5, sample_tokens: 0}
run: {dir: runs/m, checkpoint_every: 0, checkpoint_at_end: false}
comm: {timeout_s: 60}
YAML

A="" B="--set train.steps=12 --set optim.lr=0.002"; two
expect 2 "rank 1's config differs from rank 0's (rank 0's first): train.steps 10 vs 12, optim.lr 0.0003 vs 0.002" \
    "train.steps and optim.lr differ: refused, not a hang"
[ ! -d runs ] || fail "a refused start must not touch run.dir"
A="" B="--set model.n_layer=2 --set zero.stage=1"; two
expect 2 "rank 1's config differs from rank 0's (rank 0's first): model.n_layer 1 vs 2, zero.stage 0 vs 1" \
    "model.n_layer and zero.stage differ: refused, not an abort inside MPI"
A="" B="--set data.train=more/train_*.bin"; two
expect 2 "rank 1's data.train differs from rank 0's (rank 0's first): 1 file of" "a shard more on rank 1"
grep -q "vs 2 files of" <<<"$out" || fail "the data message names both shard lists: $out"
A="" B="--set data.train=tok/train_*.bin"; two
expect 2 "rank 1's tokenizer differs from rank 0's (rank 0's first): 256 tokens (digest" "another tokenizer on rank 1"
A="--set train.steps=12" B=""
set +e; out=$(timeout 120 "${MPI[@]}" -np 1 "$S" train r.yaml $A : -np 2 "$S" train r.yaml $B 2>&1); rc=$?; set -e
expect 2 "ranks 1, 2: the config differs from rank 0's (rank 0's first): train.steps 12 vs 10" "three ranks: the two that differ, named together"
[ "$(grep -c "differs from rank 0's" <<<"$out")" = 1 ] || fail "one line for the ranks with the same difference: $out"
A="" B="--set data.train=copy/train_*.bin --set train.threads=1"; two
expect 0 "step     10/10" "the same shards at another path and another train.threads train"
echo "PASS"
