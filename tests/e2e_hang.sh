#!/usr/bin/env bash
# A run that stops making progress ends by itself (launcher/watchdog.c), with exit 5, what it
# was in and the checkpoint to resume from, and that checkpoint resumes bitwise:
#  - STRATA_FAULT_HANG_STEP=4 makes step 4 wait for a stream that never gets there (as a
#    kernel that never ends, or a lost device, would); with run.hang_timeout_s 2 the run
#    ends within seconds, naming step 4 and the checkpoint of step 2;
#  - with run.hang_timeout_s auto (20 x the longest step so far; STRATA_WATCHDOG_MIN_S
#    lowers its 20-minute floor to 3 s here) the same at step 36; a run that does not hang
#    is never ended by it (with a 5 s floor: CI's loaded cores may stall a step a second);
#  - a memory.auto trial step that hangs is ended the same way;
#  - under mpirun -np 2 both ranks end, and so does the job;
#  - the resume from the last checkpoint gives the uninterrupted run's losses.
set -euo pipefail
S=${STRATA:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-hang.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1/metrics.jsonl"; }

head -c 60000 "$STRATA_SOURCE_DIR/core/model.c" > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > h.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 10, micro_batch: 2, eval_every: 0, log_every: 1, sample_tokens: 0}
optim: {lr: 3.0e-3, warmup_steps: 2}
run: {dir: runs/full, checkpoint_every: 2}
YAML
"$S" train h.yaml > full.log 2>&1 || fail "the run without a hang: $(tail -3 full.log)"

# ends_hung NAME STEP SAVED SECONDS: the run in NAME.log ended with exit 5 within SECONDS,
# naming step STEP and the checkpoint of step SAVED
ends_hung() {
  local name=$1 step=$2 saved=$3 limit=$4 rc took
  rc=$(cat "$name.rc")
  took=$(cat "$name.s")
  [ "$rc" -eq 5 ] || fail "$name: exit $rc, expected 5: $(tail -3 "$name.log")"
  awk -v t="$took" -v l="$limit" 'BEGIN { exit !(t < l) }' || fail "$name: took $took s, more than $limit"
  grep -q "no progress for .*This rank was in a training step (step $step)\. The last checkpoint, step $saved (.*/ckpt/step_$(printf %08d "$saved")), is intact" "$name.log" ||
    fail "$name: the message should name step $step and the checkpoint of step $saved: $(tail -2 "$name.log")"
}
timed() { # NAME CMD...: runs CMD, keeps its exit code and seconds in NAME.rc and NAME.s
  local name=$1 t0 rc
  shift
  t0=$(date +%s.%N)
  set +e
  "$@" > "$name.log" 2>&1
  rc=$?
  set -e
  echo "$rc" > "$name.rc"
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f\n", b - a }' > "$name.s"
}

timed fixed env STRATA_FAULT_HANG_STEP=4 "$S" train h.yaml --set run.dir=runs/fixed --set run.hang_timeout_s=2
ends_hung fixed 4 2 30
grep -q '"step": 3,' runs/fixed/metrics.jsonl && ! grep -q '"step": 4,' runs/fixed/metrics.jsonl ||
  fail "fixed: metrics.jsonl should end at step 3: $(tail -1 runs/fixed/metrics.jsonl)"
"$S" train h.yaml --set run.dir=runs/fixed --resume latest > resume.log 2>&1 || fail "resume: $(tail -3 resume.log)"
[ "$(losses runs/fixed)" = "$(losses runs/full)" ] || fail "the resumed run's losses differ from the uninterrupted run's"
pass "a step that hangs ends the run in $(cat fixed.s) s with exit 5, naming step 4 and the checkpoint of step 2, which resumes bitwise"

# steps long enough for the watchdog's polls (a tenth of its limit) to see them
long=(--set model.n_layer=4 --set model.n_embd=128 --set train.micro_batch=8 --set train.steps=40 --set run.checkpoint_every=10)
timed auto env STRATA_FAULT_HANG_STEP=36 STRATA_WATCHDOG_MIN_S=3 "$S" train h.yaml --set run.dir=runs/auto "${long[@]}"
ends_hung auto 36 30 60
grep -q "run.hang_timeout_s auto allows [0-9]* s: 20 x the longest step so far" auto.log ||
  fail "auto: the message should say auto's limit: $(tail -1 auto.log)"
STRATA_WATCHDOG_MIN_S=5 "$S" train h.yaml --set run.dir=runs/nohang "${long[@]}" > nohang.log 2>&1 ||
  fail "a run that does not hang, under auto with a 5 s floor: $(tail -3 nohang.log)"
pass "auto (20 x the longest step, floor lowered to 3 s): a hang at step 36 ends in $(cat auto.s) s; 40 steps without one run to the end"

# memory.auto's trial steps (before the run's first) are watched too: a trial's step 2 hangs
timed trial env STRATA_FAULT_HANG_STEP=2 "$S" train h.yaml --set run.dir=runs/trial --set memory.gpu_gb=0.0008 \
  --set memory.auto=true --set run.hang_timeout_s=2
[ "$(cat trial.rc)" -eq 5 ] && grep -q "This rank was in a trial step of memory.auto (step 2)\. No checkpoint was written yet" trial.log ||
  fail "a hung memory.auto trial: exit $(cat trial.rc): $(tail -2 trial.log)"
pass "a memory.auto trial step that hangs ends the run in $(cat trial.s) s with exit 5, naming the trial's step"

if command -v mpirun > /dev/null; then
  MPI=(mpirun --oversubscribe -x OMP_NUM_THREADS=1 -x STRATA_FAULT_HANG_STEP=3)
  [ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
  timed mpi "${MPI[@]}" -np 2 "$S" train h.yaml --set run.dir=runs/mpi --set run.hang_timeout_s=2
  [ "$(cat mpi.rc)" -ne 0 ] && awk -v t="$(cat mpi.s)" 'BEGIN { exit !(t < 60) }' ||
    fail "2 ranks: the job should end by itself: exit $(cat mpi.rc) after $(cat mpi.s) s: $(tail -3 mpi.log)"
  grep -q "no progress for .*step 3" mpi.log || fail "2 ranks: no rank said why: $(tail -5 mpi.log)"
  pass "2 ranks hung at step 3 under mpirun: the job ends in $(cat mpi.s) s (exit $(cat mpi.rc))"
fi
