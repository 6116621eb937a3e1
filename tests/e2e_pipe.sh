#!/usr/bin/env bash
# The terminal going away mid-run (issue 31): `strata train CONFIG | tee log`, then Ctrl-C,
# ends tee as well. The run ignores SIGPIPE: the write to the closed pipe fails instead of
# killing it (status 141, no checkpoint), the stop checkpoint is written, the run exits 0,
# and run.dir/train.log says when stdout went and holds what the run would have printed.
#  - a pipe whose reader dies, then SIGINT mid-run: exit 0, the stop checkpoint loads, the
#    note and the rest of the output in train.log, and the resume finishes bitwise;
#  - stdout and stderr into a pipe whose reader leaves after three lines, no signal: the run
#    trains to its end (exit 0, every step, losses bitwise), skipping the final sample.
set -euo pipefail
S=${STRATA:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-pipe.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1/metrics.jsonl"; }
# wait_exit PID SECONDS: waits for the process to end (bounded), its exit status in $rc
wait_exit() {
  for _ in $(seq $(($2 * 100))); do kill -0 "$1" 2> /dev/null || break; sleep 0.01; done
  if kill -0 "$1" 2> /dev/null; then kill -KILL "$1"; wait "$1" 2> /dev/null || true; fail "still running after $2 s"; fi
  set +e; wait "$1"; rc=$?; set -e
}

cat "$STRATA_SOURCE_DIR"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 100, micro_batch: 4, eval_every: 0, log_every: 1, sample_tokens: 20}
optim: {lr: 3.0e-3, warmup_steps: 4}
run: {dir: runs/ref, checkpoint_every: 0, keep: 0}
YAML
"$S" train tiny.yaml > ref.log
[ "$(losses runs/ref | wc -l)" -eq 100 ] || fail "the reference run has no 100 metrics rows"

# --- a pipe whose reader dies, then SIGINT: the shell's Ctrl-C ends both ends of the pipe
mkfifo out.fifo
cat out.fifo > seen.log & # the reader, as tee would be
reader=$!
"$S" train tiny.yaml --set run.dir=runs/p > out.fifo 2> err.log &
pid=$!
for _ in $(seq 2000); do [ -s runs/p/metrics.jsonl ] && [ "$(wc -l < runs/p/metrics.jsonl)" -ge 3 ] && break; sleep 0.01; done
kill -STOP $pid # mid-run however fast the machine is
[ "$(wc -l < runs/p/metrics.jsonl)" -lt 100 ] || fail "the run finished before it could be stopped"
kill -TERM $reader # (a background job ignores SIGINT in a script; TERM ends it the same way)
wait $reader 2> /dev/null || true
kill -INT $pid
kill -CONT $pid
wait_exit $pid 60
[ $rc -eq 0 ] || fail "SIGINT with the pipe's reader gone: exit $rc, expected 0 (141 is death by SIGPIPE): $(tail -3 err.log)"
[ -f runs/p/ckpt/latest ] || fail "no stop checkpoint"
stopped=$(cat runs/p/ckpt/latest)
n=$((10#${stopped#step_}))
"$S" sample runs/p --tokens 5 > /dev/null || fail "the stop checkpoint $stopped does not load"
[ -f runs/p/train.log ] || fail "no runs/p/train.log noting the lost terminal"
grep -q "\[train\] stdout is gone (Broken pipe, errno 32) in step $n: the run goes on" runs/p/train.log ||
  fail "train.log does not note the lost stdout: $(cat runs/p/train.log)"
grep -q "^\[ckpt\] saved runs/p/ckpt/$stopped" runs/p/train.log || fail "train.log lacks the save: $(cat runs/p/train.log)"
# the line of step n went to the pipe if the run was frozen after writing it, else here
cat seen.log runs/p/train.log | grep -q "^step *$n/100 " || fail "the progress line of step $n is lost: $(cat runs/p/train.log)"
grep -q "stopped by signal after step $n; resume with --resume latest" runs/p/train.log ||
  fail "train.log lacks the stop message: $(cat runs/p/train.log)"
"$S" train tiny.yaml --set run.dir=runs/p --resume latest > resume.log 2>&1 || fail "resume: $(tail -3 resume.log)"
diff <(losses runs/ref) <(losses runs/p) > /dev/null || fail "stop + resume losses differ from the uninterrupted run"
pass "reader gone, then SIGINT: exit 0, $stopped saved and loads, train.log notes stdout's EPIPE in step $n and holds the rest; the resume is bitwise"

# --- stdout and stderr into a pipe whose reader leaves early, no signal: the run goes on
set +e
"$S" train tiny.yaml --set run.dir=runs/h --set run.checkpoint_every=10 2>&1 | head -n 3 > head.log
st=("${PIPESTATUS[@]}")
set -e
[ "${st[0]}" -eq 0 ] || fail "a reader that left after 3 lines: exit ${st[0]}, expected 0 (141 is death by SIGPIPE)"
[ "$(wc -l < head.log)" -eq 3 ] || fail "head saw $(wc -l < head.log) lines"
diff <(losses runs/ref) <(losses runs/h) > /dev/null || fail "the run whose reader left has other losses than the reference"
[ "$(cat runs/h/ckpt/latest)" = step_00000100 ] || fail "the end checkpoint is missing"
grep -q "stdout is gone (Broken pipe, errno 32)" runs/h/train.log || fail "no note in train.log: $(head -3 runs/h/train.log)"
grep -q "^step *100/100 " runs/h/train.log || fail "train.log lacks the last step's line"
grep -q "no sample: stdout is gone" runs/h/train.log || fail "the final sample should be skipped, saying so"
pass "stdout and stderr into head -n 3: all 100 steps bitwise, end checkpoint, exit 0; the rest of the output in train.log"

# --- a terminal that stays: no train.log
[ ! -e runs/ref/train.log ] || fail "a run whose terminal stayed wrote train.log"
pass "a run whose terminal stays writes no train.log"
echo "all e2e_pipe checks passed"
