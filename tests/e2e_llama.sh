#!/usr/bin/env bash
# The Llama family end to end (model.arch: llama):
#  - the ZeRO engine test (tests/test_engine.c with STRATA_TEST_MODEL=llama: grouped-query
#    attention, q/k norms, an untied head) at world 1, and under mpirun at worlds 2, 3, 4:
#    stages 0-3 against world 1, every offload tier bitwise against no offload, the ZeRO
#    memory and communication formulas;
#  - a Llama checkpoint saved at world 3 stage 3 resumes at world 2 stage 1 with the next
#    loss of the world-3 run that kept going; sample, plan and dump-grads run on it; its
#    export (sharded) read by init_from at world 2 stage 3 (parameter and optimizer shards
#    on the device, in pinned memory, on NVMe) gives the next loss bit for bit;
#  - config.json of what the model does not compute is refused by name (exit 2): another
#    activation, RoPE type, Llama's attention_bias, MLP biases, mixture-of-experts, a sliding
#    window shorter than model.seq_len;
#  - tests/llama_reference.py: against transformers (loss and every gradient, 20 AdamW steps,
#    greedy generation, export bit for bit and from_pretrained) for GQA, multi-head, head_dim,
#    llama3 RoPE, tied and untied heads, Qwen2's biases, Qwen3's q/k norms, Mistral.
# The Python is $STRATA_PYTHON (or launcher/python-env.sh's); without torch and transformers
# the script exits 77 (skip) after the checks that need neither, saying why.
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
BUILD=${STRATA_BUILD_DIR:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-llama.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
code() { set +e; "$@" > out.txt 2>&1; echo $?; set -e; }
loss_at() { grep "\"step\": $2," "$1/metrics.jsonl" | grep -o '"loss": [^,]*' | cut -d' ' -f2; }
MPI=()
if command -v mpirun > /dev/null; then
  MPI=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
  [ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
fi

# --- the engine on a Llama-family model, worlds 1-4
STRATA_TEST_MODEL=llama "$BUILD/tests/test_engine" > engine1.log 2>&1 || { tail -20 engine1.log; fail "test_engine (llama) at world 1"; }
pass "test_engine (llama) at world 1: $(tail -1 engine1.log)"
if [ ${#MPI[@]} -gt 0 ]; then
  for n in 2 3 4; do
    "${MPI[@]}" -x STRATA_TEST_MODEL=llama -np $n "$BUILD/tests/test_engine" > engine$n.log 2>&1 ||
      { grep -m 20 FAIL engine$n.log; fail "test_engine (llama) at world $n"; }
    ! grep -q "FAIL" engine$n.log || { grep -m 20 FAIL engine$n.log; fail "test_engine (llama) at world $n"; }
    pass "test_engine (llama) at world $n: $(grep -c PASS engine$n.log) ranks passed (stages 0-3, offload tiers, ZeRO formulas)"
  done
else
  echo "mpirun not found: skipping worlds 2-4"
fi

# --- a Llama run: resharded resume, sample, plan, dump-grads
cat "$SRC"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > l.yaml <<'YAML'
device: cpu
model: {arch: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 32, intermediate_size: 48, seq_len: 32,
        vocab_size: 256, tie_embeddings: false, rope_theta: 500000}
data: {train: "data/train_*.bin", val: "data/val_*.bin"}
train: {steps: 11, micro_batch: 2, eval_every: 0, log_every: 1, sample_tokens: 0}
optim: {lr: 1.0e-3, warmup_steps: 2}
run: {dir: runs/w3, checkpoint_every: 10, keep: 0}
zero: {stage: 3}
YAML
if [ ${#MPI[@]} -gt 0 ]; then
  # world 3 x micro-batch 2 = world 2 x 3: the same tokens per step
  "${MPI[@]}" -np 3 "$S" train l.yaml > w3.log
  ref=$(loss_at runs/w3 11)
  mkdir -p runs/w2/ckpt && cp -r runs/w3/ckpt/step_00000010 runs/w2/ckpt/
  "${MPI[@]}" -np 2 "$S" train l.yaml --set run.dir=runs/w2 --set zero.stage=1 --set train.micro_batch=3 --resume latest > w2.log
  got=$(loss_at runs/w2 11)
  python3 -c "import sys; a,b=float('$ref'),float('$got'); sys.exit(0 if abs(a-b)<=1e-5*abs(a) else 1)" ||
    fail "world 2 stage 1 resumed from world 3 stage 3: step 11 loss $got vs $ref"
  grep -q "resumed from" w2.log || fail "the world-2 run did not resume: $(tail -3 w2.log)"
  pass "a Llama checkpoint from world 3 stage 3 resumes at world 2 stage 1: step 11 loss $got (world 3: $ref)"
  run=runs/w2
else
  "$S" train l.yaml --set zero.stage=0 --set train.micro_batch=6 > w1.log
  run=runs/w3
fi
"$S" sample $run --prompt "int main" --tokens 20 --temperature 0 > sample.txt || fail "sample: $(cat sample.txt)"
grep -q "^int main" sample.txt || fail "sample should echo its prompt: $(head -c 200 sample.txt)"
pass "sample: $(head -c 60 sample.txt | tr '\n' ' ')"
"$S" plan l.yaml > plan.txt || fail "plan: $(cat plan.txt)"
grep -q "^model: llama" plan.txt || fail "plan should name the family: $(head -3 plan.txt)"
pass "plan: $(grep '^model:' plan.txt)"
"$S" dump-grads $run --data "data/train_*.bin" --out grads.safetensors > dump.txt || fail "dump-grads: $(cat dump.txt)"
grep -q "wrote grads.safetensors" dump.txt || fail "dump-grads: $(cat dump.txt)"
pass "dump-grads: $(cat dump.txt)"
"$S" export $run --out hf > /dev/null
grep -q '"model_type": "llama"' hf/config.json && grep -q '"LlamaForCausalLM"' hf/config.json &&
  grep -q '"tie_word_embeddings": false' hf/config.json && grep -q '"rope_theta": 500000' hf/config.json &&
  grep -q PreTrainedTokenizerFast hf/tokenizer_config.json || fail "export's config.json: $(cat hf/config.json)"
pass "export writes LlamaForCausalLM's config.json and a PreTrainedTokenizerFast tokenizer_config.json"

# --- export -> init_from at world 2 stage 3, shards on the device, in pinned memory, on NVMe:
# the loss of the run the export came from, next step, bit for bit (one global batch of 2
# sequences of 16 + 1 bytes, so every step sees the same tokens)
if [ ${#MPI[@]} -gt 0 ]; then
  printf 'Pretrained Llama in, fine-tuned out....' | head -c 40 > tiny.txt
  "$S" prepare --text tiny.txt --out tdata --val-fraction 0 > /dev/null
  cat > t.yaml <<'YAML'
device: cpu
model: {arch: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 32, intermediate_size: 48, seq_len: 16,
        vocab_size: 256, tie_embeddings: false, qkv_bias: true}
data: {train: "tdata/train_*.bin", val: "", shuffle: false}
train: {steps: 3, micro_batch: 1, eval_every: 0, sample_tokens: 0}
optim: {lr: 1.0e-2, warmup_steps: 0}
run: {dir: runs/t, checkpoint_every: 3, keep: 0}
zero: {stage: 3}
YAML
  "${MPI[@]}" -np 2 "$S" train t.yaml > t.log
  "$S" export runs/t --out hft --max-shard-size 20KB > /dev/null
  "${MPI[@]}" -np 2 "$S" train t.yaml --set train.steps=4 --resume latest > t4.log
  ref=$(loss_at runs/t 4)
  mkdir -p swap
  for off in none cpu nvme; do
    extra=()
    [ $off != none ] && extra=(--set offload.optimizer=$off --set offload.params=$off --set "offload.nvme_path=$W/swap")
    "${MPI[@]}" -np 2 "$S" train t.yaml --set model.init_from=hft --set run.dir=runs/ft_$off --set train.steps=1 \
      "${extra[@]}" > ft_$off.log 2>&1 || { tail -5 ft_$off.log; fail "init_from at world 2, offload $off"; }
    [ "$(loss_at runs/ft_$off 1)" = "$ref" ] || fail "world 2 stage 3 offload $off: init_from's loss $(loss_at runs/ft_$off 1) vs the run's $ref"
  done
  pass "export (sharded) -> init_from at world 2 stage 3 (shards on the device, pinned, NVMe): the run's next loss bit for bit ($ref)"
fi

# --- init_from of what the model does not compute: refused by name, exit 2
mkdir -p bad
base='"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32, "intermediate_size": 48, "vocab_size": 256, "max_position_embeddings": 64'
cat > ft.yaml <<'YAML'
device: cpu
model: {init_from: bad, seq_len: 32}
data: {train: "data/train_*.bin", val: ""}
train: {steps: 1, micro_batch: 1, eval_every: 0, sample_tokens: 0}
run: {dir: runs/ft}
YAML
refuse() { # extra JSON keys, what the message must say
  echo "{$base, $1}" > bad/config.json
  [ "$(code "$S" train ft.yaml)" = 2 ] && grep -q -- "$2" out.txt || fail "config.json with $1 should exit 2 naming $2: $(cat out.txt)"
}
refuse '"hidden_act": "gelu"' '"hidden_act" is "gelu"'
refuse '"rope_scaling": {"rope_type": "yarn", "factor": 4.0}' '"rope_type" is "yarn"'
refuse '"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}' '"rope_type" is "dynamic"'
refuse '"attention_bias": true' '"attention_bias" is true'
refuse '"mlp_bias": true' '"mlp_bias" is true'
refuse '"num_local_experts": 8' '"num_local_experts" says mixture-of-experts'
refuse '"partial_rotary_factor": 0.5' '"partial_rotary_factor" is 0.5'
base=${base/\"llama\"/\"mistral\"}
refuse '"sliding_window": 16' 'sliding_window 16, shorter than model.seq_len 32'
base=${base/\"mistral\"/\"mixtral\"}
refuse '"num_local_experts": 8' '"model_type" is "mixtral"'
pass "config.json with another activation, RoPE type, attention or MLP biases, experts, a short sliding window: refused by name (exit 2)"
# a vocabulary past llm.c's uint16 shards plans, but does not train on them: said before
# anything is allocated (32-bit shards train it: tests/e2e_jsonl.sh)
[ "$(code "$S" train l.yaml --set model.vocab_size=128256 --set run.dir=runs/big)" = 2 ] &&
  grep -q "model.vocab_size is 128256, but the shards of data.train (data/train_\*.bin) hold uint16 tokens" out.txt &&
  [ ! -e runs/big/metrics.jsonl ] || fail "a vocabulary above 65536 on uint16 shards should be refused at start: $(cat out.txt)"
"$S" plan l.yaml --set model.vocab_size=128256 > /dev/null || fail "plan of a 128256-token vocabulary"
pass "vocab_size 128256: plans, and training on uint16 shards is refused at start (exit 2)"

# --- against transformers
PY=$("$SRC/launcher/python-env.sh")
if [ -z "$PY" ]; then
  echo "SKIP: ${STRATA_PYTHON:-no} Python with torch, transformers, tokenizers and safetensors (set STRATA_PYTHON, or launcher/python-env.sh --install): the comparison with transformers did not run"
  exit 77
fi
"$PY" "$SRC/tests/llama_reference.py" --strata "$S" --workdir "$W/ref"
