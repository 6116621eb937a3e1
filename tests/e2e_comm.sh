#!/usr/bin/env bash
# tests/e2e_comm.sh: test_comm under mpirun at 2, 3 and 4 ranks (the mpi backend, odd
# and even worlds), then the watchdog: a job where rank 0 skips a barrier must be
# aborted with the timeout message within seconds, not hang.
set -euo pipefail

if ! command -v mpirun >/dev/null 2>&1; then
    echo "skip: mpirun not found"
    exit 77
fi
test_comm="${STRATA_BUILD_DIR:?STRATA_BUILD_DIR must point at the build folder}/tests/test_comm"
[ -x "$test_comm" ] || { echo "FAIL: $test_comm is not built"; exit 1; }

root_flag=()
[ "$(id -u)" = 0 ] && root_flag=(--allow-run-as-root)
passed=0
failed=0
for np in 3 2 4; do
    echo "== test_comm with $np ranks"
    # --oversubscribe: CI has 2 cores and this runs up to 4 ranks.
    if timeout 300 env OMP_NUM_THREADS=1 \
        mpirun -np "$np" --oversubscribe "${root_flag[@]}" "$test_comm"; then
        passed=$((passed + 1))
    else
        echo "FAIL: test_comm with $np ranks"
        failed=$((failed + 1))
    fi
done

echo "== watchdog: rank 0 never joins the barrier"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
start=$(date +%s)
set +e
timeout 60 env STRATA_TEST_COMM_WATCHDOG=1 OMP_NUM_THREADS=1 \
    mpirun -np 2 --oversubscribe "${root_flag[@]}" "$test_comm" >"$log" 2>&1
rc=$?
set -e
elapsed=$(( $(date +%s) - start ))
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$elapsed" -lt 25 ] &&
    grep -q "\[comm\] barrier of 0 bytes did not complete within 1 s; another rank probably failed: aborting the job" "$log"; then
    echo "ok   job aborted in ${elapsed}s with exit $rc and the timeout message"
    passed=$((passed + 1))
else
    echo "FAIL: watchdog run exited $rc after ${elapsed}s; its output:"
    cat "$log"
    failed=$((failed + 1))
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
