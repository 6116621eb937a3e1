#!/usr/bin/env bash
# The run directory and the files a run leaves, when runs collide, disks fill and ranks die:
#  - a second `strata train` on a run.dir in use is refused (exit 2, naming the holder's pid
#    and host), at one rank and under mpirun; a SIGKILLed run does not leave the lock stuck;
#  - metrics.jsonl on a full disk: exit 1 naming the file and errno, a checkpoint attempt,
#    the last good checkpoint intact; a resume cuts metrics back so every step is there once
#    (full disks are real: /dev/full for ENOSPC everywhere, and a small tmpfs where one can
#    be mounted, directly or in a user namespace);
#  - unfinished ckpt/step_N.tmp of a killed save are removed at start, saying so;
#  - a resume of a run already at train.steps says so and exits 0;
#  - a stale NVMe swap file of a killed run is removed and named; a live one is named;
#  - a rank SIGKILLed under mpirun: the survivor names it and what it was doing.
set -euo pipefail
S=${STRATA:?set by ctest}
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1/metrics.jsonl"; }
# every line of a metrics file is one JSON object, and steps run 1..N once each, in order
metrics_ok() {
  python3 - "$1" "$2" <<'PY' || fail "$1 is not one JSON object per step 1..$2"
import json, sys
steps = [json.loads(line)["step"] for line in open(sys.argv[1])]
sys.exit(0 if steps == list(range(1, int(sys.argv[2]) + 1)) else 1)
PY
}

# The full-disk part, in a directory with a small tmpfs mounted at ./small (see the end).
small_disk() {
  # metrics.jsonl fills the disk mid-line; the checkpoint attempt fails too, the last good
  # one (step 8) stays; once space is free a resume cleans up and finishes every step once.
  # 40 steps: the free space a resume needs to rewrite metrics holds about as many rows again.
  # The TensorBoard events stay off here, so metrics.jsonl alone fills the disk (their own
  # full disk is e2e_tensorboard.sh's).
  "$S" train tiny.yaml --set run.dir=runs/ref40 --set train.steps=40 > /dev/null
  mkdir -p small/r/ckpt && cp -r runs/ref40/ckpt/step_00000008 small/r/ckpt/ && echo step_00000008 > small/r/ckpt/latest
  head -8 runs/ref40/metrics.jsonl > small/r/metrics.jsonl
  cp runs/ref40/tokenizer.json runs/ref40/lock small/r/
  pages=$(( ($(stat -c %s small/r/metrics.jsonl) + 4095) / 4096 ))
  dd if=/dev/zero of=small/spacer bs=4096 count=$pages 2> /dev/null
  dd if=/dev/zero of=small/fill bs=4096 2> /dev/null || true # until the disk is full
  rm small/spacer # room for the resume's rewrite of metrics, then a few rows more
  set +e; out=$("$S" train tiny.yaml --set run.dir=small/r --set train.steps=40 --set run.checkpoint_every=100 \
    --set run.tensorboard=false --resume latest 2>&1); rc=$?; set -e
  [ $rc -eq 1 ] || fail "full disk: exit $rc, expected 1: $(grep -v '^ ' <<<"$out" | tail -5)"
  grep -q "writing small/r/metrics.jsonl failed: No space left on device (errno 28)" <<<"$out" || fail "full disk message: $(grep -v "^ " <<<"$out")"
  grep -q "and the checkpoint of this step failed too" <<<"$out" || fail "full disk: the checkpoint attempt is not reported: $out"
  [ "$(cat small/r/ckpt/latest)" = step_00000008 ] || fail "full disk: latest is $(cat small/r/ckpt/latest)"
  "$S" sample small/r --tokens 5 > /dev/null || fail "full disk: the last good checkpoint does not load"
  stopped=$(tail -1 small/r/metrics.jsonl | grep -o '"step": [0-9]*' | cut -d' ' -f2)
  metrics_ok small/r/metrics.jsonl "$stopped"
  pass "full disk at step $((stopped + 1)): exit 1 naming metrics.jsonl and ENOSPC; the checkpoint attempt failed, step 8 intact, metrics whole to step $stopped"
  rm small/fill
  "$S" train tiny.yaml --set run.dir=small/r --set train.steps=40 --set run.keep=1 --set run.tensorboard=false \
    --resume latest > resumed.log 2>&1 ||
    fail "resume after freeing space: $(tail -3 resumed.log)"
  grep -q "removed 1 unfinished checkpoint that a run killed while saving left in small/r/ckpt: step_0*$((stopped + 1)).tmp" resumed.log ||
    fail "the failed save's step_N.tmp was not cleaned, saying so: $(grep -i ckpt resumed.log)"
  metrics_ok small/r/metrics.jsonl 40
  [ -z "$(find small/r -name '*.tmp*')" ] || fail "temporary files left: $(find small/r -name '*.tmp*')"
  diff <(losses runs/ref40) <(losses small/r) > /dev/null || fail "losses after the full disk differ from the uninterrupted run"
  pass "after freeing space, --resume latest: every step 1-40 once, losses bitwise those of the uninterrupted run, no .tmp left"

  rm -rf small/r
  # a stale swap file on a disk that is otherwise full: without removing it nothing fits
  mkdir -p small/swap
  "$S" train tiny.yaml --set run.dir=runs/s1 --set offload.optimizer=nvme --set offload.nvme_path=small/swap \
    --set train.steps=100000 --set run.checkpoint_every=0 > s1.log 2>&1 &
  pid=$!
  for _ in $(seq 1000); do [ -s runs/s1/metrics.jsonl ] && break; sleep 0.01; done
  kill -KILL $pid; wait $pid 2> /dev/null || true
  stale=$(ls small/swap)
  [ -n "$stale" ] || fail "the killed run left no swap file to test with"
  dd if=/dev/zero of=small/fill bs=4096 2> /dev/null || true
  "$S" train tiny.yaml --set run.dir=runs/s2 --set offload.optimizer=nvme --set offload.nvme_path=small/swap \
    --set train.steps=2 > s2.log 2>&1 || fail "a run after a killed one on a full nvme_path: $(tail -3 s2.log)"
  grep -q "\[nvme\] removed small/swap/$stale, a stale swap file left by process $pid (no longer running)" s2.log ||
    fail "the stale swap file is not named: $(grep nvme s2.log)"
  [ -z "$(ls small/swap)" ] || fail "swap files left: $(ls small/swap)"
  pass "a swap file a SIGKILLed run left on an otherwise full disk is removed, named, and the next run fits in its place"

  # beside a live one on a full disk: the live file is kept, and the refusal names it
  rm small/fill
  "$S" train tiny.yaml --set run.dir=runs/s3 --set offload.optimizer=nvme --set offload.nvme_path=small/swap \
    --set train.steps=100000 --set run.checkpoint_every=0 > s3.log 2>&1 &
  pid=$!
  for _ in $(seq 1000); do [ -s runs/s3/metrics.jsonl ] && break; sleep 0.01; done
  kill -STOP $pid
  live=$(ls small/swap)
  dd if=/dev/zero of=small/fill bs=4096 2> /dev/null || true
  set +e; out=$("$S" train tiny.yaml --set run.dir=runs/s4 --set offload.optimizer=nvme --set offload.nvme_path=small/swap 2>&1); rc=$?; set -e
  [ "$(ls small/swap)" = "$live" ] || fail "the live run's swap file was touched: $(ls small/swap)"
  kill -KILL $pid; wait $pid 2> /dev/null || true
  rm small/fill
  [ $rc -eq 3 ] || fail "beside a live swap file on a full disk: exit $rc: $out"
  grep -q "swap files of running processes hold part of it: small/swap/$live (.*, rank 0 of a running process $pid)" <<<"$out" ||
    fail "the live swap file is not named in the refusal: $out"
  pass "on a full disk beside a live run's swap file: refused with exit 3, naming that file and its process"
}

if [ "${1:-}" = small-disk ]; then # re-entered inside a user namespace (see below)
  cd "$2"
  mount -t tmpfs -o size=2m tmpfs small
  small_disk
  exit 0
fi

W=$(mktemp -d /tmp/strata-e2e-rundir.XXXXXX)
cleanup() { mountpoint -q "$W/small" 2> /dev/null && umount "$W/small"; [ -n "${KEEP:-}" ] || rm -rf "$W"; }
trap cleanup EXIT
cd "$W"
cat "$STRATA_SOURCE_DIR"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 24, micro_batch: 2, eval_every: 0, log_every: 100, sample_tokens: 0}
optim: {lr: 3.0e-3, warmup_steps: 2}
run: {dir: runs/ref, checkpoint_every: 8, keep: 0}
offload: {block_kb: 64, queue_depth: 4}
YAML
"$S" train tiny.yaml > ref.log
metrics_ok runs/ref/metrics.jsonl 24

# --- two runs on one run.dir: the second is refused, naming the first
"$S" train tiny.yaml --set run.dir=runs/busy --set train.steps=100000 > busy.log 2>&1 &
busy=$!
for _ in $(seq 1000); do [ -s runs/busy/metrics.jsonl ] && break; sleep 0.01; done
kill -STOP $busy # it holds the directory, however long the check below takes
set +e; out=$("$S" train tiny.yaml --set run.dir=runs/busy 2>&1); rc=$?; set -e
[ $rc -eq 2 ] || fail "a second run on a busy run.dir: exit $rc, expected 2: $out"
grep -q "run.dir 'runs/busy' is in use by another \`strata train\` (pid $busy on $(hostname), started .*; it holds runs/busy/lock)" <<<"$out" ||
  fail "the refusal does not name the holder: $out"
kill -CONT $busy
rows=$(wc -l < runs/busy/metrics.jsonl)
kill -KILL $busy; wait $busy 2> /dev/null || true
metrics_ok runs/busy/metrics.jsonl "$(wc -l < runs/busy/metrics.jsonl)"
pass "a second run on a run.dir in use exits 2 naming pid $busy; the first's $rows+ metrics rows stay whole"
"$S" train tiny.yaml --set run.dir=runs/busy --set train.steps=2 > after.log 2>&1 || fail "the lock of a SIGKILLed run is stuck: $(tail -2 after.log)"
pass "after the holder is SIGKILLed the directory is free again"

# --- metrics.jsonl on a device that is always full (/dev/full: ENOSPC from the real write)
mkdir -p runs/full && ln -s /dev/full runs/full/metrics.jsonl
set +e; out=$("$S" train tiny.yaml --set run.dir=runs/full 2>&1); rc=$?; set -e
[ $rc -eq 1 ] || fail "metrics on a full device: exit $rc, expected 1"
grep -q "step 1: writing runs/full/metrics.jsonl failed: No space left on device (errno 28)" <<<"$out" || fail "message: $out"
grep -q "stopped after step 1 because metrics.jsonl could not be written; step 1 is saved in runs/full/ckpt/step_00000001" <<<"$out" ||
  fail "no checkpoint attempt after the failed metrics write: $out"
"$S" sample runs/full --tokens 5 > /dev/null || fail "the checkpoint written after the metrics failure does not load"
pass "a metrics write failing with ENOSPC stops the run with exit 1 after a checkpoint, naming the file and errno"

# --- resume: metrics cut back to the resumed step (rows of later steps, a line cut short,
# a killed resume's .tmp), and unfinished checkpoints of a killed save removed
mkdir -p runs/cut && cp -r runs/ref/ckpt runs/cut/ && rm -r runs/cut/ckpt/step_00000024 && echo step_00000016 > runs/cut/ckpt/latest
head -20 runs/ref/metrics.jsonl > runs/cut/metrics.jsonl
head -c 100 runs/ref/metrics.jsonl >> runs/cut/metrics.jsonl # a line cut by a full disk
echo '{"step": 3, "garbage' > runs/cut/metrics.jsonl.tmp
cp -r runs/ref/ckpt/step_00000024 runs/cut/ckpt/step_00000020.tmp && rm runs/cut/ckpt/step_00000020.tmp/manifest.yaml
"$S" train tiny.yaml --set run.dir=runs/cut --resume latest > cut.log 2>&1 || fail "resume: $(tail -3 cut.log)"
grep -q "\[ckpt\] removed 1 unfinished checkpoint that a run killed while saving left in runs/cut/ckpt: step_00000020.tmp" cut.log ||
  fail "stale step_N.tmp not removed with a message: $(grep ckpt cut.log | head -3)"
[ -f runs/cut/ckpt/step_00000016/manifest.yaml ] && [ -f runs/cut/ckpt/step_00000008/manifest.yaml ] || fail "a finished checkpoint was touched"
metrics_ok runs/cut/metrics.jsonl 24
[ -z "$(find runs/cut -name '*.tmp*')" ] || fail "temporary files left: $(find runs/cut -name '*.tmp*')"
diff <(losses runs/ref) <(losses runs/cut) > /dev/null || fail "resumed losses differ"
pass "resume at 16 over metrics to 20 + a cut line: steps 1-24 once each; step_00000020.tmp removed, saying so; no .tmp left"

# --- a resume of a finished run says so and does nothing
before=$(md5sum < runs/ref/metrics.jsonl)
out=$("$S" train tiny.yaml --resume latest 2>&1) || fail "resume of a finished run: exit $?"
grep -q "run already at step 24 of 24; nothing to do" <<<"$out" || fail "no message for a finished run: $out"
grep -q "^step " <<<"$out" && fail "a finished run trained again: $out"
[ "$(md5sum < runs/ref/metrics.jsonl)" = "$before" ] || fail "a finished run's metrics changed"
pass "resume of a run at train.steps: 'run already at step 24 of 24; nothing to do', exit 0"

# --- NVMe swap files: a killed run's is removed and named, a live run's is named and kept
mkdir -p swap
"$S" train tiny.yaml --set run.dir=runs/n1 --set offload.optimizer=nvme --set offload.nvme_path=swap \
  --set train.steps=100000 --set run.checkpoint_every=0 > n1.log 2>&1 &
pid=$!
for _ in $(seq 1000); do [ -s runs/n1/metrics.jsonl ] && break; sleep 0.01; done
kill -STOP $pid
live=$(ls swap)
"$S" train tiny.yaml --set run.dir=runs/n2 --set offload.optimizer=nvme --set offload.nvme_path=swap --set train.steps=2 > n2.log 2>&1 ||
  fail "a run beside a live swap file: $(tail -3 n2.log)"
grep -q "\[nvme\] offload.nvme_path also holds swap files of running processes (.* in all): swap/$live (.*, rank 0 of a running process $pid)" n2.log ||
  fail "the live swap file is not named: $(grep nvme n2.log)"
[ "$(ls swap)" = "$live" ] || fail "the live run's swap file was touched: $(ls swap)"
kill -KILL $pid; wait $pid 2> /dev/null || true
"$S" train tiny.yaml --set run.dir=runs/n3 --set offload.optimizer=nvme --set offload.nvme_path=swap --set train.steps=2 > n3.log 2>&1 ||
  fail "a run after a killed one: $(tail -3 n3.log)"
grep -q "\[nvme\] removed swap/$live, a stale swap file left by process $pid (no longer running), which held" n3.log ||
  fail "the stale swap file is not removed with a message: $(grep nvme n3.log)"
[ -z "$(ls swap)" ] || fail "swap files left: $(ls swap)"
pass "a live run's swap file is named and kept; once it is SIGKILLed the next run removes it, saying so"

# --- a small disk: where a tmpfs can be mounted, as root or in a user namespace
mkdir small
if mount -t tmpfs -o size=2m tmpfs small 2> /dev/null; then
  small_disk
elif unshare -rm true 2> /dev/null; then
  unshare -rm bash "$0" small-disk "$W"
else
  echo "note: no tmpfs can be mounted here (not root, no user namespaces): the small-disk checks are skipped"
fi

# --- under mpirun: the refusal reaches every rank; a SIGKILLed rank is named by the survivor
if ! command -v mpirun > /dev/null; then
  echo "note: mpirun not found: the two-rank checks are skipped"
  echo "all e2e_rundir checks passed"
  exit 0
fi
MPI=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
for victim_rank in 1 0; do
  d=runs/mpi$victim_rank
  "${MPI[@]}" -np 2 "$S" train tiny.yaml --set run.dir=$d --set train.steps=100000 --set run.checkpoint_every=5 > $d.log 2>&1 &
  mpipid=$!
  for _ in $(seq 1000); do [ -f $d/ckpt/latest ] && break; sleep 0.01; done
  [ -f $d/ckpt/latest ] || fail "no checkpoint before the kill: $(tail -3 $d.log)"
  # each rank process's rank, from the environment mpirun gave it
  ranks=()
  for p in $(pgrep -f "^$S train tiny.yaml --set run.dir=$d "); do
    r=$(tr '\0' '\n' < /proc/$p/environ | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$r" ] && ranks[$r]=$p
  done
  [ ${#ranks[@]} -eq 2 ] || fail "expected 2 rank processes, found ${#ranks[@]}"
  if [ $victim_rank = 1 ]; then
    # while it runs, a second job on its directory is refused on every rank
    set +e; out=$("${MPI[@]}" -np 2 "$S" train tiny.yaml --set run.dir=$d 2>&1); rc=$?; set -e
    [ $rc -eq 2 ] || fail "a second two-rank job on a busy run.dir: exit $rc: $out"
    grep -q "\[rank 0\] error: \[train\] run.dir '$d' is in use by another" <<<"$out" || fail "two-rank refusal: $out"
    pass "under mpirun -np 2, a second job on a busy run.dir exits 2 on every rank with rank 0's message"
  fi
  victim=${ranks[$victim_rank]}
  start=$(date +%s)
  kill -KILL "$victim"
  set +e; wait $mpipid; rc=$?; set -e
  took=$(( $(date +%s) - start ))
  other=$((1 - victim_rank))
  [ $rc -eq 137 ] || fail "mpirun's exit after a SIGKILLed rank: $rc (the README says 137)"
  [ $took -le 30 ] || fail "the job took $took s to end"
  grep -q "\[rank $other\] error: \[train\] rank $victim_rank (pid $victim on $(hostname)) is gone: killed, or crashed" $d.log ||
    fail "the survivor does not name the lost rank: $(tail -8 $d.log)"
  grep -q "This rank was in .* (step [0-9]*) and exits 1" $d.log || fail "the survivor does not say what it was doing: $(tail -8 $d.log)"
  grep -q "mpirun noticed that process rank $victim_rank .* exited on signal 9" $d.log || fail "mpirun's own message: $(tail -8 $d.log)"
  "$S" sample $d --tokens 5 > /dev/null || fail "the last checkpoint does not load after the kill"
  pass "SIGKILL of rank $victim_rank: exit 137 in ${took}s; rank $other says: $(grep -o "rank $victim_rank (pid.*exits 1" $d.log | cut -c1-150)..."
done
echo "all e2e_rundir checks passed"
