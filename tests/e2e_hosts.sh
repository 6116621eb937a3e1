#!/usr/bin/env bash
# Many machines, across real network hops (issue 32). Three hosts made of network namespaces
# (tests/netns_hosts.sh: h1, h2, h3, each with its own hostname, its own node-local
# directory and a veth on one bridge), and Open MPI jobs across them started by mpirun's
# own launcher (its rsh agent enters a namespace instead of ssh), so ranks on different
# hosts talk over TCP between 10.77.0.1-3 and shared memory only within a host:
#  - two ranks per host, ZeRO stage 1, and stage 3 with the optimizer offloaded: the losses
#    of the single-host run within 1e-5, the traffic through the hosts' links;
#  - what differs between hosts: the local rank (Open MPI's, srun's SLURM_LOCALID faked, a
#    clash), a run.dir on node-local disks (refused, naming the hosts that cannot see it),
#    an offload.nvme_path or data shards one host lacks (named with the host, before step 1);
#  - losing a host: all of h3's ranks killed, or h3's link cut mid-step: every survivor
#    ends within comm.timeout_s naming h3, its ranks and the checkpoint to resume from, and
#    the resume runs on two hosts, with the uninterrupted run's losses; a Ctrl-C to mpirun
#    while rank 0 alone still samples names nobody lost.
# Root and iproute2 are needed (skipped otherwise); everything made is removed at the end
# however the test ends, and every launch runs under `timeout`.
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] && command -v ip > /dev/null && command -v unshare > /dev/null || skip "needs root and ip netns"
command -v mpirun > /dev/null && mpirun --version 2>&1 | grep -q "Open MPI" || skip "needs Open MPI's mpirun (its rsh agent starts the hosts)"
command -v python3 > /dev/null || skip "needs python3"
# shellcheck source=tests/netns_hosts.sh
source "$SRC/tests/netns_hosts.sh"
W=$(mktemp -d /tmp/strata-e2e-hosts.XXXXXX)
cleanup() { hosts_down; [ -n "${KEEP:-}" ] || rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 1' INT TERM
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
hosts_up 3 "st$$" "$W" 2> "$W/netns.err" || skip "needs root and ip netns: $(head -2 "$W/netns.err")"
cd "$W"

# every launch from h1, under timeout: job LIMIT_S HOSTS NP ARGS... (output in $out, exit in $rc)
job() {
  local limit=$1 hosts=$2 np=$3
  shift 3
  set +e
  out=$(timeout "$limit" ./on h1 mpirun "${HOSTS_MPI[@]}" --host "$hosts" -np "$np" "$@" 2>&1)
  rc=$?
  set -e
}
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1/metrics.jsonl"; }
# the losses of run $1 from step $3 on equal run $2's within 1e-5
same_losses() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "${3:-1}" <<'PY' || fail "$1's losses differ from $2's: $(paste <(losses "$1") <(losses "$2") | head -20)"
import json, sys
a = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2]))}
steps = [s for s in b if s >= int(sys.argv[3])]
assert steps and all(s in a for s in steps), (sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) for s in steps)
print(f"  {len(steps)} steps, largest difference {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
PY
}

# --- each piece by hand first: mpirun's agent starts one process per host, each with its name
job 60 h1,h2,h3 3 hostname
# (only the hostname lines: mpirun's rsh agent now and then adds a harmless warning of its
# own, "plm:rsh: Warning: setpgid(...) failed in parent with errno=Permission denied", when a
# child has exec'd before the parent set its process group)
[ $rc -eq 0 ] && [ "$(grep -xE 'h[0-9]+' <<<"$out" | sort | tr '\n' ' ')" = "h1 h2 h3 " ] ||
  fail "mpirun across the namespaces: exit $rc: $out"
pass "mpirun --host h1,h2,h3 starts one process on each namespace host, each with its own hostname"

cat "$SRC"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > h.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin", val: ""}
train: {steps: 12, micro_batch: 2, eval_every: 0, log_every: 100, sample_tokens: 0}
optim: {lr: 3.0e-3, warmup_steps: 0, schedule: constant}
run: {dir: runs/ref, checkpoint_every: 4, keep: 0, tensorboard: false}
comm: {timeout_s: 30}
YAML
# world 6 x micro-batch 2 = world 1 x 12 = world 4 x 3: the same tokens per step
"$S" train h.yaml --set train.micro_batch=12 > ref.log 2>&1 || fail "the single-host run: $(tail -3 ref.log)"

# --- two ranks per host, stage 1 and stage 3 with the optimizer offloaded: the single host's losses
rx0=$(host_rx_bytes h3)
job 120 h1:2,h2:2,h3:2 6 "$S" train h.yaml --set run.dir=runs/z1 --set zero.stage=1
[ $rc -eq 0 ] || fail "stage 1 across three hosts: exit $rc: $out"
grep -q "\[rank 0\] \[train\] 6 ranks on 3 hosts: h1 (ranks 0, 1), h2 (ranks 2, 3), h3 (ranks 4, 5)" <<<"$out" ||
  fail "rank 0 does not name the job's hosts: $out"
rx=$(( $(host_rx_bytes h3) - rx0 ))
[ $rx -gt 100000 ] || fail "h3's link carried only $rx bytes: the ranks did not talk over TCP between hosts"
same_losses runs/z1 runs/ref
pass "ZeRO stage 1, 6 ranks on 3 hosts (h3's link received $rx bytes): the single-host losses within 1e-5"
job 120 h1:2,h2:2,h3:2 6 "$S" train h.yaml --set run.dir=runs/z3 --set zero.stage=3 --set offload.optimizer=cpu
[ $rc -eq 0 ] || fail "stage 3 with offload across three hosts: exit $rc: $out"
same_losses runs/z3 runs/ref
pass "ZeRO stage 3 with offload.optimizer=cpu, 6 ranks on 3 hosts: the single-host losses within 1e-5"

# --- the local rank each host gives: Open MPI's, srun's (faked: Open MPI's removed), a clash
one=(--set train.steps=1 --set run.checkpoint_at_end=false)
slurm() { echo "-np 1 env -u OMPI_COMM_WORLD_LOCAL_RANK SLURM_PROCID=$1 SLURM_LOCALID=$2 SLURM_STEP_NUM_TASKS=4 STRATA_LOG=debug $S train h.yaml --set run.dir=runs/s$3 ${one[*]}"; }
# shellcheck disable=SC2046 # the app contexts are words on purpose
job 60 h1:2,h2:2 4 $(slurm 0 0 a) : $(slurm 1 1 a) : $(slurm 2 0 a) : $(slurm 3 1 a)
[ $rc -eq 0 ] || fail "faked srun environment: exit $rc: $out"
for r in 0 1 2 3; do
  h=h$((r / 2 + 1)) l=$((r % 2))
  grep -q "\[rank $r\] \[train\] host $h, local rank $l (from SLURM_LOCALID), device $l" <<<"$out" ||
    fail "rank $r should take local rank $l from SLURM_LOCALID on $h: $(grep "local rank" <<<"$out")"
done
# shellcheck disable=SC2046
job 60 h1:2,h2:2 4 $(slurm 0 0 b) : $(slurm 1 0 b) : $(slurm 2 0 b) : $(slurm 3 0 b)
[ $rc -eq 0 ] || fail "a clash of SLURM_LOCALID: exit $rc: $out"
grep -q "warning: \[train\] on host h1, ranks 0 and 1 both have local rank 0 (from SLURM_LOCALID)" <<<"$out" ||
  fail "a clash of local ranks is not named: $(grep -i "local rank" <<<"$out")"
grep -q "\[rank 3\] \[train\] host h2, local rank 0 (from SLURM_LOCALID), device 1" <<<"$out" ||
  fail "after a clash each rank should take its position on its host: $(grep "local rank" <<<"$out")"
job 60 h1:2,h2:2 4 env STRATA_LOG=debug "$S" train h.yaml --set run.dir=runs/s3 "${one[@]}"
grep -q "\[rank 3\] \[train\] host h2, local rank 1 (from OMPI_COMM_WORLD_LOCAL_RANK), device 1" <<<"$out" ||
  fail "Open MPI's local rank: $(grep "local rank" <<<"$out")"
set +e; out=$(timeout 60 env SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=0 "$S" train h.yaml --set run.dir=runs/s4 2>&1); rc=$?; set -e
[ $rc -eq 1 ] && grep -q "srun started 2 tasks, but none of them can reach the others" <<<"$out" ||
  fail "srun's tasks without a PMI plugin: exit $rc: $out"
pass "local ranks per host from OMPI_COMM_WORLD_LOCAL_RANK and (faked) SLURM_LOCALID; a clash is named and each rank takes its place on its host; srun without --mpi is refused"

# --- what one host lacks is named with the host, before step 1
mkdir -p node-h1/run node-h1/nvme node-h1/data && cp data/* node-h1/data/
job 60 h1:2,h2:2,h3:2 6 "$S" train h.yaml --set run.dir=node/run
[ $rc -eq 2 ] || fail "a node-local run.dir: exit $rc: $out"
grep -q "run.dir 'node/run': ranks 2, 3 on h2 and 4, 5 on h3 cannot see the job.txt rank 0 just wrote there" <<<"$out" ||
  fail "a node-local run.dir: the hosts that cannot see it are not named: $out"
grep -q "run.dir must be one directory every host shares" <<<"$out" || fail "the refusal does not say what must be shared: $out"
pass "a run.dir on node-local disks is refused (exit 2), naming ranks 2, 3 on h2 and 4, 5 on h3"
job 60 h1:2,h2:2,h3:2 6 "$S" train h.yaml --set run.dir=runs/nv --set offload.optimizer=nvme --set offload.nvme_path=node/nvme
[ $rc -eq 2 ] || fail "offload.nvme_path on h1 only: exit $rc: $out"
grep -q "\[rank 0\] error: \[train\] ranks 2, 3 on h2 and 4, 5 on h3: h.yaml: key 'offload.nvme_path': 'node/nvme': No such file or directory" <<<"$out" ||
  fail "offload.nvme_path missing on two hosts: not named: $out"
pass "an offload.nvme_path that h2 and h3 lack: exit 2, naming their ranks and hosts"
job 60 h1:2,h2:2,h3:2 6 "$S" train h.yaml --set run.dir=runs/dt --set "data.train=node/data/train_*.bin"
[ $rc -eq 2 ] || fail "data on h1 only: exit $rc: $out"
grep -q "\[rank 0\] error: \[train\] ranks 2, 3 on h2 and 4, 5 on h3: the data.train differs from rank 0's on h1 (rank 0's first): 1 file of .* vs no file" <<<"$out" ||
  fail "data shards h2 and h3 lack: not named: $out"
[ ! -e runs/dt ] || fail "a refused start must not touch run.dir"
pass "data shards that h2 and h3 cannot see: exit 2 before step 1, naming their ranks and hosts"

# --- Ctrl-C to mpirun during the final sample (rank 0's alone): h1's ranks stop and end,
# and h2's and h3's, past their last collective and signalled after them, must not name
# them lost
timeout 120 ./on h1 mpirun "${HOSTS_MPI[@]}" --host h1:2,h2:2,h3:2 -np 6 "$S" train h.yaml --set run.dir=runs/int \
  --set train.steps=2 --set train.sample_tokens=1048576 > runs/int.log 2>&1 &
jobpid=$!
for _ in $(seq 3000); do grep -aq "^---- sample" runs/int.log && break; kill -0 $jobpid 2> /dev/null || break; sleep 0.01; done
grep -aq "^---- sample" runs/int.log || fail "no final sample began: $(tail -5 runs/int.log)"
# shellcheck disable=SC2046 # mpirun on h1, as a Ctrl-C reaches it
kill -INT $(host_pids h1 mpirun)
set +e; wait $jobpid; rc=$?; set -e
[ $rc -ne 124 ] || fail "Ctrl-C to mpirun during the final sample: the job did not end"
grep -aq "sample ended early: a stop was asked for" runs/int.log || fail "the sample did not stop: $(grep -a '^\[rank' runs/int.log | tail -5)"
! grep -aq "^\[rank [0-9]*\] error: " runs/int.log || fail "a Ctrl-C named ranks lost: $(grep -a 'error: ' runs/int.log | cut -c1-300)"
pass "Ctrl-C to mpirun during the final sample: the sample stops, and no rank names another lost (mpirun exits $rc)"

# --- losing a host: a run that would go on for long, checkpointing every 4 steps
long=(--set train.steps=100000 --set run.checkpoint_every=4)
# start_long DIR TIMEOUT_S: the job in the background, until its first checkpoint
start_long() {
  timeout 120 ./on h1 mpirun "${HOSTS_MPI[@]}" --host h1:2,h2:2,h3:2 -np 6 "$S" train h.yaml --set run.dir="$1" \
    --set comm.timeout_s="$2" "${long[@]}" > "$1.log" 2>&1 &
  jobpid=$!
  for _ in $(seq 3000); do [ -f "$1/ckpt/latest" ] && break; kill -0 $jobpid 2> /dev/null || break; sleep 0.01; done
  [ -f "$1/ckpt/latest" ] || fail "no checkpoint before losing the host: $(tail -5 "$1.log")"
}
# wait_survivors T0 LIMIT_S: until no rank is left on h1 or h2; their time in $took
wait_survivors() {
  while [ -n "$(host_pids h1 strata)$(host_pids h2 strata)" ]; do
    [ "$(awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { print (b - a > '"$2"') }')" = 0 ] || fail "ranks still running on h1 or h2 $2 s after losing h3"
    sleep 0.05
  done
  took=$(awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
}
# every survivor names h3's ranks and the checkpoint to resume from
survivors_say() { # LOG TEXT
  for r in 0 1 2 3; do
    grep "^\[rank $r\] error: " "$1" | grep -F -- "$2" | grep -q "The last checkpoint, step [0-9]* (runs/[a-z]*/ckpt/step_000000[0-9]*), is intact: resume with --resume latest" ||
      fail "rank $r does not name h3's ranks ($2) and the checkpoint: $(grep -v '^  ' "$1" | tail -12)"
  done
}

start_long runs/kill 10
t0=$EPOCHREALTIME
# shellcheck disable=SC2046 # both of h3's ranks at once
kill -KILL $(host_pids h3 strata)
wait_survivors "$t0" 10
set +e; wait $jobpid; rc=$?; set -e
[ $rc -eq 137 ] || fail "mpirun's exit after h3's ranks were killed: $rc (the README says 137): $(tail -5 runs/kill.log)"
survivors_say runs/kill.log "ranks 4, 5 on h3 are gone: h3 answers, but the processes are not there (killed, or crashed)"
grep -q "The job's hosts: h1 (ranks 0, 1), h2 (ranks 2, 3), h3 (ranks 4, 5)" runs/kill.log || fail "the job's hosts are not listed: $(tail -5 runs/kill.log)"
! grep -q "on h[12] \(is\|are\) gone\|on h[12] do" runs/kill.log || fail "a survivor names another survivor as lost: $(grep error runs/kill.log)"
pass "h3's ranks killed: the 4 survivors ended in ${took}s (comm.timeout_s 10), each naming ranks 4, 5 on h3 and the checkpoint; mpirun exits 137"
saved=$(sed 's/step_0*//' runs/kill/ckpt/latest)
job 120 h1:2,h2:2 4 "$S" train h.yaml --set run.dir=runs/kill --set train.micro_batch=3 --set train.steps=12 --resume latest
[ $rc -eq 0 ] || fail "the resume on two hosts: exit $rc: $out"
grep -q "resumed from .* (step $saved, saved at world 6 stage 0)" <<<"$out" || fail "the resume does not say where it started: $out"
same_losses runs/kill runs/ref $((saved + 1))
pass "the resume from step $saved on h1 and h2 (4 ranks): the uninterrupted single-host losses within 1e-5"

start_long runs/cut 3
t0=$EPOCHREALTIME
ip -n "${HOSTS_PREFIX}h3" link set eth0 down
wait_survivors "$t0" 15
set +e; wait $jobpid; rc=$?; set -e
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "mpirun after h3's link was cut: exit $rc (124: it did not end by itself): $(tail -8 runs/cut.log)"
survivors_say runs/cut.log "ranks 4, 5 on h3 do not answer (h3 is down, or cut off from h"
! grep -q "on h[12] \(is\|are\) gone\|on h[12] do" runs/cut.log || fail "a survivor names another survivor as lost: $(grep error runs/cut.log)"
pass "h3's link cut mid-step: the 4 survivors ended in ${took}s (comm.timeout_s 3), each naming ranks 4, 5 on h3 and the checkpoint; mpirun exits $rc"
saved=$(sed 's/step_0*//' runs/cut/ckpt/latest)
job 120 h1:2,h2:2 4 "$S" train h.yaml --set run.dir=runs/cut --set train.micro_batch=3 --set train.steps=12 --resume latest
[ $rc -eq 0 ] || fail "the resume on two hosts after the cut: exit $rc: $out"
same_losses runs/cut runs/ref $((saved + 1))
pass "the resume from step $saved on h1 and h2 after the cut: the uninterrupted single-host losses within 1e-5"
echo "PASS"
