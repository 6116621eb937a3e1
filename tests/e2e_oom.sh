#!/usr/bin/env bash
# Out of device memory mid-run (injected with STRATA_FAULT_OOM_STEP, as another process
# taking memory would cause it): the step is abandoned before its update, the last
# completed step is checkpointed, the run exits 4 saying who needed how much and how to
# resume, and the printed resume command finishes the run bitwise as if nothing happened.
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
train: {steps: 12, micro_batch: 4, grad_accum: 2, eval_every: 4, eval_batches: 2, log_every: 4, sample_tokens: 0}
optim: {lr: 3.0e-3, warmup_steps: 4}
run: {checkpoint_every: 0, keep: 0}
YAML

# check NAME WORLD SETS...: reference run, the same run with an injected out-of-memory at
# step 5, then the resume command it printed; the losses of steps 5-12 must be identical
check() {
  local name=$1 n=$2; shift 2
  local launch=("$S")
  if [ "$n" -gt 1 ]; then
    launch=(mpirun --oversubscribe -x OMP_NUM_THREADS=1 -x STRATA_FAULT_OOM_STEP -np "$n" "$S")
    [ "$(id -u)" -eq 0 ] && launch=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -x STRATA_FAULT_OOM_STEP -np "$n" "$S")
  fi
  STRATA_FAULT_OOM_STEP=0 "${launch[@]}" train tiny.yaml --set "run.dir=runs/$name-ref" "$@" > "$name-ref.log" 2>&1 ||
    fail "$name: reference run failed: $(tail -3 "$name-ref.log")"
  set +e
  STRATA_FAULT_OOM_STEP=5 "${launch[@]}" train tiny.yaml --set "run.dir=runs/$name" "$@" > "$name.log" 2>&1; rc=$?
  set -e
  [ $rc -eq 4 ] || fail "$name: out of memory should exit 4, got $rc: $(tail -5 "$name.log")"
  grep -q "out of device memory in step 5: cudaMalloc of [0-9]* bytes (unit 0's gradient) failed: out of memory (injected" "$name.log" ||
    fail "$name: no message naming the step, the call and its bytes: $(cat "$name.log")"
  grep -q "free of .* Strata's plan holds" "$name.log" || fail "$name: no free/total and plan bytes in: $(cat "$name.log")"
  grep -q "another process probably took device memory" "$name.log" || fail "$name: no hint at another process"
  grep -q "before its update" "$name.log" || fail "$name: does not say the state was untouched"
  [ "$(cat "runs/$name/ckpt/latest")" = step_00000004 ] || fail "$name: latest should be the emergency checkpoint of step 4"
  [ "$(losses "runs/$name" | wc -l)" -eq 4 ] || fail "$name: metrics should hold steps 1-4 only"
  "$S" sample "runs/$name" --tokens 5 > /dev/null || fail "$name: the emergency checkpoint does not load"
  # the exact command it printed, with this build's binary for `strata`
  cmd=$(grep -A1 "resume with:" "$name.log" | tail -1 | sed -e 's/^ *//')
  grep -q -- "--resume runs/$name/ckpt/step_00000004$" <<<"$cmd" || fail "$name: resume command '$cmd'"
  if [ "$n" -gt 1 ]; then
    [ "${cmd#"mpirun -np $n strata "}" != "$cmd" ] || fail "$name: the resume command should start with mpirun -np $n: '$cmd'"
    cmd=${cmd#"mpirun -np $n "}
  fi
  eval "set -- ${cmd#strata }"
  STRATA_FAULT_OOM_STEP=0 "${launch[@]}" "$@" > "$name-resume.log" 2>&1 ||
    fail "$name: the printed resume command failed: $(tail -3 "$name-resume.log")"
  diff <(losses "runs/$name-ref") <(losses "runs/$name") > /dev/null ||
    fail "$name: resumed losses differ: $(diff <(losses "runs/$name-ref") <(losses "runs/$name") | head -4)"
  pass "$name: exit 4 at step 5, checkpoint of step 4 loads, '$cmd' finishes with all 12 losses bitwise equal"
}

check stage0 1
check offload-cpu 1 --set offload.optimizer=cpu
if command -v mpirun > /dev/null; then
  check w2-stage3 2 --set zero.stage=3
  # only rank 1 runs out: rank 0 learns it at the step-end agreement, and both checkpoint
  mpi=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
  [ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
  set +e
  "${mpi[@]}" -np 1 "$S" train tiny.yaml --set run.dir=runs/one : -np 1 env STRATA_FAULT_OOM_STEP=7 "$S" train tiny.yaml \
    --set run.dir=runs/one > one.log 2>&1; rc=$?
  set -e
  [ $rc -eq 4 ] || fail "one rank out of memory: exit $rc, expected 4: $(tail -5 one.log)"
  grep -q "\[rank 1\] error: \[train\] step 7: cudaMalloc of" one.log || fail "rank 1 should name its fault: $(cat one.log)"
  grep -q "\[rank 0\] error: \[train\] out of device memory in step 7: on another rank" one.log || fail "rank 0's summary: $(cat one.log)"
  [ "$(cat runs/one/ckpt/latest)" = step_00000006 ] || fail "one rank out of memory: latest should be step 6"
  "$S" sample runs/one --tokens 5 > /dev/null || fail "one rank out of memory: the checkpoint does not load"
  pass "only rank 1 out of memory at step 7: both ranks skip the update, checkpoint step 6 and exit 4"
else
  echo "mpirun not found: the two-rank case is skipped"
fi

# out of memory in the very first step: nothing completed, nothing to save
set +e
STRATA_FAULT_OOM_STEP=1 "$S" train tiny.yaml --set run.dir=runs/first > first.log 2>&1; rc=$?
set -e
[ $rc -eq 4 ] || fail "first step: out of memory should exit 4, got $rc"
grep -q "No step had completed" first.log || fail "first step: message: $(cat first.log)"
[ ! -e runs/first/ckpt/latest ] || fail "first step: no checkpoint expected"
pass "out of memory in step 1: exit 4, nothing saved, says to start over"
echo "all e2e_oom checks passed"
