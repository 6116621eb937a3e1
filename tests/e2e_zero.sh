#!/usr/bin/env bash
# ZeRO across MPI ranks on the CPU backend:
#  - the engine test (equivalence, memory formulas, bytes moved, overlap) at world 2, 3, 4;
#  - resharding: a checkpoint from world 4 stage 3 resumes at world 2 stage 1 and at
#    world 1 stage 0 with the next-step loss of the world-4 run that kept going;
#  - failure: a rank with an unreadable data file, and a rank killed with SIGKILL
#    mid-step, each end the job non-zero within 30 s, the last checkpoint still loads.
set -euo pipefail
S=${STRATA:?set by ctest}
command -v mpirun > /dev/null || { echo "mpirun not found: skipping"; exit 77; }
MPI=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
MPI+=(-x OMP_NUM_THREADS=1)
W=$(mktemp -d /tmp/strata-e2e-zero.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }

for n in 2 3 4; do
  "${MPI[@]}" -np $n "$STRATA_BUILD_DIR/tests/test_engine" > engine$n.log 2>&1 || { cat engine$n.log; fail "test_engine at world $n"; }
  grep -q "FAIL" engine$n.log && { cat engine$n.log; fail "test_engine at world $n"; }
  pass "test_engine at world $n: $(grep -c PASS engine$n.log) ranks passed"
done

cat "$STRATA_SOURCE_DIR"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > z.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin", val: "data/val_*.bin"}
train: {steps: 11, micro_batch: 2, eval_every: 0, log_every: 1, sample_tokens: 0}
optim: {lr: 1.0e-3, warmup_steps: 2}
run: {dir: runs/w4, checkpoint_every: 10, keep: 0}
zero: {stage: 3}
YAML
# world 4 x micro-batch 2 = world 2 x 4 = world 1 x 8: the same tokens per step
"${MPI[@]}" -np 4 "$S" train z.yaml > w4.log
loss_at() { grep "\"step\": $2," "$1/metrics.jsonl" | grep -o '"loss": [^,]*' | cut -d' ' -f2; }
ref=$(loss_at runs/w4 11)
mkdir -p runs/w2/ckpt runs/w1/ckpt
cp -r runs/w4/ckpt/step_00000010 runs/w2/ckpt/ && cp -r runs/w4/ckpt/step_00000010 runs/w1/ckpt/
"${MPI[@]}" -np 2 "$S" train z.yaml --set run.dir=runs/w2 --set zero.stage=1 --set train.micro_batch=4 --resume latest > w2.log
"$S" train z.yaml --set run.dir=runs/w1 --set zero.stage=0 --set train.micro_batch=8 --resume latest > w1.log
for w in w2 w1; do
  got=$(loss_at runs/$w 11)
  python3 -c "import sys; a,b=float('$ref'),float('$got'); sys.exit(0 if abs(a-b)<=1e-5*abs(a) else 1)" \
    || fail "$w: step 11 loss $got vs world-4 $ref"
done
pass "world 4 stage 3 checkpoint resumed at world 2 stage 1 and world 1 stage 0: step 11 loss $ref"

# a rank whose data file is unreadable ends the whole job, with that rank's message (the
# same shard names and sizes as the others', which the ranks compare at start; root reads
# any file, so for root the copy is damaged instead: another magic)
mkdir -p bad && cp data/train_000000.bin data/tokenizer.json bad/
if [ "$(id -u)" -eq 0 ]; then printf 'XXXX' | dd of=bad/train_000000.bin bs=1 conv=notrunc 2>/dev/null
else chmod 000 bad/train_000000.bin; fi
bad_glob="bad/train_*.bin"
start=$(date +%s)
set +e
out=$("${MPI[@]}" -np 1 "$S" train z.yaml --set run.dir=runs/f1 --set zero.stage=2 : \
      -np 1 "$S" train z.yaml --set run.dir=runs/f1 --set zero.stage=2 --set "data.train=$bad_glob" 2>&1); rc=$?
set -e
took=$(( $(date +%s) - start ))
[ $rc -ne 0 ] || fail "a rank with bad data should fail the job"
[ $took -le 30 ] || fail "the job took $took s to end"
grep -q "\[rank 1\] error: \[train\] opening the training data" <<<"$out" || fail "rank 1's message missing: $out"
pass "unreadable data on rank 1: job ended with exit $rc in ${took}s"

# SIGKILL one rank mid-step: the job ends, the last checkpoint loads
"${MPI[@]}" -np 2 "$S" train z.yaml --set run.dir=runs/k --set train.steps=100000 --set run.checkpoint_every=5 > k.log 2>&1 &
mpipid=$!
for _ in $(seq 600); do [ -f runs/k/ckpt/latest ] && break; sleep 0.05; done
[ -f runs/k/ckpt/latest ] || fail "no checkpoint before the kill"
victim=$(pgrep -f "strata train z.yaml --set run.dir=runs/k" | grep -v "^$mpipid$" | tail -1)
start=$(date +%s)
kill -KILL "$victim"
set +e; wait $mpipid; rc=$?; set -e
took=$(( $(date +%s) - start ))
[ $rc -ne 0 ] || fail "killing a rank should fail the job"
[ $took -le 30 ] || fail "the job took $took s to end after the kill"
"$S" sample runs/k --tokens 5 > /dev/null || fail "the last checkpoint does not load after the kill"
pass "SIGKILL of a rank: job ended with exit $rc in ${took}s, $(cat runs/k/ckpt/latest) loads"
echo "all e2e_zero checks passed"
