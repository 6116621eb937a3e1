#!/usr/bin/env bash
# The memory plan: planned bytes equal the allocator's at every stage and world size,
# over-budget runs are refused (exit 3) with a change that, applied, trains; memory.auto
# measures the changes that fit and applies the fastest; 2,000 steps keep RSS flat.
set -euo pipefail
S=${STRATA:?set by ctest}
command -v mpirun > /dev/null || { echo "mpirun not found: skipping"; exit 77; }
MPI=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
W=$(mktemp -d /tmp/strata-e2e-plan.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
# the --set line of "cheapest change that fits" in a plan's output
suggested() { grep -o 'cheapest change that fits[^:]*: .*' "$1" | sed 's/^[^:]*: //'; }
run() { local n=$1; shift; if [ "$n" -eq 1 ]; then "$S" "$@"; else "${MPI[@]}" -np "$n" "$S" "$@"; fi; }
field() { grep -o "\"$2\": [0-9]*" "$1" | head -1 | cut -d' ' -f2; }

head -c 60000 "$STRATA_SOURCE_DIR/core/model.c" > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > quick.yaml <<'YAML'
device: cpu
model: {n_layer: 4, n_head: 4, n_embd: 128, seq_len: 128, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 1, micro_batch: 16, eval_every: 0, sample_tokens: 0}
run: {dir: runs/q}
YAML
cat > deep.yaml <<'YAML'
device: cpu
model: {n_layer: 8, n_head: 4, n_embd: 128, seq_len: 256, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 1, micro_batch: 1, eval_every: 0, sample_tokens: 0}
run: {dir: runs/d}
YAML
cat > long.yaml <<'YAML'
device: cpu
model: {n_layer: 16, n_head: 4, n_embd: 128, seq_len: 16, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 1, micro_batch: 1, eval_every: 0, sample_tokens: 0}
run: {dir: runs/l}
YAML
cat > wide.yaml <<'YAML'
device: cpu
model: {n_layer: 4, n_head: 4, n_embd: 256, seq_len: 16, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 1, micro_batch: 1, eval_every: 0, sample_tokens: 0}
run: {dir: runs/w}
YAML

# planned device bytes == bytes the allocator handed out, every stage, world 1, 2, 4
for n in 1 2 4; do
  for st in 0 1 2 3; do
    rm -rf runs/w
    run $n train wide.yaml --set zero.stage=$st > /dev/null
    planned=$(field runs/w/metrics.jsonl plan_device_bytes); peak=$(field runs/w/metrics.jsonl peak_mem_bytes)
    [ -n "$planned" ] && [ "$planned" = "$peak" ] || fail "world $n stage $st: planned $planned, allocated $peak"
    # no CUDA runtime row on the CPU: the predicted device total is the arena, and so is what is in use
    total=$(field runs/w/metrics.jsonl plan_device_total_bytes); used=$(field runs/w/metrics.jsonl device_used_peak_bytes)
    [ "$total" = "$planned" ] && [ "$used" = "$planned" ] || fail "world $n stage $st: predicted total $total, in use $used, planned $planned"
  done
  for o in cpu nvme; do
    rm -rf runs/w
    # one rank: the gradients in pinned memory too, and the head and the MLPs in chunks (with
    # every block recomputed, on NVMe)
    more=()
    [ "$n" -eq 1 ] && more=(--set offload.gradients=cpu --set train.logits_chunk_mb=1 --set train.mlp_chunk_mb=1
                            --set train.micro_batch=80)
    [ "$n" -eq 1 ] && [ $o = nvme ] && more+=(--set train.activation_checkpointing=blocks)
    run $n train wide.yaml --set zero.stage=3 --set offload.optimizer=$o --set offload.params=$o --set "offload.nvme_path=$PWD" \
      "${more[@]}" > /dev/null
    for tier in device pinned; do
      if [ $tier = device ]; then planned=$(field runs/w/metrics.jsonl plan_device_bytes); got=$(field runs/w/metrics.jsonl peak_mem_bytes)
      else planned=$(field runs/w/metrics.jsonl plan_pinned_bytes); got=$(field runs/w/metrics.jsonl pinned_bytes); fi
      [ -n "$planned" ] && [ "$planned" = "$got" ] || fail "world $n offload $o: $tier planned $planned, allocated $got"
    done
  done
  pass "world $n, stages 0-3 and offload cpu/nvme (optimizer and parameters$([ "$n" -eq 1 ] && echo ", gradients, the head and the MLPs in chunks")): planned device and pinned bytes equal the allocated bytes"
done

# memory.auto's choice in auto.log and the metrics of its run in $dir, with at least
# $min_trials changes measured: the table, the fastest measured chosen, said once (rank 0),
# applied by every rank, nothing of the trials counted in the run's memory, and the run
# equal step for step to one started with the chosen change by hand (same init, same data).
check_auto() { # name world config budget_gb min_trials
  local name=$1 n=$2 cfg=$3 gb=$4 min_trials=$5 dir chosen
  dir=$(sed -n 's/^run: {dir: \(.*\)}$/\1/p' "$cfg")
  [ "$(grep -c "memory.auto: .*chose" auto.log)" -eq 1 ] || fail "$name: the choice should be logged once: $(grep chose auto.log)"
  head -1 "$dir/metrics.jsonl" > auto.json
  python3 - auto.json auto.log "$min_trials" > verdict.txt <<'PY' || fail "$name: $(cat verdict.txt)"
import json, re, sys
d = json.load(open(sys.argv[1])); log = open(sys.argv[2]).read(); min_trials = int(sys.argv[3])
trials, chosen = d["memory_auto_trials"], d["memory_auto"]
def check(ok, what):
    if not ok: print(what); sys.exit(1)
check(d["plan_device_bytes"] == d["peak_mem_bytes"], "the run's peak %d is not its plan %d: the trials count" % (d["peak_mem_bytes"], d["plan_device_bytes"]))
check(len(trials) >= min_trials, "%d changes measured, expected at least %d" % (len(trials), min_trials))
if len(trials) < 2:
    check(d["memory_auto_basis"] == "the only change that fits", "basis: " + d["memory_auto_basis"])
    print("the only change that fits, so nothing measured"); sys.exit(0)
measured = [t for t in trials if t["ms_per_step"] is not None]
check(measured, "no trial measured: %s" % trials)
best = min(measured, key=lambda t: t["ms_per_step"])
check(chosen == best["change"], "chose '%s', but '%s' measured fastest" % (chosen, best["change"]))
check(d["memory_auto_basis"] == "measured fastest", "basis: " + d["memory_auto_basis"])
check("estimate    ms/step  change" in log, "no table of measured times in the log")
for t in measured:
    check(re.search(r" +[0-9]+\.[0-9]  %s$" % re.escape(t["change"]), log, re.M), "no row for '%s' in the table" % t["change"])
check("chose %s (measured fastest: " % chosen in log, "no 'chose ... (measured fastest' line")
print("the fastest measured of " + ", ".join("%s %.1f ms" % (t["change"].replace("--set ", ""), t["ms_per_step"]) for t in measured))
PY
  chosen=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["memory_auto"])' auto.json)
  applies=$(grep "memory.auto: this rank applies" auto.log | sed 's/.*this rank applies //' | sort | uniq -c)
  [ "$(wc -l <<<"$applies")" -eq 1 ] && [ "$(awk '{print $1}' <<<"$applies")" -eq "$n" ] &&
    [ "$(sed 's/^ *[0-9]* //' <<<"$applies")" = "$chosen" ] || fail "$name: the $n ranks should all apply '$chosen': $applies"
  # shellcheck disable=SC2086
  run $n train "$cfg" --set memory.gpu_gb=$gb --set train.steps=3 --set run.dir=runs/by-hand $chosen > by-hand.log 2>&1 ||
    fail "$name: '$chosen' by hand does not train: $(tail -3 by-hand.log)"
  [ "$(grep -o '"loss": [^,]*' "$dir/metrics.jsonl")" = "$(grep -o '"loss": [^,]*' runs/by-hand/metrics.jsonl)" ] ||
    fail "$name: memory.auto's run differs from '$chosen' by hand: the trials reached the run"
  rm -rf runs/by-hand
}

# over-budget runs: refused with exit 3 and a change that, applied, trains; memory.auto
# measures the cheapest changes that fit and trains with the fastest
check_refusal() { # name world config budget_gb expected_change min_trials
  local name=$1 n=$2 cfg=$3 gb=$4 expect=$5 min_trials=$6
  set +e
  out=$(run $n train "$cfg" --set memory.gpu_gb=$gb 2>&1); rc=$?
  set -e
  [ $rc -eq 3 ] || fail "$name: exit $rc, expected 3: $out"
  [ ! -d "runs/$name" ] || true
  line=$(grep -o -- "--set [^ ]*\( --set [^ ]*\)*" <<<"$out" | head -1)
  [ -n "$line" ] || fail "$name: no suggested change in: $out"
  grep -q -- "$expect" <<<"$line" || fail "$name: suggestion '$line' lacks '$expect'"
  # shellcheck disable=SC2086
  run $n train "$cfg" --set memory.gpu_gb=$gb $line > applied.log 2>&1 || fail "$name: the suggestion '$line' does not train: $(tail -3 applied.log)"
  STRATA_LOG=debug run $n train "$cfg" --set memory.gpu_gb=$gb --set memory.auto=true --set train.steps=3 > auto.log 2>&1 ||
    fail "$name: memory.auto did not train: $(tail -3 auto.log)"
  grep -q "memory.auto: .* chose" auto.log || fail "$name: memory.auto did not say what it chose"
  check_auto "$name" "$n" "$cfg" "$gb" "$min_trials"
  pass "$name at world $n with $gb GiB: refused, suggested '$line', which trains; memory.auto trains with $(cat verdict.txt)"
}
check_refusal quick-45m 1 quick.yaml 0.045 "train.micro_batch=4 --set train.grad_accum=4" 3
check_refusal quick-18m 1 quick.yaml 0.018 "offload.optimizer=cpu" 3
check_refusal deep-40m 1 deep.yaml 0.04 "offload.optimizer=cpu" 2
check_refusal deep-25m 1 deep.yaml 0.025 "offload.gradients=cpu" 0
check_refusal long-12m 1 long.yaml 0.012 "zero.stage=3 --set offload.optimizer=cpu --set offload.params=cpu --set offload.gradients=cpu" 0
check_refusal wide-w2 2 wide.yaml 0.05 "zero.stage=1" 2
check_refusal wide-w4 4 wide.yaml 0.03 "zero.stage=3" 2

# a trial that fails is skipped with its reason; when none runs, memory.auto takes the
# cheapest estimate and warns
rm -rf runs/q
STRATA_FAULT_NAN_STEP=2 "$S" train quick.yaml --set memory.gpu_gb=0.045 --set memory.auto=true > nan.log 2>&1 ||
  fail "memory.auto with every trial failing did not train: $(tail -3 nan.log)"
[ "$(grep -c "skipped  .* (step 2: loss not finite)" nan.log)" -eq 3 ] || fail "each failed trial should say why: $(cat nan.log)"
grep -q "warning: \[plan\] memory.auto: no trial could run .*; chose --set train.micro_batch=4 --set train.grad_accum=4 (cheapest estimate" nan.log &&
  grep -q '"memory_auto_basis": "cheapest estimate, no trial ran"' runs/q/metrics.jsonl ||
  fail "with no trial run, memory.auto should warn and take the cheapest estimate: $(grep plan nan.log)"
STRATA_AUTO_TRIALS=1 "$S" train quick.yaml --set memory.gpu_gb=0.045 --set memory.auto=true > one.log 2>&1 &&
  ! grep -q "ms/step" one.log && grep -q '"memory_auto": "--set train.micro_batch=4 --set train.grad_accum=4"' runs/q/metrics.jsonl ||
  fail "STRATA_AUTO_TRIALS=1 should take the cheapest estimate unmeasured: $(grep plan one.log)"
pass "memory.auto: failed trials skipped with their reason, then the cheapest estimate with a warning; STRATA_AUTO_TRIALS=1 measures nothing"

# the buffers column is broken down by kind
"$S" plan wide.yaml --world 2 --set zero.stage=3 --set offload.optimizer=cpu > kinds.txt || true
grep -q "buffers: comm buckets .*, prefetch .*, workspace" kinds.txt && grep -q "buffers: .*staging" kinds.txt ||
  fail "plan should break buffers down into comm buckets, prefetch, staging, workspace: $(cat kinds.txt)"
pass "plan breaks buffers down by kind: $(grep -m1 'buffers:' kinds.txt | sed 's/^ *//')"

# strata plan says the same without training
set +e; "$S" plan quick.yaml --gpu-gb 0.05 > plan.txt; rc=$?; set -e
[ $rc -eq 3 ] && grep -q "cheapest change that fits" plan.txt || fail "strata plan should refuse with exit 3"
! grep -q "runtime" plan.txt || fail "a CPU plan has no CUDA runtime row: $(cat plan.txt)"

# a GPU run planned where no GPU answers counts the CUDA runtime it will need, estimated
set +e; CUDA_VISIBLE_DEVICES='' "$S" plan quick.yaml --set device=cuda --gpu-gb 0.5 > gplan.txt; rc=$?; set -e
[ $rc -eq 3 ] && grep -q "arena .* + CUDA runtime 552.00 MiB, estimated), 512.00 MiB available" gplan.txt ||
  fail "a cuda plan in 0.5 GiB should be refused for the estimated runtime: $(cat gplan.txt)"
CUDA_VISIBLE_DEVICES='' "$S" plan quick.yaml --set device=cuda --gpu-gb 1 > gplan.txt || fail "a cuda plan in 1 GiB should fit: $(cat gplan.txt)"
grep -q "no GPU here, so estimated: CUDA context 512.00 MiB + cuBLASLt workspace 32.00 MiB, + 8.00 MiB" gplan.txt ||
  fail "the runtime row should say it is an estimate: $(cat gplan.txt)"
pass "a cuda plan without a GPU counts an estimated CUDA runtime of 552 MiB in the fit check"

# a model whose optimizer state fits neither the GPU nor the host alone (a 10.3B GPT on an
# 80 GB GPU and 110 GiB of host memory): the ladder keeps part of the state on the device
# (offload.optimizer_ratio), and its line, applied, fits with both tiers' headroom
cat > big.yaml <<'YAML'
device: cuda
model: {n_layer: 50, n_head: 32, n_embd: 4096, seq_len: 1024, vocab_size: 50257}
data: {train: "data/train_*.bin"}
train: {steps: 20, micro_batch: 4, dtype: bf16, activation_checkpointing: blocks}
YAML
big() { CUDA_VISIBLE_DEVICES='' "$S" plan big.yaml --gpu-gb 79 --host-gb 110 "$@"; }
set +e; big > big.txt; rc=$?; big --set offload.optimizer=cpu > bigcpu.txt; rc_cpu=$?; set -e
[ $rc -eq 3 ] && [ $rc_cpu -eq 3 ] && grep -q "DOES NOT FIT (host memory" bigcpu.txt ||
  fail "10.3B: neither on the GPU nor fully offloaded should fit: $rc $rc_cpu $(cat bigcpu.txt)"
line=$(suggested big.txt)
grep -q -- "--set offload.optimizer=cpu --set offload.optimizer_ratio=0\.[0-9]*$" <<<"$line" ||
  fail "10.3B: the ladder should offload part of the optimizer: $(tail -3 big.txt)"
# shellcheck disable=SC2086 # the suggestion is a list of --set arguments
big $line > bigfit.txt || fail "10.3B with '$line' should fit: $(cat bigfit.txt)"
dev_opt=$(awk '$1 == "device" && NF > 8 {print $6 $7}' bigfit.txt)
pin_opt=$(awk '$1 == "pinned" {print $7 $8}' bigfit.txt)
[ "$dev_opt" != "0B" ] && [ "$pin_opt" != "0B" ] && [ -n "$dev_opt" ] && [ -n "$pin_opt" ] ||
  fail "10.3B: the optimizer state should be on both tiers: device '$dev_opt', pinned '$pin_opt': $(cat bigfit.txt)"
pass "10.3B on 79 GiB GPU + 110 GiB host: '$line' fits, optimizer $dev_opt on the device and $pin_opt pinned"

# a 6.6B GPT on a 24 GB GPU with the optimizer in host memory: its fp32 gradients alone
# (25 GiB) outgrow the GPU, so the ladder keeps them in pinned memory (offload.gradients:
# cpu), and the device holds a few blocks' of them
sed -e 's/n_layer: 50/n_layer: 32/' -e 's/micro_batch: 4/micro_batch: 1, grad_accum: 8/' big.yaml > g24.yaml
g24() { CUDA_VISIBLE_DEVICES='' "$S" plan g24.yaml --set offload.optimizer=cpu --gpu-gb 24 --host-gb 128 "$@"; }
set +e; g24 > g24.txt; rc=$?; set -e
line=$(suggested g24.txt)
[ $rc -eq 3 ] && [ "$line" = "--set offload.gradients=cpu" ] ||
  fail "6.6B on 24 GB: the ladder should keep the gradients in host memory: rc $rc, $(tail -2 g24.txt)"
# shellcheck disable=SC2086 # the suggestion is a list of --set arguments
g24 $line > g24fit.txt || fail "6.6B on 24 GB with '$line' should fit: $(cat g24fit.txt)"
dev_g=$(awk '$1 == "device" && NF > 8 {print $4 $5}' g24fit.txt)
pin_g=$(awk '$1 == "pinned" {print $5 $6}' g24fit.txt)
[ "$pin_g" = "24.79GiB" ] && [ "$dev_g" = "3.03GiB" ] ||
  fail "6.6B on 24 GB: gradients should be 24.79 GiB pinned, 3.03 GiB on the device: '$pin_g', '$dev_g': $(cat g24fit.txt)"
pass "6.6B on a 24 GB GPU: '$line' fits, gradients $pin_g pinned and $dev_g of buffers on the device"

# GPT-2 124M at B=16 on 7.5 GB: its logits (16 x 1024 rows of 50304, bf16: 1.6 GB) tip it
# over; the cheapest change that keeps the numerics is the head in chunks of 256 MiB
h124() { CUDA_VISIBLE_DEVICES='' "$S" plan "$STRATA_SOURCE_DIR/configs/gpt2-124m.yaml" --set device=cuda --gpu-gb 7.5 \
  --set train.activation_checkpointing=none "$@"; }
set +e; h124 > h124.txt; rc=$?; set -e
keep=$(grep -o -- "keeps the optimizer's numerics[^:]*: --set .*" h124.txt | sed 's/^[^:]*: //')
[ $rc -eq 3 ] && [ "$keep" = "--set train.logits_chunk_mb=256" ] ||
  fail "124M on 7.5 GB: the head in chunks should be the rung that keeps the numerics: rc $rc, $(tail -3 h124.txt)"
# shellcheck disable=SC2086 # the suggestion is a list of --set arguments
h124 $keep > h124fit.txt || fail "124M on 7.5 GB with '$keep' should fit: $(cat h124fit.txt)"
pass "GPT-2 124M (B=16) on 7.5 GB: '$keep' fits ($(grep -o '= device *[0-9.]* GiB' h124fit.txt | grep -o '[0-9.]* GiB'))"

# Llama 3.1 8B's shape at its full 131072-token context on an 80 GB GPU with 120 GiB of host
# memory and the optimizer offloaded: every block recomputed, the activations still come to
# 91 GiB (the logits 31 GiB, the 33 residual streams 33 GiB, a block's gate|up and its
# gradient 17.5 GiB); the ladder takes the head a chunk at a time and keeps 30 of the
# residual streams in pinned memory (and the GPU, with room again, a little of the
# optimizer state); the MLPs in chunks too take the rest from 26.5 GiB to 9.6
cat > ctx.yaml <<'YAML'
device: cuda
model: {arch: llama, n_layer: 32, n_head: 32, n_kv_head: 8, n_embd: 4096, intermediate_size: 14336,
        vocab_size: 128256, seq_len: 131072, tie_embeddings: false, rope_theta: 500000}
data: {train: "data/train_*.bin"}
train: {steps: 20, micro_batch: 1, dtype: bf16, activation_checkpointing: blocks}
offload: {optimizer: cpu}
YAML
ctx() { CUDA_VISIBLE_DEVICES='' "$S" plan ctx.yaml --gpu-gb 80 --host-gb 120 "$@"; }
set +e; ctx > ctx.txt; rc=$?; set -e
line=$(suggested ctx.txt)
# the plan says what the activations are made of
grep -q "activations: residual streams 33.00 GiB, logits 31.31 GiB, the rest 26.52 GiB" ctx.txt ||
  fail "8B at T=131072: the plan should break the device's activations down: $(grep -A1 '^  device' ctx.txt)"
[ $rc -eq 3 ] && grep -q -- "--set train.logits_chunk_mb=256 --set offload.activations=cpu" <<<"$line" ||
  fail "8B at T=131072 on 80 GB: the ladder should run the head in chunks and keep the residual streams in host memory: rc $rc, $(tail -3 ctx.txt)"
# shellcheck disable=SC2086 # the suggestion is a list of --set arguments
ctx $line > ctxfit.txt || fail "8B at T=131072 with '$line' should fit: $(cat ctxfit.txt)"
grep -q "activations: residual streams 3.00 GiB, logits 255.88 MiB, the rest 26.52 GiB" ctxfit.txt &&
  grep -q "residual streams: 3 of the 33 on the device, the rest in pinned memory (offload.activations)" ctxfit.txt ||
  fail "8B at T=131072: the plan should say where the residual streams are: $(tail -6 ctxfit.txt)"
ctx --set train.logits_chunk_mb=256 --set train.mlp_chunk_mb=256 --set offload.activations=cpu > ctxmlp.txt 2>&1 || true
grep -q "MLP: 4681 of the micro-batch's 131072 rows at a time (train.mlp_chunk_mb)" ctxmlp.txt &&
  grep -q "activations: residual streams 3.00 GiB, logits 255.88 MiB, the rest 9.64 GiB" ctxmlp.txt ||
  fail "8B at T=131072 with the MLPs in chunks: the plan should say how many rows they take at a time: $(tail -6 ctxmlp.txt)"
pass "Llama 3.1 8B at T=131072 on 80 GB: '$line' fits ($(grep -o '= device *[0-9.]* GiB' ctxfit.txt | grep -o '[0-9.]* GiB'))"

# configs/llama-3.1-8b-32k.yaml on the machine it is for (80 GB GPU, 120 GiB of host
# memory), against Llama 3.1 8B's config.json: it fits, its activations 3.88 GiB of the GPU
# with 3 of the 33 residual streams there, and optimizer_ratio auto keeps a third of the
# state on the GPU (the README's figures)
mkdir -p l8b
cat > l8b/config.json <<'JSON'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
 "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
 "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
 "rope_type": "llama3"}, "rope_theta": 500000.0, "tie_word_embeddings": false, "vocab_size": 128256}
JSON
CUDA_VISIBLE_DEVICES='' "$S" plan "$STRATA_SOURCE_DIR/configs/llama-3.1-8b-32k.yaml" --set model.init_from=l8b --gpu-gb 80 \
  --host-gb 120 > c32k.txt 2>&1 || fail "configs/llama-3.1-8b-32k.yaml should fit 80 GB + 120 GiB: $(tail -4 c32k.txt)"
acts_g=$(awk '$1 == "device" && NF > 8 {print $8 $9}' c32k.txt)
grep -q "offload.optimizer_ratio: auto is 0.67" c32k.txt && [ "$acts_g" = "3.88GiB" ] &&
  grep -q "residual streams: 3 of the 33 on the device" c32k.txt ||
  fail "configs/llama-3.1-8b-32k.yaml: ratio 0.67, 3.88 GiB of activations, 3 streams on the device expected: $(head -6 c32k.txt)"
pass "configs/llama-3.1-8b-32k.yaml fits 80 GB + 120 GiB: activations $acts_g, optimizer_ratio auto 0.67"

# the disk too small for the NVMe state while the host has room: the ladder keeps the first
# units' state in pinned memory (offload.nvme_ratio), and that line trains
mkdir -p swap
cat > small.yaml <<YAML
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 6, micro_batch: 2, eval_every: 0, sample_tokens: 0}
run: {dir: runs/small}
offload: {nvme_path: "$PWD/swap", block_kb: 4}
YAML
disk() { "$S" "$1" small.yaml --set offload.optimizer=nvme --set run.dir=runs/disk --set memory.nvme_gb=0.0003 "${@:2}"; }
set +e; disk plan > disk.txt; rc=$?; set -e
line=$(suggested disk.txt)
[ $rc -eq 3 ] && grep -q "DOES NOT FIT (nvme" disk.txt && grep -q -- "^--set offload.nvme_ratio=0\.[0-9]*$" <<<"$line" ||
  fail "a too-small disk should be answered with offload.nvme_ratio: rc $rc, $(tail -3 disk.txt)"
# shellcheck disable=SC2086 # the suggestion is a list of --set arguments
disk plan $line > disk2.txt || fail "'$line' should fit the disk: $(cat disk2.txt)"
# shellcheck disable=SC2086
disk train $line > disk.log 2>&1 || fail "training with '$line': $(tail -3 disk.log)"
# the same with the stage-3 parameter shards in pinned memory (the split is the tier's own)
set +e; disk plan --set zero.stage=3 --set offload.params=cpu > disk3.txt; set -e
grep -q -- "cheapest change that fits.*: --set offload.nvme_ratio=0\.[0-9]*$" disk3.txt ||
  fail "stage 3, parameters pinned, too-small disk: $(tail -2 disk3.txt)"
pass "a disk too small for the NVMe state: '$line' fits it, the rest pinned, and trains (at stage 3 with pinned parameters too)"

# offload.optimizer_ratio: auto keeps on the device what its budget holds (with 2% of it
# free) and offloads the rest: with a device budget it resolves below 1, names itself in the
# log and in the checkpoint's config, and trains to the same losses as no offload; without a device
# size to go by it offloads everything and says why
cp small.yaml auto.yaml
"$S" train auto.yaml --set run.dir=runs/auto_none > /dev/null 2>&1 || fail "auto.yaml without offload should train"
"$S" train auto.yaml --set run.dir=runs/auto --set offload.optimizer=cpu --set offload.optimizer_ratio=auto --set memory.gpu_gb=0.0007 > auto.log 2>&1 ||
  fail "optimizer_ratio auto: $(tail -3 auto.log)"
r=$(grep -o 'offload.optimizer_ratio: auto is [0-9.]*' auto.log | grep -o '[0-9.]*$')
awk -v r="$r" 'BEGIN { exit !(r > 0 && r < 1) }' || fail "auto with a 0.7 MiB device should keep part on it: '$r': $(grep plan auto.log)"
grep -q "optimizer_ratio: $r" runs/auto/ckpt/step_00000006/manifest.yaml ||
  fail "the checkpoint's config should name the resolved ratio $r: $(grep ratio runs/auto/ckpt/step_00000006/manifest.yaml)"
diff <(grep -o '"loss": [^,]*' runs/auto_none/metrics.jsonl) <(grep -o '"loss": [^,]*' runs/auto/metrics.jsonl) > /dev/null ||
  fail "optimizer_ratio auto ($r): losses differ from no offload"
"$S" plan auto.yaml --set offload.optimizer=cpu --set offload.optimizer_ratio=auto --gpu-gb 0.0007 | grep -q "auto is $r" ||
  fail "strata plan should resolve auto to the same $r"
"$S" train auto.yaml --set run.dir=runs/auto1 --set offload.optimizer=cpu --set offload.optimizer_ratio=auto > auto1.log 2>&1 ||
  fail "auto without a device size: $(tail -3 auto1.log)"
grep -q 'auto is 1: all of the optimizer state is offloaded .*set memory.gpu_gb' auto1.log ||
  fail "auto without a device size should offload everything and say why: $(grep plan auto1.log)"
"$S" plan auto.yaml --set offload.optimizer=cpu --gpu-gb 0.0007 | grep -q "hint: the device has room for .*optimizer_ratio=auto ($r here)" ||
  fail "a full offload with room on the device should name auto: $("$S" plan auto.yaml --set offload.optimizer=cpu --gpu-gb 0.0007 | tail -2)"
! "$S" plan auto.yaml --set offload.optimizer=cpu | grep -q hint || fail "no device size: no hint"
# offload.nvme_ratio: auto keeps pinned what host memory holds (with 10% of it free) and puts
# the rest on NVMe: resolved below 1 on a 1.8 MiB host, the same losses
"$S" train auto.yaml --set run.dir=runs/nauto --set offload.optimizer=nvme --set offload.nvme_ratio=auto \
  --set memory.host_gb=0.0018 > nauto.log 2>&1 || fail "nvme_ratio auto: $(tail -3 nauto.log)"
nr=$(grep -o 'offload.nvme_ratio: auto is [0-9.]*' nauto.log | grep -o '[0-9.]*$')
awk -v r="$nr" 'BEGIN { exit !(r > 0 && r < 1) }' || fail "nvme_ratio auto on a 1.8 MiB host should split: '$nr': $(grep plan nauto.log)"
grep -q '\[plan\] nvme: planned [1-9]' nauto.log || fail "nvme_ratio $nr should put some state on NVMe: $(grep plan nauto.log)"
diff <(grep -o '"loss": [^,]*' runs/auto_none/metrics.jsonl) <(grep -o '"loss": [^,]*' runs/nauto/metrics.jsonl) > /dev/null ||
  fail "nvme_ratio auto ($nr): losses differ from no offload"
"$S" plan auto.yaml --set offload.optimizer=nvme --set offload.nvme_ratio=auto --host-gb 0.0018 | grep -q "nvme_ratio: auto is $nr" ||
  fail "strata plan should resolve nvme_ratio auto to the same $nr"
pass "optimizer_ratio auto: $r on a 0.7 MiB device (bitwise the losses of no offload; strata plan agrees, and hints at it for a full offload); 1 without a device size, said; nvme_ratio auto: $nr on a 1.8 MiB host, the same losses"

# 2,000 steps of a tiny model: resident memory flat after warm-up
cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 2000, micro_batch: 2, eval_every: 0, log_every: 1000, sample_tokens: 0}
run: {dir: runs/t}
YAML
"$S" train tiny.yaml > tiny.log
r100=$(grep '"step": 100,' runs/t/metrics.jsonl | grep -o '"rss_bytes": [0-9]*' | cut -d' ' -f2)
r2000=$(grep '"step": 2000,' runs/t/metrics.jsonl | grep -o '"rss_bytes": [0-9]*' | cut -d' ' -f2)
growth=$(( r2000 - r100 ))
[ $growth -le 131072 ] || fail "RSS grew by $growth bytes between step 100 and 2000"
pass "2000 steps: RSS $r100 -> $r2000 bytes (growth $growth)"
echo "all e2e_plan checks passed"
