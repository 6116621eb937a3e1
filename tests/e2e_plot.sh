#!/usr/bin/env bash
# `strata plot` on real runs: the SVG renders without error (rsvg-convert, from Debian's
# librsvg2-bin) for a run with validation (before its first step too), one without, one
# with its optimizer offloaded, a resumed one, and the three first overlaid; and every
# panel's series is metrics.jsonl's
# (tests/tensorboard_check.py svg: each curve's numbers are the rows', its pixels map back
# to them through its panel's axes, each memory bar, capacity and measured peak is the
# run's last plan row and the rows after it). Exits 77 (skip), saying so, without
# rsvg-convert.
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
command -v rsvg-convert > /dev/null || { echo "SKIP: no rsvg-convert to render the SVG (Debian: librsvg2-bin; launcher/install-deps.sh --tests)"; exit 77; }
command -v python3 > /dev/null || { echo "SKIP: no python3 to read the SVG"; exit 77; }
W=$(mktemp -d /tmp/strata-e2e-plot.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
cd "$W"
cat "$SRC"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data --val-fraction 0.1 > /dev/null
cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin", val: "data/val_*.bin"}
train: {steps: 20, micro_batch: 2, eval_every: 5, eval_batches: 2, log_every: 100, sample_tokens: 0}
optim: {lr: 3.0e-3, warmup_steps: 2}
run: {dir: runs/val, checkpoint_every: 10, keep: 0}
offload: {block_kb: 64, queue_depth: 4}
YAML
# renders, and its series are the runs' metrics
drawn() {
  local svg=$1; shift
  rsvg-convert "$svg" -o "${svg%.svg}.png" 2> render.err || fail "rsvg-convert $svg: $(cat render.err)"
  [ ! -s render.err ] || fail "rsvg-convert $svg complained: $(cat render.err)"
  [ "$(head -c 8 "${svg%.svg}.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "$svg did not render to a PNG"
  local m=()
  for run in "$@"; do m+=("$run/metrics.jsonl"); done
  python3 "$SRC/tests/tensorboard_check.py" svg "$svg" "${m[@]}" || fail "$svg does not draw what metrics.jsonl says"
}

# the run with validation also validates before its first step: a row of step 0, val_loss alone
"$S" train tiny.yaml --set train.eval_at_start=true > val.log 2>&1 || fail "train: $(tail -3 val.log)"
head -1 runs/val/metrics.jsonl | grep -q '^{"step": 0, "val_loss": [0-9.]*}$' || fail "step 0's row: $(head -1 runs/val/metrics.jsonl)"
"$S" train tiny.yaml --set run.dir=runs/noval --set data.val= --set train.steps=30 > noval.log 2>&1 || fail "train: $(tail -3 noval.log)"
"$S" train tiny.yaml --set run.dir=runs/offload --set offload.optimizer=cpu --set optim.lr=1e-3 > off.log 2>&1 ||
  fail "train: $(tail -3 off.log)"
for run in val noval offload; do
  "$S" plot runs/$run > /dev/null || fail "plot runs/$run"
  drawn runs/$run/plot.svg runs/$run
done
grep -q 'data-tier="pinned" data-category="optimizer"' runs/offload/plot.svg || fail "the offload run's optimizer state should be drawn pinned"
pass "one run each: with validation (from step 0), without, with its optimizer offloaded (pinned tier drawn): rendered, every series as metrics.jsonl says"

# a resumed run at another micro-batch: two plan rows, the second drawn
"$S" train tiny.yaml --set run.dir=runs/res --set train.steps=10 > res1.log 2>&1
"$S" train tiny.yaml --set run.dir=runs/res --set train.micro_batch=4 --resume latest > res2.log 2>&1 || fail "resume: $(tail -3 res2.log)"
[ "$(grep -c '"plan"' runs/res/metrics.jsonl)" = 2 ] || fail "a resumed run should record its plan again"
"$S" plot runs/res > /dev/null && drawn runs/res/plot.svg runs/res
pass "a resumed run at micro-batch 4: its second plan is drawn"

# three runs overlaid, and the default output of several runs
"$S" plot runs/val runs/noval runs/offload --out three.svg > /dev/null || fail "plot of three runs"
drawn three.svg runs/val runs/noval runs/offload
[ "$(grep -c '<text class="run"' three.svg)" = 3 ] || fail "the legend should name three runs"
(mkdir -p cmp && cd cmp && "$S" plot ../runs/val ../runs/offload > out.txt) && [ -f cmp/plot.svg ] && grep -q "wrote plot.svg" cmp/out.txt ||
  fail "several runs without --out should write ./plot.svg"
pass "three runs overlaid with a legend: rendered, each run's series its own; several runs default to ./plot.svg"

set +e; "$S" plot > /dev/null 2>&1; rc=$?; set -e
[ $rc -eq 2 ] || fail "plot without a run: exit $rc"
set +e; out=$("$S" plot runs/val runs/nothing 2>&1); rc=$?; set -e
[ $rc -eq 1 ] && grep -q "runs/nothing/metrics.jsonl: cannot open metrics" <<<"$out" || fail "a missing run among several: exit $rc: $out"
pass "usage errors exit 2; a missing run among several is named (exit 1)"
echo "all e2e_plot checks passed"
