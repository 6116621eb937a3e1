#!/usr/bin/env bash
# bench/gpu_matrix.py, the GPU verification matrix, kept honest on the CPU backend: a few of
# its rows pass with the real binary, and planted faults are caught: a run whose losses and
# weights drift from its reference fails (losses and checkpoint CRCs), a run that never ends
# is reported as a hang with stacks and killed, a crash names its exit code, and the rendered
# table says how many rows failed.
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
command -v python3 > /dev/null || { echo "SKIP: no python3"; exit 77; }
W=$(mktemp -d /tmp/strata-e2e-matrix.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
M=(python3 "$SRC/bench/gpu_matrix.py")
rows="stage 0;stage 1;stage 2;stage 3, optimizer and params nvme;stage 0, comm nccl;stage 0, state int8;stage 1, state int8;stage 0, state int8, optimizer cpu"
rows="$rows;stage 3, optimizer and params nvme, 4096-element chunks"
# with accumulation: at world 1 every stage bit for bit stage 0 (the gradient accumulates in place)
rows="$rows;stage 0, grad_accum 2;stage 2, grad_accum 2;stage 3, grad_accum 2"
# and with the gradients in pinned memory, copied out and back in to accumulate
rows="$rows;stage 3, grad_accum 2, optimizer and params nvme, gradients cpu"

"${M[@]}" run --strata "$S" --part world1 --device cpu --quick --results good --workdir wgood --only "$rows" > good.log \
  || fail "clean rows failed: $(cat good.log)"
grep -q "stage 3, optimizer and params nvme: PASS" good.log || fail "$(cat good.log)"
grep -q "stage 0, comm nccl: N/A (needs a GPU)" good.log || fail "$(cat good.log)"
grep -q "stage 0, state int8, optimizer cpu: PASS" good.log || fail "$(cat good.log)"
grep -q "stage 3, optimizer and params nvme, 4096-element chunks: PASS" good.log || fail "$(cat good.log)"
grep -q "stage 2, grad_accum 2: PASS" good.log && grep -q "stage 3, grad_accum 2: PASS" good.log || fail "$(cat good.log)"
grep -q "stage 3, grad_accum 2, optimizer and params nvme, gradients cpu: PASS" good.log || fail "$(cat good.log)"
pass "world-1 rows on the CPU backend pass bitwise against stage 0: $(tail -1 good.log)"

# packed documents: the matrix marks them in shards of its own, and the run keeps them apart
docs="llama, packed documents;llama, packed documents, stage 3, checkpointing blocks;llama, packed documents, attention tc"
"${M[@]}" run --strata "$S" --part llama --device cpu --quick --results gooddocs --workdir wgood --only "$docs" \
  > docs.log || fail "packed-document rows failed: $(cat docs.log)"
grep -q "llama, packed documents, stage 3, checkpointing blocks: PASS" docs.log &&
  grep -q "llama, packed documents, attention tc: N/A (needs a GPU)" docs.log || fail "$(cat docs.log)"
grep -q "packed examples are kept apart" wgood/llama-llama-packed-documents.log || fail "the docs rows' runs did not keep \
the documents apart: $(head -20 wgood/llama-llama-packed-documents.log)"
pass "packed-document rows on the CPU backend: $(tail -1 docs.log)"

# planted faults: stage 1 hangs, stage 2 drifts (another learning rate), stage 3 crashes
cat > fake.sh <<FAKE
#!/usr/bin/env bash
case " \$* " in
  *zero.stage=1*) exec sleep 611 ;;
  *zero.stage=2*) exec "$S" "\$@" --set optim.lr=2.1e-3 ;;
  *zero.stage=3*) exit 9 ;;
esac
exec "$S" "\$@"
FAKE
chmod +x fake.sh
set +e
"${M[@]}" run --strata "$W/fake.sh" --part world1 --device cpu --quick --results bad --workdir wbad --limit-s 5 \
  --only "stage 0;stage 1;stage 2;stage 3, optimizer and params nvme" > bad.log 2>&1
rc=$?
set -e
[ $rc -ne 0 ] || fail "the matrix passed with planted faults: $(cat bad.log)"
grep -q "stage 0: PASS" bad.log || fail "$(cat bad.log)"
grep -q "stage 1: FAIL (HUNG after 5.0 s" bad.log || fail "hang not reported: $(cat bad.log)"
grep -q "^-- pid [0-9]*: sleep 611" bad/hangs.txt || fail "hangs.txt: $(cat bad/hangs.txt)"
pgrep -f "^sleep 611" > /dev/null && fail "the hung run was not killed"
grep -q "stage 2: FAIL (losses differ from 'stage 0' by .*; final weights/moments differ from 'stage 0' in [0-9]* segments)" bad.log \
  || fail "drift not reported: $(cat bad.log)"
grep -q "stage 3, optimizer and params nvme: FAIL (exit 9" bad.log || fail "crash not reported: $(cat bad.log)"
pass "planted hang, drift and crash are each a failed row: $(grep -c FAIL bad.log) failures"

set +e
"${M[@]}" render --results bad --out bad.md > render.log; rc=$?
set -e
[ $rc -ne 0 ] || fail "render of a failing matrix should exit non-zero"
grep -q "^Rows: 1 pass, 3 fail, 0 not applicable; parts not run: ranks, attention" bad.md || fail "$(head -5 bad.md)"
grep -q "^| stage 2 | 1 | FAIL: losses differ" bad.md || fail "$(cat bad.md)"
pass "the rendered table counts the failures and names the parts not run"
# the device call's deadline: a row that would outlive it is cut (stacks taken), the rows after
# it are not started, each is "not run" with its reason, the failed rows' logs are kept, and
# the part still writes its results before the deadline
set +e
t0=$(date +%s)
STRATA_MATRIX_STACKS_S=1 STRATA_MATRIX_MIN_ROW_S=3 "${M[@]}" run --strata "$W/fake.sh" --part world1 --device cpu \
  --quick --results late --workdir wlate --deadline $((t0 + 12)) --only "stage 0;stage 1;stage 2" > late.log 2>&1
rc=$?
t1=$(date +%s)
set -e
[ $rc -ne 0 ] || fail "a part cut by its deadline passed: $(cat late.log)"
[ $((t1 - t0)) -le 13 ] || fail "the part outlived its deadline by $((t1 - t0 - 12)) s: $(cat late.log)"
grep -q "stage 0: PASS" late.log || fail "$(cat late.log)"
grep -q "stage 1: NOT RUN (cut short by the call's deadline after [0-9]* s, 0 steps done" late.log || fail "$(cat late.log)"
grep -q "stage 2: NOT RUN (the call's deadline came first)" late.log || fail "$(cat late.log)"
grep -q "1 pass, 0 fail, 0 n/a, 2 not run" late.log || fail "$(cat late.log)"
[ -f late/logs/world1-stage-1.log ] || fail "the cut row's log was not kept: $(ls -R late)"
[ -s bad/logs/world1-stage-2.log ] && [ -f bad/logs/world1-stage-3-optimizer-and-params-nvme.log ] \
  || fail "failed rows' logs were not kept: $(ls -R bad)"
set +e
"${M[@]}" render --results late --out late.md > /dev/null; rc=$?
set -e
[ $rc -ne 0 ] || fail "render of a part with rows not run should exit non-zero"
grep -q "^Rows: 1 pass, 0 fail, 0 not applicable, 2 not run (the device call's deadline came first)" late.md \
  || fail "$(head -5 late.md)"
pass "a part cut by the device call's deadline ends in time and names the rows it did not run"
echo "all e2e_matrix checks passed"
