#!/usr/bin/env bash
# The head a chunk of rows at a time (train.logits_chunk_mb): a micro-batch of 1536 rows
# whose logits (384 padded columns, fp32) take 2.25 MiB, in chunks of 1 MiB (682 rows):
#  - the plan holds 1 MiB of logits instead of 2.25, and the run allocates what it planned;
#  - training and validation losses within 1e-5 of the whole head's (each row's loss is its
#    own; the classifier's weight gradient sums its rows in two pieces), GPT-2 and a Llama
#    with an untied head;
#  - every ZeRO stage, with offload, gives the chunked stage 0's losses bit for bit;
#  - its checkpoint resumes bitwise, and samples (the final sample and `strata sample`, which
#    read the last position's logits from a buffer that holds the last 682 rows).
set -euo pipefail
S=${STRATA:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-head-chunks.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
losses() { grep -o '"loss": [^,]*' "$1/metrics.jsonl" | cut -d' ' -f2; }
vals() { grep -o '"val_loss": [^,]*' "$1/metrics.jsonl" | cut -d' ' -f2; }
field() { grep -o "\"$2\": [0-9]*" "$1/metrics.jsonl" | head -1 | awk '{print $2}'; }
# worst relative difference of two columns of numbers
worst() { paste <(echo "$1") <(echo "$2") | awk '{d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d} END {printf "%.2e", w}'; }

head -c 60000 "$STRATA_SOURCE_DIR/core/model.c" > corpus.txt
"$S" prepare --text corpus.txt --out data --val-fraction 0.1 > /dev/null
cat > c.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 300}
data: {train: "data/train_*.bin", val: "data/val_*.bin"}
train: {steps: 10, micro_batch: 48, eval_every: 5, eval_batches: 2, log_every: 5, sample_tokens: 0}
optim: {lr: 3.0e-3, warmup_steps: 2}
run: {dir: runs/x, checkpoint_every: 5}
YAML
LLAMA=(--set model.arch=llama --set model.intermediate_size=64 --set model.n_kv_head=1 --set model.tie_embeddings=false)

for fam in gpt2 llama; do
  extra=()
  [ $fam = llama ] && extra=("${LLAMA[@]}")
  "$S" train c.yaml --set run.dir=runs/${fam}_whole "${extra[@]}" > whole.log 2>&1 || fail "$fam whole head: $(tail -3 whole.log)"
  "$S" train c.yaml --set run.dir=runs/${fam}_chunk --set train.logits_chunk_mb=1 "${extra[@]}" > chunk.log 2>&1 ||
    fail "$fam chunked head: $(tail -3 chunk.log)"
  w=$(field runs/${fam}_whole plan_device_bytes) c=$(field runs/${fam}_chunk plan_device_bytes)
  [ $((w - c)) -gt 1300000 ] && [ "$c" = "$(field runs/${fam}_chunk peak_mem_bytes)" ] ||
    fail "$fam: the chunked plan ($c bytes) should hold about 1.25 MiB less than the whole head's ($w) and be what it allocates"
  dl=$(worst "$(losses runs/${fam}_whole)" "$(losses runs/${fam}_chunk)")
  dv=$(worst "$(vals runs/${fam}_whole)" "$(vals runs/${fam}_chunk)")
  awk -v a="$dl" -v b="$dv" 'BEGIN { exit !(a < 1e-5 && b < 1e-5) }' ||
    fail "$fam: chunked losses differ from the whole head's by $dl (validation $dv)"
  "$S" plan c.yaml --set train.logits_chunk_mb=1 "${extra[@]}" | grep -q "logits: 682 of the micro-batch's 1536 rows at a time" ||
    fail "$fam: the plan should say how many rows of logits it holds: $("$S" plan c.yaml --set train.logits_chunk_mb=1 | tail -4)"
  pass "$fam: the head in 1 MiB chunks plans $(((w - c) / 1024)) KiB less; losses within $dl, validation within $dv of the whole head's"
done

for st in 1 2 3; do
  o=(--set offload.optimizer=cpu)
  [ $st -eq 3 ] && o+=(--set offload.params=cpu --set offload.gradients=cpu)
  "$S" train c.yaml --set run.dir=runs/st$st --set zero.stage=$st --set train.logits_chunk_mb=1 "${o[@]}" > st.log 2>&1 ||
    fail "stage $st chunked: $(tail -3 st.log)"
  [ "$(losses runs/st$st)" = "$(losses runs/gpt2_chunk)" ] || fail "stage $st with offload: chunked losses differ from stage 0's"
done
# with accumulation (2 x 24 sequences: 768 rows, chunks of 682 and 86)
acc=(--set train.logits_chunk_mb=1 --set train.micro_batch=24 --set train.grad_accum=2)
"$S" train c.yaml --set run.dir=runs/acc0 "${acc[@]}" > acc.log 2>&1 || fail "accumulating, stage 0: $(tail -3 acc.log)"
"$S" train c.yaml --set run.dir=runs/acc3 "${acc[@]}" --set zero.stage=3 --set offload.optimizer=nvme --set offload.params=nvme \
  --set offload.gradients=cpu --set "offload.nvme_path=$W" > acc.log 2>&1 || fail "accumulating, stage 3: $(tail -3 acc.log)"
[ "$(losses runs/acc3)" = "$(losses runs/acc0)" ] || fail "accumulating: stage 3 with everything offloaded differs from stage 0"
pass "stages 1-3 with the optimizer (and at stage 3 parameters and gradients) offloaded, and with accumulation (everything on NVMe): the chunked stage 0's losses bit for bit"

"$S" train c.yaml --set run.dir=runs/gpt2_chunk --set train.logits_chunk_mb=1 --set train.sample_tokens=40 \
  --resume runs/gpt2_chunk/ckpt/step_00000005 > resume.log 2>&1 || fail "resume: $(tail -3 resume.log)"
# the resume rewrote steps 6-10 of the run it resumed: the same as the first time
[ "$(losses runs/gpt2_chunk)" = "$(losses runs/st1)" ] || fail "the chunked run resumed from step 5 differs from one run through"
grep -qi "sample" resume.log || fail "the resumed run's final sample is missing: $(tail -5 resume.log)"
"$S" sample runs/gpt2_chunk --tokens 20 --prompt "static" > sample.txt 2> sample.log || fail "strata sample: $(tail -3 sample.log)"
[ "$(wc -c < sample.txt)" -gt 20 ] || fail "strata sample wrote too little: $(cat sample.txt)"
pass "a chunked run resumes bitwise from step 5, samples at its end, and strata sample reads its checkpoint"
