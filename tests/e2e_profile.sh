#!/usr/bin/env bash
# End to end: the kernel profile (STRATA_PROFILE=kernels, core/profile.h) through
# `strata train`: a bad value exits 2 before any work, naming it; a profiled run prints
# the table at the end with calls per step that match the model, and trains bitwise the
# losses of the same run without it; without it no table is printed.
set -euo pipefail
S=${STRATA:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-profile.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }

cat "$STRATA_SOURCE_DIR"/core/*.h > corpus.txt
"$S" prepare --text corpus.txt --out data --val-fraction 0.1 > /dev/null
cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 3, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 4, micro_batch: 4, grad_accum: 2, log_every: 1, sample_tokens: 0}
optim: {lr: 3.0e-3, warmup_steps: 1}
run: {dir: runs/a, keep: 0, checkpoint_at_end: false}
YAML

set +e
out=$(STRATA_PROFILE=kernel "$S" train tiny.yaml 2>&1); rc=$?
set -e
[ $rc -eq 2 ] || fail "STRATA_PROFILE=kernel should exit 2, got $rc"
grep -q "STRATA_PROFILE=kernel: not a profile this build knows (kernels, or off)" <<<"$out" || fail "message: $out"
[ ! -d runs ] || fail "a bad STRATA_PROFILE must not create the run directory"
pass "a bad STRATA_PROFILE exits 2, naming the value"

"$S" train tiny.yaml > off.log
STRATA_PROFILE=kernels "$S" train tiny.yaml --set run.dir=runs/b > on.log
grep -q "\[prof\]" off.log && fail "a run without STRATA_PROFILE printed a profile"
grep -q "\[prof\] kernel profile: compute stream, mean of 3 steps (the first left out: warm-up)" on.log ||
  fail "no profile header: $(tail -5 on.log)"
# calls per step: 2 micro-steps x (2 per block x 3 blocks + ln_f) layernorms each way, one classifier each way
row() { awk -v p="$1" -v g="$2" '$1 == "[prof]" && $2 == p && $0 ~ ("  " g " ") { print $(NF - 2) }' on.log; }
[ "$(row forward layernorm)" = 14 ] || fail "forward layernorm calls per step: '$(row forward layernorm)', want 2 x (2 x 3 + 1)"
[ "$(row backward layernorm)" = 14 ] || fail "backward layernorm calls per step: '$(row backward layernorm)'"
[ "$(row forward classifier)" = 2 ] && [ "$(row backward classifier)" = 2 ] || fail "classifier calls per step"
grep -q "\[prof\]   step       total .* 100.0%" on.log || fail "no step total row"
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1/metrics.jsonl"; }
[ "$(losses runs/a | wc -l)" -eq 4 ] || fail "4 metrics rows expected"
diff <(losses runs/a) <(losses runs/b) > /dev/null || fail "losses differ with the profile on: $(diff <(losses runs/a) <(losses runs/b) | head -4)"
pass "the profile's table is printed, its calls match the model, the losses are bitwise unchanged"
