#!/usr/bin/env bash
# A device call that fails mid-step (injected with STRATA_FAULT_COPY_STEP: the step's
# first device copy, the batch upload, fails as a failed cudaMemcpyAsync would): the run
# stops with exit 1 and a message naming the step, the call and its stream; the last
# good checkpoint is untouched and resuming from it finishes the run bitwise as if
# nothing had happened. At two ranks, a fault on one rank ends the whole job at once.
set -euo pipefail
S=${STRATA:?set by ctest}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1/metrics.jsonl"; }

cat "$STRATA_SOURCE_DIR"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data --val-fraction 0.1 > /dev/null
cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin", val: "data/val_*.bin"}
train: {steps: 10, micro_batch: 4, grad_accum: 2, eval_every: 5, eval_batches: 2, log_every: 1, sample_tokens: 0}
optim: {lr: 3.0e-3, warmup_steps: 4}
run: {checkpoint_every: 2, keep: 0}
YAML

"$S" train tiny.yaml --set run.dir=runs/ref > ref.log 2>&1 || fail "reference run failed: $(tail -3 ref.log)"

set +e
STRATA_FAULT_COPY_STEP=5 "$S" train tiny.yaml --set run.dir=runs/fault > fault.log 2>&1; rc=$?
set -e
[ $rc -eq 1 ] || fail "a failed device copy should exit 1, got $rc: $(tail -5 fault.log)"
grep -q 'error: \[train\] .*step 5: .*strata_memcpy_async(m->dev, m->dev->compute, m->inputs, inputs, bytes): memcpy of [0-9]* bytes on stream "compute": injected failure (STRATA_FAULT_COPY_STEP=5)' fault.log ||
  fail "the message should name the step, the call and its stream: $(grep error fault.log)"
[ "$(cat runs/fault/ckpt/latest)" = step_00000004 ] || fail "latest should still be step 4: $(cat runs/fault/ckpt/latest)"
[ "$(losses runs/fault | wc -l)" -eq 4 ] || fail "metrics should hold steps 1-4 only: $(losses runs/fault)"
ls runs/fault/ckpt | grep -q tmp && fail "a half-written checkpoint was left: $(ls runs/fault/ckpt)"
"$S" train tiny.yaml --set run.dir=runs/fault --resume latest > resume.log 2>&1 || fail "resume failed: $(tail -3 resume.log)"
diff <(losses runs/ref) <(losses runs/fault) > /dev/null ||
  fail "resumed losses differ: $(diff <(losses runs/ref) <(losses runs/fault) | head -4)"
pass "a device copy failing in step 5: exit 1 naming step, call and stream; step 4 resumes to all 10 losses bitwise"

if command -v mpirun > /dev/null; then
  mpi=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
  [ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
  set +e
  start=$(date +%s)
  timeout 120 "${mpi[@]}" -np 1 "$S" train tiny.yaml --set run.dir=runs/w2 --set zero.stage=2 : \
    -np 1 env STRATA_FAULT_COPY_STEP=3 "$S" train tiny.yaml --set run.dir=runs/w2 --set zero.stage=2 > w2.log 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  set -e
  [ $rc -ne 124 ] || fail "two ranks: the job hung after rank 1's fault: $(tail -5 w2.log)"
  [ $rc -eq 1 ] || fail "two ranks: exit $rc, expected 1: $(tail -5 w2.log)"
  grep -q '\[rank 1\] error: \[train\] .*step 3: .*strata_memcpy_async(.*stream "compute": injected failure' w2.log ||
    fail "two ranks: rank 1 should name the call: $(grep error w2.log)"
  [ "$(cat runs/w2/ckpt/latest)" = step_00000002 ] || fail "two ranks: latest should be step 2"
  pass "two ranks, rank 1's copy fails in step 3: the job ends with exit 1 in ${took}s, step 2's checkpoint kept"
else
  echo "mpirun not found: the two-rank case is skipped"
fi
echo "all e2e_device_fault checks passed"
