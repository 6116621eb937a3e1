#!/usr/bin/env bash
# optim.state (bf16 and int8 moments) through `strata train` (issue 30):
#  - resume is bitwise: a run resumed from its step-5 checkpoint logs the losses of the run
#    that kept going, on one rank and at world 2 stage 3 with the state and parameters on NVMe;
#  - resharding: an int8 checkpoint of world 4 stage 3 resumes at world 2 stage 1 and world 1
#    stage 0 (state pinned) with the next-step loss of the world-4 run;
#  - another state type on resume: an int8 checkpoint resumed with fp32 state and an fp32 one
#    with int8 say what the load does, and their first step (the saved weights) is bitwise;
#  - format: fp32 state writes format 1 as before (no optim_state), int8 format 2 with it;
#  - the plan: the state at its real size (12, 8, about 6 bytes a parameter); where 8-bit
#    state is the cheapest change that fits, `strata plan` names it first, marked as one that
#    changes the optimizer's numerics, with the cheapest that does not after it; `strata
#    train` refuses with the latter and names the former; memory.auto measures it only with
#    memory.allow_int8_state: true.
# (test_engine compares the state itself byte for byte across world sizes and state types.)
set -euo pipefail
S=${STRATA:?set by ctest}
command -v mpirun > /dev/null || { echo "mpirun not found: skipping"; exit 77; }
MPI=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
MPI+=(-x OMP_NUM_THREADS=1)
W=$(mktemp -d /tmp/strata-e2e-optim-state.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1/metrics.jsonl"; }
loss_at() { grep "\"step\": $2," "$1/metrics.jsonl" | grep -o '"loss": [^,]*' | cut -d' ' -f2; }

cat "$STRATA_SOURCE_DIR"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
mkdir nvme
# n_embd 32: the embedding (8192 elements) and the MLP matrices (4096) have 8-bit moments,
# the attention matrices (3072), position table and norms keep fp32 ones
cat > z.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin", val: "data/val_*.bin"}
train: {steps: 11, micro_batch: 2, eval_every: 0, log_every: 1, sample_tokens: 0}
optim: {lr: 1.0e-3, warmup_steps: 2}
run: {dir: runs/a, checkpoint_every: 5, keep: 0}
YAML

# --- resume is bitwise, one rank and world 2 stage 3 on NVMe
nv=(--set zero.stage=3 --set offload.optimizer=nvme --set offload.params=nvme --set "offload.nvme_path=$PWD/nvme")
for st in int8 bf16; do
  "$S" train z.yaml --set optim.state=$st --set run.dir=runs/a$st > a$st.log
  "$S" train z.yaml --set optim.state=$st --set run.dir=runs/b$st --resume runs/a$st/ckpt/step_00000005 > b$st.log
  diff <(losses runs/a$st | sed -n '6,11p') <(losses runs/b$st) > /dev/null || fail "$st: resumed losses differ"
  "${MPI[@]}" -np 2 "$S" train z.yaml --set optim.state=$st --set run.dir=runs/n$st "${nv[@]}" > n$st.log
  "${MPI[@]}" -np 2 "$S" train z.yaml --set optim.state=$st --set run.dir=runs/m$st "${nv[@]}" \
    --resume runs/n$st/ckpt/step_00000005 > m$st.log
  diff <(losses runs/n$st | sed -n '6,11p') <(losses runs/m$st) > /dev/null || fail "$st: world 2 stage 3 NVMe: resumed losses differ"
  pass "$st state: resume from step 5 is bitwise (steps 6-11), world 1 and world 2 stage 3 on NVMe"
done

# --- format: fp32 state as before, int8 saying how its moments are stored
m1=runs/a/ckpt/step_00000005/manifest.yaml
"$S" train z.yaml > f.log
grep -q '^format: strata-checkpoint-1$' $m1 && ! grep -q optim_state $m1 || fail "fp32 state: not format 1: $(head -8 $m1)"
m8=runs/aint8/ckpt/step_00000005/manifest.yaml
grep -q '^format: strata-checkpoint-2$' $m8 && grep -q '^optim_state: int8$' $m8 || fail "int8 state: $(head -8 $m8)"
pass "fp32 state writes format 1 (no optim_state), int8 format 2 with optim_state: int8"

# --- resharding: world 4 stage 3 -> world 2 stage 1, world 1 stage 0 (state pinned)
"${MPI[@]}" -np 4 "$S" train z.yaml --set optim.state=int8 --set run.dir=runs/w4 --set zero.stage=3 \
  --set run.checkpoint_every=10 > w4.log
ref=$(loss_at runs/w4 11)
"${MPI[@]}" -np 2 "$S" train z.yaml --set optim.state=int8 --set run.dir=runs/w2 --set zero.stage=1 \
  --set train.micro_batch=4 --resume runs/w4/ckpt/step_00000010 > w2.log
"$S" train z.yaml --set optim.state=int8 --set run.dir=runs/w1 --set zero.stage=0 --set train.micro_batch=8 \
  --set offload.optimizer=cpu --resume runs/w4/ckpt/step_00000010 > w1.log
for w in w2 w1; do
  got=$(loss_at runs/$w 11)
  python3 -c "import sys; a,b=float('$ref'),float('$got'); sys.exit(0 if abs(a-b)<=1e-5*abs(a) else 1)" \
    || fail "int8 $w: step 11 loss $got vs world-4 $ref"
done
pass "int8 state: world 4 stage 3 checkpoint resumed at world 2 stage 1 and world 1 stage 0 (pinned): step 11 loss $ref"

# --- another state type on resume, said; the first step runs on the saved weights
"$S" train z.yaml --set optim.state=fp32 --set run.dir=runs/c32 --resume runs/aint8/ckpt/step_00000005 > c32.log 2>&1
grep -q "the checkpoint's optimizer state is int8, this run's optim.state is fp32: Adam's moments are dequantized to fp32" c32.log ||
  fail "int8 -> fp32 not said: $(grep ckpt c32.log)"
"$S" train z.yaml --set optim.state=int8 --set run.dir=runs/c8 --resume runs/a/ckpt/step_00000005 > c8.log 2>&1
grep -q "the checkpoint's optimizer state is fp32, this run's optim.state is int8: Adam's moments are quantized to 8 bits" c8.log ||
  fail "fp32 -> int8 not said: $(grep ckpt c8.log)"
[ "$(loss_at runs/c32 6)" = "$(loss_at runs/aint8 6)" ] && [ "$(loss_at runs/c8 6)" = "$(loss_at runs/a 6)" ] ||
  fail "step 6 after a resume with another state type: $(loss_at runs/c32 6) vs $(loss_at runs/aint8 6), $(loss_at runs/c8 6) vs $(loss_at runs/a 6)"
[ "$(losses runs/c32 | wc -l)" -eq 6 ] && [ "$(losses runs/c8 | wc -l)" -eq 6 ] || fail "the converted runs did not reach step 11"
pass "int8 -> fp32 and fp32 -> int8 on resume: said, and trained on from the saved weights"
# --- the plan: real sizes, and the 8-bit rung of the remedy ladder
cat > wide.yaml <<'YAML'
device: cpu
model: {n_layer: 4, n_head: 4, n_embd: 256, seq_len: 16, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 3, micro_batch: 1, eval_every: 0, sample_tokens: 0}
run: {dir: runs/w}
YAML
bpp() { "$S" plan wide.yaml --set optim.state="$1" | grep -o 'optimizer state: [0-9.]* bytes a parameter' | grep -o '[0-9.]*'; }
b32=$(bpp fp32) b16=$(bpp bf16) b8=$(bpp int8)
[ "$b32" = 12.00 ] && [ "$b16" = 8.00 ] && python3 -c "import sys; sys.exit(0 if 6.0 < $b8 < 6.1 else 1)" ||
  fail "bytes a parameter: fp32 $b32, bf16 $b16, int8 $b8"
pass "the plan counts the optimizer state at its real size: $b32, $b16 and $b8 bytes a parameter"
# 3.2M parameters in 45 MiB: fp32 state needs 62.8 MiB, int8 44.5
set +e; "$S" plan wide.yaml --gpu-gb 0.045 > p8.txt; rc=$?; set -e
[ $rc -eq 3 ] || fail "the plan should not fit: $(cat p8.txt)"
grep -q -- "cheapest change that fits (about +2% step time; changes the optimizer's numerics, 8-bit Adam moments): --set optim.state=int8$" p8.txt &&
  grep -q -- "cheapest change that keeps the optimizer's numerics (about +30% step time): --set offload.optimizer=cpu$" p8.txt ||
  fail "strata plan should name int8 first, marked, then the change that keeps the numerics: $(tail -3 p8.txt)"
"$S" plan wide.yaml --gpu-gb 0.045 --set optim.state=int8 > p8fit.txt || fail "--set optim.state=int8 should fit: $(cat p8fit.txt)"
set +e; "$S" train wide.yaml --set memory.gpu_gb=0.045 > t8.txt 2>&1; rc=$?; set -e
[ $rc -eq 3 ] && grep -A1 "The cheapest change that fits, keeping the global batch (about +30% step time)" t8.txt | grep -q -- "--set offload.optimizer=cpu$" &&
  grep -A1 "Cheaper, changing the optimizer's numerics (8-bit Adam moments; about +2% step time)" t8.txt | grep -q -- "--set optim.state=int8$" ||
  fail "strata train should refuse with the change that keeps the numerics, then name int8: $(tail -6 t8.txt)"
pass "where int8 is the cheapest change that fits: strata plan names it first, marked; strata train refuses with offload and names it"
# memory.auto: never int8 unless allowed
"$S" train wide.yaml --set memory.gpu_gb=0.045 --set memory.auto=true --set run.dir=runs/auto > auto.log 2>&1 || fail "memory.auto: $(tail -3 auto.log)"
head -1 runs/auto/metrics.jsonl > auto.json
! grep -q "optim.state" auto.json || fail "memory.auto chose or measured int8 without memory.allow_int8_state: $(cat auto.json)"
"$S" train wide.yaml --set memory.gpu_gb=0.045 --set memory.auto=true --set memory.allow_int8_state=true \
  --set run.dir=runs/auto8 > auto8.log 2>&1 || fail "memory.auto with int8 allowed: $(tail -3 auto8.log)"
head -1 runs/auto8/metrics.jsonl > auto8.json
python3 - auto8.json <<'PY' || fail "memory.auto with memory.allow_int8_state should measure int8: $(cat auto8.json)"
import json, sys
d = json.load(open(sys.argv[1]))
changes = [t["change"] for t in d["memory_auto_trials"]]
sys.exit(0 if "--set optim.state=int8" in changes and d["memory_auto"] in changes else 1)
PY
pass "memory.auto: int8 is never measured nor chosen unless memory.allow_int8_state: true, then it is a candidate"
echo "all e2e_optim_state checks passed"
