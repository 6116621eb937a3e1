#!/usr/bin/env bash
# TensorBoard's own reader (EventAccumulator, from the `tensorboard` package) against
# metrics.jsonl (tests/tensorboard_check.py): every scalar Strata wrote has the same steps
# and values as metrics.jsonl's rows, and the memory plan is there as text, for a run with
# validation, one without, one with its optimizer offloaded, events in a directory of
# their own, a run resumed after a clean end, a run SIGKILLed with its last record torn
# (TensorBoard reads up to it; the resume drops it and every step is there once, the
# checkpoint's own step written again from metrics.jsonl when it was the torn one), two
# ranks under mpirun (rank 0 writes them), and events on a full disk (exit 1 after a checkpoint, both records ending at the same step;
# a tmpfs where one can be mounted). The Python is $STRATA_PYTHON, else
# launcher/python-env.sh's venv, else python3; exits 77 (skip), saying so, when none of
# them has `tensorboard`.
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
check() { "$PY" "$SRC/tests/tensorboard_check.py" events "$@" || fail "TensorBoard's reader disagrees with metrics.jsonl in $1"; }
events_of() { ls "$1"/events.out.tfevents.* 2> /dev/null; }

# The events on a small disk (a tmpfs at ./small): the write that finds no room stops the
# run after a checkpoint, the file cut back to whole records and metrics.jsonl to the same
# step; once there is room, a resume goes on with every step once in both.
small_disk() {
  set +e; out=$("$S" train tiny.yaml --set run.dir=runs/full --set run.tensorboard_dir=small/tb --set train.steps=400 \
    --set run.checkpoint_every=1000 --set train.eval_every=0 2>&1); rc=$?; set -e
  [ $rc -eq 1 ] || fail "events on a full disk: exit $rc, expected 1: $(tail -3 <<<"$out")"
  ev=$(events_of small/tb)
  n=$(grep -o "stopped after step [0-9]*" <<<"$out" | grep -o "[0-9]*$") || fail "no stop message: $(tail -3 <<<"$out")"
  grep -q "step $n: $ev: write failed: No space left on device (metrics.jsonl's line of this step is taken back, so both end at step $((n - 1)))" <<<"$out" ||
    fail "the failed write is not named: $(grep -i error <<<"$out")"
  grep -q "stopped after step $n because the TensorBoard events ($ev) could not be written; step $n is saved in runs/full/ckpt/step_0*$n" <<<"$out" ||
    fail "no checkpoint after the failed write: $(grep -i error <<<"$out")"
  [ "$(tail -1 runs/full/metrics.jsonl | grep -o '"step": [0-9]*' | cut -d' ' -f2)" = $((n - 1)) ] || fail "metrics.jsonl does not end at step $((n - 1))"
  check small/tb runs/full/metrics.jsonl
  pass "events on a full disk at step $n: exit 1 naming the file and ENOSPC, step $n checkpointed, events and metrics both whole to step $((n - 1))"
  mount -o remount,size=2m small
  "$S" train tiny.yaml --set run.dir=runs/full --set run.tensorboard_dir=small/tb --set train.steps=$((n + 20)) \
    --set run.checkpoint_every=1000 --set train.eval_every=0 --resume latest > full2.log 2>&1 || fail "resume after freeing space: $(tail -3 full2.log)"
  check small/tb runs/full/metrics.jsonl
  pass "after freeing space, --resume latest goes on to step $((n + 20)): TensorBoard and metrics.jsonl agree"
}

if [ "${1:-}" = small-disk ]; then # re-entered inside a user namespace (see below)
  cd "$2"
  PY=$3
  mount -t tmpfs -o size=48k tmpfs small
  small_disk
  exit 0
fi

PY=$("$SRC/launcher/python-env.sh" --has tensorboard)
[ -n "$PY" ] || { echo "SKIP: no Python with the tensorboard package (set STRATA_PYTHON, or launcher/python-env.sh --install)"; exit 77; }
W=$(mktemp -d /tmp/strata-e2e-tensorboard.XXXXXX)
cleanup() { mountpoint -q "$W/small" 2> /dev/null && umount "$W/small"; [ -n "${KEEP:-}" ] || rm -rf "$W"; }
trap cleanup EXIT
cd "$W"
cat "$SRC"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data --val-fraction 0.1 > /dev/null
cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin", val: "data/val_*.bin"}
train: {steps: 16, micro_batch: 2, eval_every: 4, eval_batches: 2, log_every: 100, sample_tokens: 0}
optim: {lr: 3.0e-3, warmup_steps: 2}
run: {dir: runs/val, checkpoint_every: 4, keep: 0}
offload: {block_kb: 64, queue_depth: 4}
YAML

# --- with validation (before the first step too: step 0's loss/val), without, with the optimizer offloaded
"$S" train tiny.yaml --set train.eval_at_start=true > val.log 2>&1 || fail "train: $(tail -3 val.log)"
[ "$(events_of runs/val | wc -l)" = 1 ] || fail "one events file expected in runs/val: $(ls runs/val)"
head -1 runs/val/metrics.jsonl | grep -q '^{"step": 0, "val_loss"' || fail "no step 0 row: $(head -1 runs/val/metrics.jsonl)"
check runs/val runs/val/metrics.jsonl
pass "a run with validation, from step 0: TensorBoard reads what metrics.jsonl says"
"$S" train tiny.yaml --set run.dir=runs/noval --set data.val= > noval.log 2>&1 || fail "train without val: $(tail -3 noval.log)"
check runs/noval runs/noval/metrics.jsonl
pass "a run without validation"
"$S" train tiny.yaml --set run.dir=runs/offload --set offload.optimizer=cpu > offload.log 2>&1 || fail "offload: $(tail -3 offload.log)"
grep -q '"offload_d2h_bytes"' runs/offload/metrics.jsonl || fail "the offload run has no split in metrics.jsonl"
check runs/offload runs/offload/metrics.jsonl
pass "an offload run: its split figures too"

# --- events elsewhere, and none
"$S" train tiny.yaml --set run.dir=runs/elsewhere --set run.tensorboard_dir=tb/job > else.log 2>&1 || fail "tensorboard_dir: $(tail -3 else.log)"
[ -z "$(events_of runs/elsewhere)" ] && [ -n "$(events_of tb/job)" ] || fail "the events should be in tb/job alone"
check tb/job runs/elsewhere/metrics.jsonl
"$S" train tiny.yaml --set run.dir=runs/off --set run.tensorboard=false > off.log 2>&1 || fail "tensorboard off: $(tail -3 off.log)"
[ -z "$(events_of runs/off)" ] || fail "run.tensorboard: false wrote events"
pass "run.tensorboard_dir puts the events there; run.tensorboard: false writes none"

# --- a fresh run in a directory that has events replaces them
"$S" train tiny.yaml --set train.steps=6 > fresh.log 2>&1 || fail "fresh run over an old one: $(tail -3 fresh.log)"
grep -q "\[tb\] a fresh run: removed 1 TensorBoard events file an earlier run left in runs/val" fresh.log || fail "the old events were not removed, saying so"
check runs/val runs/val/metrics.jsonl
pass "a fresh run in a used run.dir replaces its events, as it does metrics.jsonl"

# --- resumed after a clean end: one continuous curve
"$S" train tiny.yaml --set run.dir=runs/res --set train.steps=8 --set train.eval_at_start=true > res1.log 2>&1
"$S" train tiny.yaml --set run.dir=runs/res --set train.steps=16 --resume latest > res2.log 2>&1 || fail "resume: $(tail -3 res2.log)"
[ "$(events_of runs/res | wc -l)" = 1 ] || fail "a resume should append to the run's events file"
check runs/res runs/res/metrics.jsonl
pass "resumed at step 8 to 16: steps 0-16 once each, the plan at 0 and at 8"

# --- the checkpoint's own step torn from the events: the resume writes it again from metrics.jsonl
ev=$(events_of runs/res)
truncate -s $(($(stat -c %s "$ev") - 7)) "$ev" # step 16's record, the run's last
"$S" train tiny.yaml --set run.dir=runs/res --set train.steps=20 --resume latest > res3.log 2>&1 || fail "resume: $(tail -3 res3.log)"
grep -q "\[tb\] steps 16-16 written again from runs/res/metrics.jsonl: a torn record had taken their events" res3.log ||
  fail "step 16's event is not written again: $(grep '\[tb\]' res3.log)"
check runs/res runs/res/metrics.jsonl
pass "step 16's event torn, resumed at 16 to 20: step 16 written again from metrics.jsonl, steps 0-20 once each"

# --- SIGKILLed mid-run with its last record torn; TensorBoard reads up to it; the resume drops it
"$S" train tiny.yaml --set run.dir=runs/kill --set train.steps=100000 --set train.eval_every=0 > kill.log 2>&1 &
pid=$!
for _ in $(seq 2000); do [ -f runs/kill/ckpt/latest ] && [ "$(wc -l < runs/kill/metrics.jsonl)" -ge 10 ] && break; sleep 0.01; done
kill -STOP $pid
kill -KILL $pid; wait $pid 2> /dev/null || true
ev=$(events_of runs/kill)
size=$(stat -c %s "$ev")
truncate -s $((size - 7)) "$ev" # the kill landed inside the last record
last=$("$PY" - "$ev" <<'PY'
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()  # a torn last record is where the reader stops, never an error
print(ea.Scalars("loss/train")[-1].step)
PY
) || fail "TensorBoard could not read the events of a killed run"
rows=$(wc -l < runs/kill/metrics.jsonl)
[ "$last" -ge $((rows - 2)) ] || fail "TensorBoard reads the killed run to step $last of $rows"
check runs/kill runs/kill/metrics.jsonl --last-step "$last"
saved=$(cat runs/kill/ckpt/latest | grep -o "[1-9][0-9]*$")
"$S" train tiny.yaml --set run.dir=runs/kill --set train.steps=$((saved + 6)) --set train.eval_every=0 --resume latest > kill2.log 2>&1 ||
  fail "resume after the kill: $(tail -3 kill2.log)"
grep -q "\[tb\] $ev: byte [0-9]* starts [a-z ]* cut short (a run killed while writing it?): the file is kept up to there" kill2.log ||
  fail "the torn record is not named: $(grep '\[tb\]' kill2.log)"
check runs/kill runs/kill/metrics.jsonl
pass "SIGKILL at step $rows with a torn last record: TensorBoard reads to step $last; resumed at $saved, every step once to $((saved + 6))"

# --- two ranks: rank 0 writes the events of the job
if command -v mpirun > /dev/null; then
  MPI=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
  [ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
  "${MPI[@]}" -np 2 "$S" train tiny.yaml --set run.dir=runs/mpi --set zero.stage=1 > mpi.log 2>&1 || fail "two ranks: $(tail -3 mpi.log)"
  [ "$(events_of runs/mpi | wc -l)" = 1 ] || fail "two ranks should write one events file: $(ls runs/mpi)"
  check runs/mpi runs/mpi/metrics.jsonl
  pass "under mpirun -np 2 at ZeRO stage 1: one events file, rank 0's, as metrics.jsonl says"
else
  echo "note: mpirun not found: the two-rank check is skipped"
fi

# --- a full disk: where a tmpfs can be mounted, as root or in a user namespace
mkdir small
if mount -t tmpfs -o size=48k tmpfs small 2> /dev/null; then
  small_disk
elif unshare -rm true 2> /dev/null; then
  unshare -rm bash "$0" small-disk "$W" "$PY"
else
  echo "note: no tmpfs can be mounted here (not root, no user namespaces): the full-disk checks are skipped"
fi
echo "all e2e_tensorboard checks passed"
