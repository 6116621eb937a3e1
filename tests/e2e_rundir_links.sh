#!/usr/bin/env bash
# Where a run saves is checked when it starts, not at its first checkpoint: run.dir, or
# run.dir/ckpt, that is a symbolic link loop (one link or two), a link to nothing, a file,
# or (not as root) a directory the run cannot write, is refused with exit 2 naming it and
# what is wrong, before a step is computed; a ckpt that links to a real directory works.
set -euo pipefail
S=${STRATA:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-rundir-links.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
cat "$STRATA_SOURCE_DIR"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null 2>&1
cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 4, micro_batch: 2, eval_every: 0, log_every: 100, sample_tokens: 0}
optim: {lr: 3.0e-3, warmup_steps: 2}
run: {checkpoint_every: 2, keep: 0}
YAML
# refused DIR WHAT: a run with run.dir DIR exits 2 at its start, the message saying WHAT
refused() {
  set +e; out=$("$S" train tiny.yaml --set run.dir="$1" 2>&1); rc=$?; set -e
  [ $rc -eq 2 ] || fail "run.dir $1: exit $rc, expected 2: $(grep -v '^ ' <<<"$out" | grep -i 'error\|step' | head -3)"
  grep -q -- "$2" <<<"$out" || fail "run.dir $1: the refusal should say \"$2\": $(grep -v '^ ' <<<"$out" | tail -3)"
  ! grep -q "^step " <<<"$out" && [ ! -e "$1/metrics.jsonl" ] || fail "run.dir $1: steps were computed before the refusal"
}

mkdir -p runs/self && ln -s ckpt runs/self/ckpt
refused runs/self "the checkpoint directory 'runs/self/ckpt' is a symbolic link loop (Too many levels of symbolic links)"
mkdir -p runs/pair && ln -s x runs/pair/ckpt && ln -s ckpt runs/pair/x
refused runs/pair "the checkpoint directory 'runs/pair/ckpt' is a symbolic link loop"
ln -s loop runs/loop
refused runs/loop "run.dir 'runs/loop' is a symbolic link loop"
mkdir -p runs/dangling && ln -s ../nowhere runs/dangling/ckpt
refused runs/dangling "the checkpoint directory 'runs/dangling/ckpt' is a symbolic link to ../nowhere, which does not exist"
mkdir -p runs/file && echo x > runs/file/ckpt
refused runs/file "the checkpoint directory 'runs/file/ckpt' is a regular file, not a directory"
if [ "$(id -u)" -ne 0 ]; then
  mkdir -p runs/ro/ckpt && chmod 555 runs/ro/ckpt
  refused runs/ro "the checkpoint directory 'runs/ro/ckpt' cannot be written by this user"
  chmod 755 runs/ro/ckpt
fi
pass "run.dir or its ckpt as a link loop (one link, two), a link to nothing, a file$([ "$(id -u)" -ne 0 ] && echo ', not writable'): exit 2 at start, naming it, no step computed"

mkdir -p elsewhere/ckpt runs/linked && ln -s ../../elsewhere/ckpt runs/linked/ckpt
"$S" train tiny.yaml --set run.dir=runs/linked > linked.log 2>&1 || fail "a ckpt linked to a directory: $(tail -3 linked.log)"
[ "$(cat elsewhere/ckpt/latest)" = step_00000004 ] || fail "the checkpoints should be in the linked directory: $(ls elsewhere/ckpt)"
pass "a ckpt that links to a real directory works: the checkpoints are there"
