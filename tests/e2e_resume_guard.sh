#!/usr/bin/env bash
# End to end: a resume agrees with the checkpoint it continues (issue 31 items 6, 7):
#  - a key the weights' meaning depends on (model.n_head changes no tensor's shape) set to
#    another value than the checkpoint's is refused with exit 2 naming both values, on
#    `train --resume` and on `dump-grads --set`; nothing is written;
#  - data of another tokenizer is refused naming both tokenizers; --allow-new-tokenizer
#    goes on, and every earlier checkpoint keeps (and exports) the tokenizer it was trained
#    with, the later ones the new one;
#  - config.json shapes beyond the schema's bounds and optimizer numbers that change as
#    floats (items 4, 5) are refused at the command line with exit 2, not aborted.
set -euo pipefail
S=${STRATA:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-resume-guard.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
run() { set +e; out=$(timeout 120 "$@" 2>&1); rc=$?; set -e; }
expect() { # CODE TEXT WHAT
    [ "$rc" -eq "$1" ] || fail "$3: exit $rc, expected $1: $out"
    grep -qF -- "$2" <<<"$out" || fail "$3: message lacks '$2': $out"
    pass "$3"
}

cat "$STRATA_SOURCE_DIR"/core/*.h > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null 2>&1
# the same shards under another tokenizer: the byte-level one with a prefix space added
mkdir data2 && cp data/*.bin data2/
sed 's/"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false/"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":true/' \
    data/tokenizer.json > data2/tokenizer.json
! cmp -s data/tokenizer.json data2/tokenizer.json || fail "the second tokenizer should differ from the first"
cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 256}
data: {train: "data/train_*.bin", val: ""}
train: {steps: 2, micro_batch: 2, eval_every: 0, log_every: 1, sample_tokens: 0}
run: {dir: runs/a, checkpoint_every: 1, keep: 0}
YAML
"$S" train tiny.yaml > a.log 2>&1 || fail "training: $(tail -3 a.log)"
ck=runs/a/ckpt

# --- item 6: the head count
run "$S" train tiny.yaml --set model.n_head=4 --set train.steps=3 --resume latest
expect 2 "model.n_head is 4, but $ck/step_00000002 was trained with model.n_head 2" "resume with another n_head"
[ ! -d $ck/step_00000003 ] && [ "$(cat $ck/latest)" = step_00000002 ] || fail "a refused resume must write nothing"
[ "$(grep -c '"step"' runs/a/metrics.jsonl)" = 2 ] || fail "a refused resume must leave metrics.jsonl as it was"
run "$S" train tiny.yaml --set model.n_embd=32 --set train.steps=3 --resume latest
expect 2 "model.n_embd is 32, but" "resume with another n_embd names the key, not a tensor"
run "$S" dump-grads $ck/step_00000002 --out g --data "data/train_*.bin" --set model.n_head=4
expect 2 "model.n_head is 4, but" "dump-grads --set model.n_head"
[ ! -e g ] || fail "a refused dump-grads must write nothing"
run "$S" train tiny.yaml --set train.steps=3 --set optim.lr=1e-3 --resume latest
expect 0 "resumed from" "resume with the same model keys and another lr"

# --- item 7: the tokenizer
run "$S" train tiny.yaml --set data.train='data2/train_*.bin' --set train.steps=4 --resume latest
expect 2 "the data's tokenizer data2/tokenizer.json" "resume on another tokenizer's data"
grep -qF "is not the one $ck/step_00000003 was trained with" <<<"$out" || fail "the message names the checkpoint: $out"
grep -q "runs/a/tokenizer.json (256 tokens, digest [0-9a-f]\{8\})" <<<"$out" || fail "the message names the old tokenizer: $out"
cmp -s runs/a/tokenizer.json data/tokenizer.json || fail "a refused resume must keep the run's tokenizer"
run "$S" train tiny.yaml --set data.train='data2/train_*.bin' --set train.steps=4 --resume latest --allow-new-tokenizer
expect 0 "--allow-new-tokenizer:" "--allow-new-tokenizer goes on, saying so"
cmp -s runs/a/tokenizer.json data2/tokenizer.json || fail "the run records the new tokenizer"
for s in 1 2 3; do
    cmp -s $ck/step_0000000$s/tokenizer.json data/tokenizer.json || fail "step $s keeps the tokenizer it was trained with"
done
[ ! -e $ck/step_00000004/tokenizer.json ] || fail "step 4 has the run's (new) tokenizer, no copy"
"$S" export $ck/step_00000001 --out hf1 > /dev/null 2>&1 || fail "export step 1"
"$S" export $ck/step_00000004 --out hf4 > /dev/null 2>&1 || fail "export step 4"
cmp -s hf1/tokenizer.json data/tokenizer.json || fail "export of step 1 ships the tokenizer it was trained with"
cmp -s hf4/tokenizer.json data2/tokenizer.json || fail "export of step 4 ships the new tokenizer"
pass "after the change, steps 1-3 keep and export the old tokenizer, step 4 the new"
run "$S" train tiny.yaml --set data.train='data2/train_*.bin' --set train.steps=5 --resume latest
expect 0 "resumed from" "a later resume on the new tokenizer's data needs no flag"
run "$S" train tiny.yaml --set data.train='data2/train_*.bin' --set train.steps=5 --set run.dir=runs/b \
    --resume $ck/step_00000001
expect 2 "is not the one $ck/step_00000001 was trained with" "resuming an older step checks that step's own tokenizer"

# --- items 4, 5 at the command line: exit 2 naming file and key, nothing allocated
mkdir hf && printf '{"model_type": "gpt2", "n_layer": 100000000, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256}' > hf/config.json
: > hf/model.safetensors
cat > ft.yaml <<'YAML'
device: cpu
model: {init_from: hf}
data: {train: "data/train_*.bin"}
train: {steps: 1, micro_batch: 2, sample_tokens: 0}
run: {dir: runs/ft}
YAML
run "$S" train ft.yaml
expect 2 "model.init_from's hf/config.json has n_layer 100000000, but model.n_layer must be between 1 and 1024" "config.json n_layer 1e8"
run "$S" train tiny.yaml --set run.dir=runs/c --set optim.beta2=0.99999999
expect 2 "key 'optim.beta2': 0.99999999 becomes 1 as the float" "beta2 that is 1 as a float"
[ ! -d runs/ft ] && [ ! -d runs/c ] || fail "a refused config must not create the run directory"
echo "PASS"
