#!/usr/bin/env bash
# The local rank under Slurm, on one host, with Slurm's environment faked (no Slurm here):
#  - srun with a PMI plugin gives no OMPI_COMM_WORLD_LOCAL_RANK: each rank takes
#    SLURM_LOCALID (mpirun's own variable removed, SLURM_PROCID and SLURM_STEP_NUM_TASKS
#    those of the job);
#  - mpirun inside an sbatch script: every rank inherits the script's SLURM_PROCID=0 and
#    SLURM_LOCALID=0, which describe no rank but 0; the others do not take them;
#  - srun's several tasks without a PMI plugin (--mpi=none) would each train alone in the
#    same run.dir: refused, saying to launch with srun --mpi=pmix.
# tests/e2e_hosts.sh does the same across hosts.
set -euo pipefail
S=${STRATA:?set by ctest}
command -v mpirun > /dev/null && mpirun --version 2>&1 | grep -q "Open MPI" || { echo "skipped: needs Open MPI's mpirun"; exit 77; }
MPI=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
W=$(mktemp -d /tmp/strata-e2e-slurm-env.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }

cat "$STRATA_SOURCE_DIR"/core/*.h > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null 2>&1
cat > r.yaml <<'YAML'
device: cpu
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 256}
data: {train: "data/train_*.bin", val: ""}
train: {steps: 1, micro_batch: 1, eval_every: 0, log_every: 1, sample_tokens: 0}
run: {dir: runs/m, checkpoint_at_end: false}
YAML
# one rank of a two-rank job as srun would start it: rank, SLURM_PROCID, SLURM_LOCALID
task() { echo "-np 1 env -u OMPI_COMM_WORLD_LOCAL_RANK SLURM_PROCID=$1 SLURM_LOCALID=$2 SLURM_STEP_NUM_TASKS=2 STRATA_LOG=debug $S train r.yaml --set run.dir=runs/$3"; }
run() { set +e; out=$(timeout 120 "${MPI[@]}" "$@" 2>&1); rc=$?; set -e; }

# shellcheck disable=SC2046 # the app contexts are words on purpose
run $(task 0 1 a) : $(task 1 0 a)
[ $rc -eq 0 ] || fail "under a faked srun: exit $rc: $out"
grep -q "\[rank 0\] \[train\] host $(hostname), local rank 1 (from SLURM_LOCALID), device 1" <<<"$out" &&
  grep -q "\[rank 1\] \[train\] host $(hostname), local rank 0 (from SLURM_LOCALID), device 0" <<<"$out" ||
  fail "each rank should take SLURM_LOCALID: $(grep "local rank" <<<"$out")"
pass "srun's SLURM_LOCALID gives each rank its local rank (and its device) when Open MPI's is not there"

# mpirun inside sbatch: both ranks inherit SLURM_PROCID=0, SLURM_LOCALID=0
run $(task 0 0 b) : $(task 0 0 b)
[ $rc -eq 0 ] || fail "mpirun inside sbatch: exit $rc: $out"
grep -q "\[rank 1\] \[train\] host $(hostname), local rank 1 (from MPI_COMM_TYPE_SHARED), device 1" <<<"$out" ||
  fail "rank 1 must not take the script's SLURM_LOCALID: $(grep "local rank" <<<"$out")"
! grep -q "both have local rank" <<<"$out" || fail "no clash: $(grep "local rank" <<<"$out")"
pass "SLURM_LOCALID inherited from an sbatch script (SLURM_PROCID 0 on every rank) is not taken: MPI's shared-memory split is"

set +e; out=$(timeout 60 env SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=2 SLURM_LOCALID=0 "$S" train r.yaml --set run.dir=runs/c 2>&1); rc=$?; set -e
[ $rc -eq 1 ] && grep -q "srun started 4 tasks, but none of them can reach the others: .*Launch with \`srun --mpi=pmix\`" <<<"$out" ||
  fail "srun's tasks without a PMI plugin: exit $rc: $out"
[ ! -e runs/c ] || fail "a refused start must not touch run.dir"
SLURM_STEP_NUM_TASKS=1 SLURM_PROCID=0 "$S" train r.yaml --set run.dir=runs/d > one.log 2>&1 || fail "srun -n 1: $(tail -3 one.log)"
pass "srun's several tasks without --mpi=pmix are refused (exit 1, saying how); a single task trains"
echo "PASS"
