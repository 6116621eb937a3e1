#!/usr/bin/env bash
# `strata config --from-deepspeed`: a ZeRO-3 DeepSpeed config with NVMe optimizer and CPU
# parameter offload becomes a Strata YAML that loads (with --base) to the same settings,
# every key not carried over is named with its reason (as comments and on stderr), "auto"
# values are named, DeepSpeed's own defaults are written out where Strata's differ, and
# invalid input (bad JSON, a wrong type, an inconsistent batch, a result Strata would
# refuse) is exit 2 naming the byte offset or the key.
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-deepspeed.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
code() { set +e; "$@" > out.txt 2> err.txt; echo $?; set -e; }

cat > zero3.json <<'JSON'
{
  "train_batch_size": 64,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": "auto",
  "steps_per_print": 50,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 2000, "warmup_num_steps": 100,
                                                     "cos_min_ratio": 0.1, "warmup_type": "linear"}},
  "gradient_clipping": 0.5,
  "communication_data_type": "bf16",
  "zero_optimization": {
    "stage": 3,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true, "buffer_count": 6},
    "offload_param": {"device": "cpu", "pin_memory": true, "max_in_cpu": 1e9},
    "overlap_comm": true,
    "contiguous_gradients": true,
    "reduce_bucket_size": 5e8,
    "sub_group_size": 1e7,
    "stage3_max_live_parameters": 1e9,
    "stage3_gather_16bit_weights_on_model_save": true
  },
  "aio": {"block_size": 262144, "queue_depth": 16, "thread_count": 2},
  "tensorboard": {"enabled": true, "output_path": "tb"},
  "my_own_key": 1
}
JSON
[ "$(code "$S" config --from-deepspeed zero3.json --world 2 --base "$SRC/configs/gpt2-124m.yaml")" = 0 ] ||
  fail "conversion should succeed: $(cat err.txt)"
cp out.txt zero3.yaml
for line in "stage: 3" "optimizer: nvme" "params: cpu" 'nvme_path: "/local_nvme"' "buffer_count: 6" "block_kb: 256" \
            "queue_depth: 16" "overlap_comm: true" "micro_batch: 4" "grad_accum: 8" "dtype: bf16" \
            "grad_reduce_dtype: bf16" "lr: 3e-05" "beta2: 0.95" "weight_decay: 0.1" "schedule: cosine" \
            "min_lr: 3e-06" "warmup_steps: 100" "steps: 2000" "grad_clip: 0.5" "log_every: 50" "reduce_bucket_mb: 1907" \
            "chunk_kb: 39063" \
            "tensorboard: true" 'tensorboard_dir: "tb/DeepSpeedJobName"'; do
  grep -q "^  $line " zero3.yaml || fail "the YAML should carry '$line': $(cat zero3.yaml)"
done
grep -q "grad_accum: 8 .*# train_batch_size / (micro-batch x world 2)" zero3.yaml || fail "grad_accum should say where it came from"
for key in "zero_optimization.offload_param.max_in_cpu" "zero_optimization.stage3_max_live_parameters" \
           "zero_optimization.stage3_gather_16bit_weights_on_model_save" "aio.thread_count" \
           "my_own_key: not a DeepSpeed key" 'gradient_accumulation_steps: "auto"' "zero_optimization.reduce_bucket_size"; do
  grep -q "^#   $key" zero3.yaml || fail "the YAML should name '$key' as not carried over: $(cat zero3.yaml)"
  grep -q "not carried over: $key" err.txt || fail "stderr should name '$key'"
done
# the YAML loads, on its base, to those settings
"$S" config zero3.yaml > effective.yaml || fail "the printed YAML should load: $(cat effective.yaml)"
for line in "n_layer: 12" "stage: 3" "optimizer: nvme" "params: cpu" "micro_batch: 4" "grad_accum: 8" "schedule: cosine" \
            "chunk_kb: 39063" \
            "tensorboard: true" 'tensorboard_dir: "tb/DeepSpeedJobName"'; do
  grep -q "^  $line " effective.yaml || fail "the effective config should have '$line'"
done
pass "a ZeRO-3 NVMe/CPU-offload DeepSpeed config becomes YAML that loads on its base; $(grep -c '^#   ' zero3.yaml) keys named as not carried over"

# DeepSpeed's defaults where Strata's differ: Adam's betas and decay, no clipping; fp16 named
echo '{"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": true},
       "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}}' > fp16.json
[ "$(code "$S" config --from-deepspeed fp16.json)" = 0 ] || fail "fp16 config: $(cat err.txt)"
for line in "beta2: 0.999" "weight_decay: 0" "grad_clip: 0" "schedule: constant" "dtype: bf16"; do
  grep -q "^  $line " out.txt || fail "'$line' expected: $(cat out.txt)"
done
grep -q "^#   fp16: Strata has no fp16 loss scaling" out.txt || fail "fp16 should be named: $(cat out.txt)"
grep -q "grad_clip: 0 .*DeepSpeed's default: no clipping" out.txt || fail "the clipping default should say why"
pass "DeepSpeed's defaults are written out where Strata's differ; fp16 is named with its bf16 alternative"

# the TensorBoard monitor: events go where DeepSpeed's would (output_path/job_name); off when
# DeepSpeed's is; with no path, Strata's run.dir stands and the note says where DeepSpeed writes
echo '{"tensorboard": {"enabled": true, "output_path": "logs/", "job_name": "bert"}}' > tb.json
[ "$(code "$S" config --from-deepspeed tb.json)" = 0 ] || fail "tensorboard config: $(cat err.txt)"
grep -q '^  tensorboard: true .*# tensorboard.enabled$' out.txt && grep -q '^  tensorboard_dir: "logs/bert" .*# tensorboard.output_path/job_name' out.txt ||
  fail "output_path/job_name should become run.tensorboard_dir: $(cat out.txt)"
echo '{"tensorboard": {"output_path": "logs"}}' > tb.json
[ "$(code "$S" config --from-deepspeed tb.json)" = 0 ] && grep -q "^  tensorboard: false .*DeepSpeed's default is off" out.txt &&
  ! grep -q "^  tensorboard_dir" out.txt || fail "a monitor that is not enabled should be off: $(cat out.txt)"
echo '{"tensorboard": {"enabled": true, "flush_secs": 5}}' > tb.json
[ "$(code "$S" config --from-deepspeed tb.json)" = 0 ] && ! grep -q "^  tensorboard_dir" out.txt &&
  grep -q "^#   tensorboard.output_path: absent: DeepSpeed writes to ./DeepSpeedJobName; Strata writes beside metrics.jsonl" out.txt &&
  grep -q "^#   tensorboard.flush_secs: not a tensorboard key Strata knows" out.txt || fail "enabled without a path: $(cat out.txt)"
pass "tensorboard.output_path/job_name becomes run.tensorboard_dir; off stays off; no path keeps run.dir, named"

# ZeRO-Offload++'s partial offload: offload_optimizer.ratio becomes offload.optimizer_ratio
echo '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1,
       "offload_optimizer": {"device": "cpu", "ratio": 0.6}}}' > ratio.json
[ "$(code "$S" config --from-deepspeed ratio.json --base "$SRC/configs/gpt2-124m.yaml")" = 0 ] || fail "ratio config: $(cat err.txt)"
cp out.txt ratio.yaml
grep -q "^  optimizer_ratio: 0.6 " ratio.yaml || fail "offload_optimizer.ratio should carry over: $(cat ratio.yaml)"
"$S" config ratio.yaml > effective.yaml || fail "the ratio YAML should load: $(cat effective.yaml)"
grep -q "^  optimizer_ratio: 0.6" effective.yaml || fail "the effective config should keep the ratio: $(cat effective.yaml)"
# with offload_param too, Strata cannot keep part of the state on the GPU: named, not refused
echo '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3,
       "offload_optimizer": {"device": "cpu", "ratio": 0.6}, "offload_param": {"device": "cpu"}}}' > ratio3.json
[ "$(code "$S" config --from-deepspeed ratio3.json --base "$SRC/configs/gpt2-124m.yaml")" = 0 ] ||
  fail "ratio with offload_param should convert: $(cat err.txt)"
grep -q "^  optimizer_ratio: 1 " out.txt && grep -q "^#   zero_optimization.offload_optimizer.ratio: .*only with the parameters there" out.txt ||
  fail "ratio with offload_param should become 1 with a note: $(cat out.txt)"
pass "offload_optimizer.ratio 0.6 becomes offload.optimizer_ratio 0.6 and loads; with offload_param it becomes 1, named"

# a Hugging Face Trainer config: "auto" everywhere; those keys are named, never guessed
cat > hf.json <<'JSON'
{"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
 "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
 "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                   "warmup_num_steps": "auto", "total_num_steps": "auto"}},
 "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                       "offload_param": {"device": "cpu", "pin_memory": true}, "reduce_bucket_size": "auto"},
 "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
 "train_micro_batch_size_per_gpu": "auto"}
JSON
[ "$(code "$S" config --from-deepspeed hf.json)" = 0 ] || fail "an all-auto Trainer config: $(cat err.txt)"
grep -q "^  stage: 3 " out.txt && grep -q "^  params: cpu " out.txt && grep -q "^  schedule: linear " out.txt ||
  fail "what is not auto is carried: $(cat out.txt)"
! grep -qE "^  (lr|dtype|micro_batch|grad_accum|grad_clip|steps|warmup_steps|weight_decay): " out.txt ||
  fail "an auto value must not be guessed: $(cat out.txt)"
n_auto=$(grep -c '"auto" is filled in by the Hugging Face Trainer' out.txt)
[ "$n_auto" -eq 15 ] || fail "15 auto values should be named, got $n_auto: $(cat out.txt)"
pass "a Hugging Face Trainer config: its $n_auto \"auto\" values are named, not guessed; the rest is carried"

# refusals: exit 2, naming the byte offset or the key
echo '{"zero_optimization": {"stage": 2,}}' > bad.json
[ "$(code "$S" config --from-deepspeed bad.json)" = 2 ] && grep -q "bad.json: byte 34 (line 1, column 35): trailing comma" err.txt ||
  fail "invalid JSON: $(cat err.txt)"
echo '{"zero_optimization": {"stage": "two"}}' > bad.json
[ "$(code "$S" config --from-deepspeed bad.json)" = 2 ] && grep -q "key 'zero_optimization.stage': expected an integer" err.txt ||
  fail "a wrong type: $(cat err.txt)"
echo '{"zero_optimization": {"stage": 4}}' > bad.json
[ "$(code "$S" config --from-deepspeed bad.json)" = 2 ] && grep -q "must be between 0 and 3" err.txt || fail "stage 4: $(cat err.txt)"
echo '{"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}' > bad.json
[ "$(code "$S" config --from-deepspeed bad.json)" = 2 ] && grep -q "train_batch_size 30 is not a multiple" err.txt ||
  fail "an inconsistent batch: $(cat err.txt)"
echo '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}' > bad.json
[ "$(code "$S" config --from-deepspeed bad.json)" = 2 ] && grep -q "would be refused: .*needs offload.nvme_path" err.txt ||
  fail "NVMe offload without a path: $(cat err.txt)"
[ "$(code "$S" config --from-deepspeed missing.json)" = 2 ] && grep -q "missing.json: cannot read" err.txt || fail "a missing file"
[ "$(code "$S" config --from-deepspeed)" = 2 ] || fail "no file named"
pass "invalid JSON, wrong types, inconsistent batches and results Strata would refuse exit 2 by name"
