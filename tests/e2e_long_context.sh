#!/usr/bin/env bash
# What a long context needs of the activations, on the CPU backend. Every block is
# recomputed unless a case says otherwise.
#
# The head a chunk of rows at a time (train.logits_chunk_mb): a micro-batch of 1536 rows
# whose logits (384 padded columns, fp32) take 2.25 MiB, in chunks of 1 MiB (682 rows):
#  - the plan holds 1 MiB of logits instead of 2.25, and the run allocates what it planned;
#  - training and validation losses within 1e-5 of the whole head's (each row's loss is its
#    own; the classifier's weight gradient sums its rows in two pieces), GPT-2 and a Llama
#    with an untied head;
#  - every ZeRO stage, with offload, gives the chunked stage 0's losses bit for bit;
#  - its checkpoint resumes bitwise, and samples (the final sample and `strata sample`, which
#    read the last position's logits from a buffer that holds the last 682 rows).
#
# The blocks' MLPs a chunk of rows at a time (train.mlp_chunk_mb): a micro-batch of 1536
# rows whose widest MLP activation (GPT-2's c_fc output, 4 x 64 fp32 columns: 1.5 MiB; a
# Llama's gate|up, 2 x 192: 2.25 MiB) runs in chunks of 1 MiB (1024 and 682 rows):
#  - with every block recomputed the plan keeps a chunk's gate|up instead of the micro-batch's,
#    its gradient buffers a chunk's everywhere, and the run allocates what it planned;
#  - training and validation losses within 1e-5 of the whole MLP's (each row's output is its
#    own; the weight gradients sum their rows in pieces), with and without checkpointing;
#  - every ZeRO stage, with offload, and accumulation with everything offloaded give the
#    chunked stage 0's losses bit for bit; a chunked run resumes bitwise.
#
# The residual streams in pinned memory (offload.activations: cpu), 3 of a 6-block model's
# 7 on the device:
#  - the plan says so, moves 4 streams' bytes from the device to pinned memory, and the run
#    allocates what it planned in both;
#  - GPT-2 and Llama with every block recomputed (and with none), every stage with
#    everything offloaded, accumulation: bitwise the losses and final state of the run that
#    keeps them all on the device; and with the MLPs in chunks; the run resumes bitwise.
set -euo pipefail
S=${STRATA:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-long-context.XXXXXX)
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
model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: 32, vocab_size: 300}
data: {train: "data/train_*.bin", val: "data/val_*.bin"}
train: {steps: 10, micro_batch: 48, eval_every: 5, eval_batches: 2, log_every: 5, sample_tokens: 0,
        activation_checkpointing: blocks}
optim: {lr: 3.0e-3, warmup_steps: 2}
run: {dir: runs/x, checkpoint_every: 5}
YAML
LLAMA=(--set model.arch=llama --set model.intermediate_size=192 --set model.n_kv_head=1 --set model.tie_embeddings=false)

# ---- the head in chunks ----
for fam in gpt2 llama; do
  extra=()
  [ $fam = llama ] && extra=("${LLAMA[@]}")
  "$S" train c.yaml --set run.dir=runs/head_${fam}_whole "${extra[@]}" > whole.log 2>&1 || fail "$fam whole head: $(tail -3 whole.log)"
  "$S" train c.yaml --set run.dir=runs/head_${fam}_chunk --set train.logits_chunk_mb=1 "${extra[@]}" > chunk.log 2>&1 ||
    fail "$fam chunked head: $(tail -3 chunk.log)"
  w=$(field runs/head_${fam}_whole plan_device_bytes) c=$(field runs/head_${fam}_chunk plan_device_bytes)
  [ $((w - c)) -gt 1300000 ] && [ "$c" = "$(field runs/head_${fam}_chunk peak_mem_bytes)" ] ||
    fail "$fam: the chunked plan ($c bytes) should hold about 1.25 MiB less than the whole head's ($w) and be what it allocates"
  dl=$(worst "$(losses runs/head_${fam}_whole)" "$(losses runs/head_${fam}_chunk)")
  dv=$(worst "$(vals runs/head_${fam}_whole)" "$(vals runs/head_${fam}_chunk)")
  awk -v a="$dl" -v b="$dv" 'BEGIN { exit !(a < 1e-5 && b < 1e-5) }' ||
    fail "$fam: chunked losses differ from the whole head's by $dl (validation $dv)"
  "$S" plan c.yaml --set train.logits_chunk_mb=1 "${extra[@]}" | grep -q "logits: 682 of the micro-batch's 1536 rows at a time" ||
    fail "$fam: the plan should say how many rows of logits it holds: $("$S" plan c.yaml --set train.logits_chunk_mb=1 | tail -4)"
  pass "$fam: the head in 1 MiB chunks plans $(((w - c) / 1024)) KiB less; losses within $dl, validation within $dv of the whole head's"
done

for st in 1 2 3; do
  o=(--set offload.optimizer=cpu)
  [ $st -eq 3 ] && o+=(--set offload.params=cpu --set offload.gradients=cpu)
  "$S" train c.yaml --set run.dir=runs/head_st$st --set zero.stage=$st --set train.logits_chunk_mb=1 "${o[@]}" > st.log 2>&1 ||
    fail "stage $st chunked: $(tail -3 st.log)"
  [ "$(losses runs/head_st$st)" = "$(losses runs/head_gpt2_chunk)" ] || fail "stage $st with offload: chunked losses differ from stage 0's"
done
# with accumulation (2 x 24 sequences: 768 rows, chunks of 682 and 86)
acc=(--set train.logits_chunk_mb=1 --set train.micro_batch=24 --set train.grad_accum=2)
"$S" train c.yaml --set run.dir=runs/head_acc0 "${acc[@]}" > acc.log 2>&1 || fail "accumulating, stage 0: $(tail -3 acc.log)"
"$S" train c.yaml --set run.dir=runs/head_acc3 "${acc[@]}" --set zero.stage=3 --set offload.optimizer=nvme --set offload.params=nvme \
  --set offload.gradients=cpu --set "offload.nvme_path=$W" > acc.log 2>&1 || fail "accumulating, stage 3: $(tail -3 acc.log)"
[ "$(losses runs/head_acc3)" = "$(losses runs/head_acc0)" ] || fail "accumulating: stage 3 with everything offloaded differs from stage 0"
pass "stages 1-3 with the optimizer (and at stage 3 parameters and gradients) offloaded, and with accumulation (everything on NVMe): the chunked stage 0's losses bit for bit"

"$S" train c.yaml --set run.dir=runs/head_gpt2_chunk --set train.logits_chunk_mb=1 --set train.sample_tokens=40 \
  --resume runs/head_gpt2_chunk/ckpt/step_00000005 > resume.log 2>&1 || fail "resume: $(tail -3 resume.log)"
# the resume rewrote steps 6-10 of the run it resumed: the same as the first time
[ "$(losses runs/head_gpt2_chunk)" = "$(losses runs/head_st1)" ] || fail "the chunked run resumed from step 5 differs from one run through"
grep -qi "sample" resume.log || fail "the resumed run's final sample is missing: $(tail -5 resume.log)"
"$S" sample runs/head_gpt2_chunk --tokens 20 --prompt "static" > sample.txt 2> sample.log || fail "strata sample: $(tail -3 sample.log)"
[ "$(wc -c < sample.txt)" -gt 20 ] || fail "strata sample wrote too little: $(cat sample.txt)"
pass "a chunked run resumes bitwise from step 5, samples at its end, and strata sample reads its checkpoint"

# ---- the MLPs in chunks ----
for fam in gpt2 llama; do
  extra=() rows=1024 saved=1500000
  [ $fam = llama ] && extra=("${LLAMA[@]}") rows=682 saved=3000000
  for ck in blocks none; do
    "$S" train c.yaml --set run.dir=runs/${fam}_${ck}_whole --set train.activation_checkpointing=$ck "${extra[@]}" \
      > whole.log 2>&1 || fail "$fam $ck, whole MLP: $(tail -3 whole.log)"
    "$S" train c.yaml --set run.dir=runs/${fam}_${ck}_chunk --set train.activation_checkpointing=$ck \
      --set train.mlp_chunk_mb=1 "${extra[@]}" > chunk.log 2>&1 || fail "$fam $ck, chunked MLP: $(tail -3 chunk.log)"
    w=$(field runs/${fam}_${ck}_whole plan_device_bytes) c=$(field runs/${fam}_${ck}_chunk plan_device_bytes)
    [ "$c" = "$(field runs/${fam}_${ck}_chunk peak_mem_bytes)" ] ||
      fail "$fam $ck: the chunked run allocated $(field runs/${fam}_${ck}_chunk peak_mem_bytes) bytes, not the $c it planned"
    # recomputed blocks keep a chunk's gate|up (c_fc output) as well as a chunk's gradient buffers
    # (llama: 854 rows fewer of gate|up, its gradient (silu(gate)*up shares it) and dmlp: 5 x 192 x 4 bytes a row)
    [ $ck = none ] || [ $((w - c)) -gt $saved ] ||
      fail "$fam $ck: the chunked plan ($c bytes) should hold over $saved bytes less than the whole MLP's ($w)"
    dl=$(worst "$(losses runs/${fam}_${ck}_whole)" "$(losses runs/${fam}_${ck}_chunk)")
    dv=$(worst "$(vals runs/${fam}_${ck}_whole)" "$(vals runs/${fam}_${ck}_chunk)")
    awk -v a="$dl" -v b="$dv" 'BEGIN { exit !(a < 1e-5 && b < 1e-5) }' ||
      fail "$fam $ck: chunked losses differ from the whole MLP's by $dl (validation $dv)"
    pass "$fam, checkpointing $ck: the MLP in 1 MiB chunks plans $(((w - c) / 1024)) KiB less; losses within $dl, validation within $dv of the whole MLP's"
  done
  "$S" plan c.yaml --set train.mlp_chunk_mb=1 "${extra[@]}" > plan.txt
  grep -q "MLP: $rows of the micro-batch's 1536 rows at a time" plan.txt ||
    fail "$fam: the plan should say how many rows the MLP takes at a time: $(tail -4 plan.txt)"
done

for st in 1 2 3; do
  o=(--set offload.optimizer=cpu)
  [ $st -eq 3 ] && o+=(--set offload.params=cpu --set offload.gradients=cpu)
  "$S" train c.yaml --set run.dir=runs/st$st --set zero.stage=$st --set train.mlp_chunk_mb=1 "${LLAMA[@]}" "${o[@]}" \
    > st.log 2>&1 || fail "stage $st chunked: $(tail -3 st.log)"
  [ "$(losses runs/st$st)" = "$(losses runs/llama_blocks_chunk)" ] || fail "stage $st with offload: chunked losses differ from stage 0's"
done
# with accumulation (2 x 24 sequences: 768 rows, chunks of 682 and 86)
acc=(--set train.mlp_chunk_mb=1 --set train.micro_batch=24 --set train.grad_accum=2 "${LLAMA[@]}")
"$S" train c.yaml --set run.dir=runs/acc0 "${acc[@]}" > acc.log 2>&1 || fail "accumulating, stage 0: $(tail -3 acc.log)"
"$S" train c.yaml --set run.dir=runs/acc3 "${acc[@]}" --set zero.stage=3 --set offload.optimizer=nvme --set offload.params=nvme \
  --set offload.gradients=cpu --set "offload.nvme_path=$W" > acc.log 2>&1 || fail "accumulating, stage 3: $(tail -3 acc.log)"
[ "$(losses runs/acc3)" = "$(losses runs/acc0)" ] || fail "accumulating: stage 3 with everything offloaded differs from stage 0"
pass "stages 1-3 with the optimizer (and at stage 3 parameters and gradients) offloaded, and with accumulation (everything on NVMe): the chunked stage 0's losses bit for bit"

"$S" train c.yaml --set run.dir=runs/llama_blocks_chunk --set train.mlp_chunk_mb=1 "${LLAMA[@]}" \
  --resume runs/llama_blocks_chunk/ckpt/step_00000005 > resume.log 2>&1 || fail "resume: $(tail -3 resume.log)"
# the resume rewrote steps 6-10 of the run it resumed: the same as the first time
[ "$(losses runs/llama_blocks_chunk)" = "$(losses runs/st1)" ] || fail "the chunked run resumed from step 5 differs from one run through"
pass "a chunked run resumes bitwise from step 5"

# ---- the residual streams in pinned memory ----
A6=(--set model.n_layer=6 --set train.steps=6 --set train.eval_every=3 --set run.checkpoint_every=3)
same_run() { # run dirs a b: the same losses, validation losses and final state
  [ "$(losses "$1")" = "$(losses "$2")" ] && [ "$(vals "$1")" = "$(vals "$2")" ] &&
    cmp -s "$1/ckpt/step_00000006/rank00000.bin" "$2/ckpt/step_00000006/rank00000.bin"
}
for fam in gpt2 llama; do
  extra=()
  [ $fam = llama ] && extra=("${LLAMA[@]}")
  for ck in blocks none; do
    "$S" train c.yaml --set run.dir=runs/r_${fam}_$ck --set train.activation_checkpointing=$ck "${A6[@]}" "${extra[@]}" \
      > r.log 2>&1 || fail "$fam $ck: $(tail -3 r.log)"
    "$S" train c.yaml --set run.dir=runs/h_${fam}_$ck --set train.activation_checkpointing=$ck --set offload.activations=cpu \
      "${A6[@]}" "${extra[@]}" > h.log 2>&1 || fail "$fam $ck, streams in pinned memory: $(tail -3 h.log)"
    same_run runs/r_${fam}_$ck runs/h_${fam}_$ck ||
      fail "$fam $ck: the residual streams in pinned memory changed the run: $(losses runs/r_${fam}_$ck | tr '\n' ' ') vs $(losses runs/h_${fam}_$ck | tr '\n' ' ')"
    for tier in device pinned; do
      if [ $tier = device ]; then planned=$(field runs/h_${fam}_$ck plan_device_bytes); got=$(field runs/h_${fam}_$ck peak_mem_bytes)
      else planned=$(field runs/h_${fam}_$ck plan_pinned_bytes); got=$(field runs/h_${fam}_$ck pinned_bytes); fi
      [ -n "$planned" ] && [ "$planned" = "$got" ] || fail "$fam $ck: $tier planned $planned, allocated $got"
    done
    # 4 streams of 1536 rows x 64 fp32 channels (384 KiB each) left the device for pinned memory
    moved=$(( $(field runs/r_${fam}_$ck plan_device_bytes) - $(field runs/h_${fam}_$ck plan_device_bytes) ))
    [ $moved -eq $((4 * 1536 * 64 * 4)) ] || fail "$fam $ck: the device should hold 4 streams (1.5 MiB) less, not $moved bytes"
  done
  "$S" plan c.yaml --set offload.activations=cpu "${A6[@]}" "${extra[@]}" > plan.txt
  grep -q "residual streams: 3 of the 7 on the device, the rest in pinned memory (offload.activations)" plan.txt ||
    fail "$fam: the plan should say where the residual streams are: $(tail -5 plan.txt)"
  pass "$fam, checkpointing blocks and none: the residual streams in pinned memory (1.5 MiB off the device, planned = allocated) give the same losses and final state bit for bit"
done
# every stage with everything offloaded, accumulation, and the MLPs in chunks beside it
"$S" train c.yaml --set run.dir=runs/hs3 --set offload.activations=cpu --set zero.stage=3 --set offload.optimizer=cpu \
  --set offload.params=cpu --set offload.gradients=cpu "${A6[@]}" "${LLAMA[@]}" > s3.log 2>&1 || fail "stage 3: $(tail -3 s3.log)"
same_run runs/r_llama_blocks runs/hs3 || fail "stage 3 with everything offloaded: the streams in pinned memory changed the run"
hacc=(--set train.micro_batch=24 --set train.grad_accum=2 "${A6[@]}" "${LLAMA[@]}")
"$S" train c.yaml --set run.dir=runs/hacc0 "${hacc[@]}" > acc.log 2>&1 || fail "accumulating: $(tail -3 acc.log)"
"$S" train c.yaml --set run.dir=runs/hacc1 --set offload.activations=cpu --set train.mlp_chunk_mb=1 "${hacc[@]}" > acc.log 2>&1 ||
  fail "accumulating, streams in pinned memory, MLPs in chunks: $(tail -3 acc.log)"
"$S" train c.yaml --set run.dir=runs/hacc2 --set train.mlp_chunk_mb=1 "${hacc[@]}" > acc.log 2>&1 || fail "accumulating, MLPs in chunks: $(tail -3 acc.log)"
same_run runs/hacc2 runs/hacc1 || fail "accumulating: the streams in pinned memory changed the chunked run"
# resumed from step 3, the same as run through
"$S" train c.yaml --set run.dir=runs/h_llama_blocks --set offload.activations=cpu "${A6[@]}" "${LLAMA[@]}" \
  --resume runs/h_llama_blocks/ckpt/step_00000003 > resume.log 2>&1 || fail "resume: $(tail -3 resume.log)"
same_run runs/r_llama_blocks runs/h_llama_blocks || fail "resumed from step 3 with the streams in pinned memory, the run differs"
pass "stage 3 with everything offloaded, accumulation with the MLPs in chunks, and a resume: bitwise with the streams in pinned memory"
