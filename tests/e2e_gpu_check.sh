#!/usr/bin/env bash
# bench/gpu-check.sh's plumbing, kept honest without a GPU: a GPU session has one device call
# of at most 10 minutes, so the script must end by its deadline whatever hangs, and return
# what it found in the few files the device tool brings back. On the CPU, with the build under
# test: every part runs to its end without tripping the script (set -eu, a missing file,
# an empty table), the `check` part's GPU runs fail and the summary says so, everything is
# packed into one archive beside the summary and the matrix table, an unknown part is
# refused before anything runs, and with a strata that never finishes the script still ends
# by its deadline, with the stacks of what it stopped, naming the part it had no time for.
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
B=${STRATA_BUILD_DIR:?set by ctest}
command -v python3 > /dev/null || { echo "SKIP: no python3"; exit 77; }
W=$(mktemp -d /tmp/strata-e2e-gpu-check.XXXXXX)
# (the hang run below ends by its own 40 s deadline: a failure before its checks waits for it)
trap '[ -z "${hang_job:-}" ] || wait "$hang_job" 2> /dev/null; rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
G=(bash "$SRC/bench/gpu-check.sh")

set +e
GPU_CHECK_PARTS="check nosuch" OUT=$W/o0 "${G[@]}" > unknown.log 2>&1
rc=$?
set -e
[ $rc = 2 ] || fail "an unknown part: exit $rc, not 2: $(cat unknown.log)"
grep -q "GPU_CHECK_PARTS: unknown part 'nosuch'" unknown.log || fail "$(cat unknown.log)"
[ ! -e o0 ] || fail "an unknown part still ran something: $(ls o0)"
pass "an unknown part is refused before anything runs"

# a strata that never finishes: every run is cut, and the script still ends by its deadline
# (it sleeps 617 s, a duration no other test sleeps, so the pgrep below finds only its own).
# It mostly waits, so it runs beside the every-part run below; its checks come after that.
cat > hang.sh << HANG
#!/usr/bin/env bash
[ "\$1" = train ] && exec sleep 617
exec "$S" "\$@"
HANG
chmod +x hang.sh
(
  t0=$(date +%s)
  rc=0
  GPU_CHECK_BUILD=$B GPU_CHECK_STRATA=$W/hang.sh GPU_CHECK_PARTS="check matrix-world1" GPU_CHECK_DEADLINE_S=40 \
    GPU_CHECK_NEEDS_S=5 GPU_CHECK_RESULTS=$W/r2 OUT=$W/o2 "${G[@]}" > two.log 2>&1 || rc=$?
  echo "$rc $t0 $(date +%s)" > two.end
) &
hang_job=$!

t0=$(date +%s)
# (run from the source tree by a relative path, as the device tool's command does; every part,
# each given 1 s as its estimate so that all of them start)
(cd "$SRC" && GPU_CHECK_BUILD=$B GPU_CHECK_STRATA=$S GPU_CHECK_DEADLINE_S=400 GPU_CHECK_NEEDS_S=1 \
  GPU_CHECK_RESULTS=$W/r1 OUT=$W/o1 bash bench/gpu-check.sh) > one.log 2>&1 || fail "gpu-check failed: $(tail -30 one.log)"
t1=$(date +%s)
ls o1 > files.txt
[ "$(cat files.txt | tr '\n' ' ')" = "gpu-check.tar.gz gpu-matrix.md summary.md " ] || fail "files back: $(cat files.txt)"
sm=o1/summary.md
for p in check matrix-llama matrix-world1 matrix-attention sanitize torch finetune infer bench matrix-ranks memory bench15 offload offload7b offload10b; do
  grep -q "^## $p$" $sm || fail "part $p did not run: $(cat $sm)"
done
[ "$(grep -c "^(done in [0-9]* s)$" $sm)" = 15 ] || fail "a part did not end by itself: $(grep "^(" $sm)"
grep -q "^- matrix world1: 0 pass, 40 fail, 0 n/a, 0 not run, of 40 rows" $sm || fail "$(cat $sm)"
grep -q "^Rows: 0 pass, [0-9]* fail" o1/gpu-matrix.md || fail "$(head -5 o1/gpu-matrix.md)"
grep -q "^- test_cuda (world 1): exit 77 (skipped: no GPU)" $sm || fail "$(cat $sm)"
grep -q "^- GPU vs CPU: FAIL" $sm || fail "a GPU run without a GPU did not fail the comparison: $(cat $sm)"
grep -q "^- zero stage 2 on CUDA: exit 1; 0 steps; .*cuda" $sm || fail "$(cat $sm)"
grep -q "^gpu-check: ended after [0-9]* s of its 400 s, exit 0" $sm || fail "$(cat $sm)"
grep -q "^## offload10b" <(sed -n '/=== summary/,$p' one.log) || fail "the summary is not printed last: $(tail -20 one.log)"
mkdir x && tar xzf o1/gpu-check.tar.gz -C x
for f in summary.md part-check.log gpu_vs_cpu.md train-cpu.log train-gpu.log test_cuda.log matrix/matrix-world1.json \
         matrix/logs/world1-stage-0.log part-offload10b.log; do
  [ -f "x/$f" ] || fail "$f is not in the archive: $(ls x)"
done
grep -q "loss" x/train-cpu.log || fail "the CPU run did not train: $(tail x/train-cpu.log)"
pass "every part on the CPU in $((t1 - t0)) s: each ends by itself, the summary, the matrix and one archive come back"

wait $hang_job
read -r rc t0 t1 < two.end
[ "$rc" = 0 ] || fail "gpu-check failed: $(tail -30 two.log)"
[ $((t1 - t0)) -le 42 ] || fail "the script outlived its 40 s deadline: $((t1 - t0)) s"
pgrep -f "^sleep 617" > /dev/null && fail "a cut run was left running"
mkdir y && tar xzf o2/gpu-check.tar.gz -C y
grep -q "HUNG (or cut at the deadline) after [0-9]* s" y/hangs.txt || fail "no stacks of the cut runs: $(ls y)"
grep -q "^## check$" o2/summary.md || fail "$(cat o2/summary.md)"
grep -q "^## matrix-world1: not started: [0-9]* s left of the deadline, it needs about 5 s" o2/summary.md || fail "$(cat o2/summary.md)"
pass "with runs that never end, the script ends in $((t1 - t0)) s of its 40 s deadline and names what it cut"
echo "all e2e_gpu_check checks passed"
