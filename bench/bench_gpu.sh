#!/usr/bin/env bash
# bench/bench_gpu.sh: GPT-2 training speed on one GPU, Strata against PyTorch in ONE run,
# so every row saw the same GPU, driver and clocks. Per size (T=1024, bf16): Strata at
# zero stage 0 and at stage 3 (world 1), the nanoGPT-style PyTorch model of
# bench/torch_cpu_gpt.py eager and torch.compile'd, and transformers' GPT2LMHeadModel with
# attn_implementation="sdpa"; bench/bench_gpu.py renders the table (tokens/s, ms/step,
# model TFLOP/s and MFU, peak memory, the ratio to torch.compile). Then, for 124M, Strata's
# per-kernel breakdown of a step (STRATA_PROFILE=kernels, core/profile.h).
#
# Environment:
#   STRATA          the strata binary built with CUDA (default build-gpu/strata, as
#                   bench/gpu-check.sh builds it)
#   OUT             where the table goes (default gpu-check-out): $OUT/$BENCH_NAME.md, its
#                   rows in $OUT/$BENCH_NAME.rows.jsonl, each row's log in $OUT/bench-logs/
#   BENCH_NAME      default bench_gpu
#   BENCH_SIZES     sizes, in order (default "124m 350m 774m 1.5b"); one call of the
#                   device tool has 10 minutes, so give it one or two sizes at a time
#   BENCH_ROWS      rows per size, in the order they run (default "strata0 compile strata3
#                   eager hf"; strata0-tc and strata3-tc add Strata with STRATA_ATTENTION=tc,
#                   strata0-tc-ckpt the same with activation checkpointing per block,
#                   strata0-tc-chunk with the head in 256 MiB chunks: train.logits_chunk_mb)
#   BENCH_PROFILE   1 (default when 124m is in BENCH_SIZES): the kernel breakdown at 124M
#   BENCH_BUDGET_S  the whole call's seconds (default 560): a row that would start past
#                   it is reported as skipped, and each row is cut at what is left
#   BENCH_ROW_S     the most one row may take (default 240)
#   BENCH_STEPS     Strata's steps per row (default 12; the first 3 are left out)
#   STRATA_BENCH_SETS  extra --set words for every Strata row (e.g.
#                   "train.activation_checkpointing=none")
#   PEAK_TFLOPS     the GPU's dense bf16 peak for MFU (default 989: H100 SXM; PCIe: 756)
#   PYTHON          python with torch (and transformers for the hf row); default python3
#   BENCH_TINY=1    a smoke test on the CPU: the same script with a 2-layer model, Strata
#                   on its CPU backend and PyTorch with --device cpu (numbers meaningless)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=${STRATA:-$ROOT/build-gpu/strata}
OUT=${OUT:-$ROOT/gpu-check-out}
NAME=${BENCH_NAME:-bench_gpu}
PY=${PYTHON:-python3}
SIZES=${BENCH_SIZES:-124m 350m 774m 1.5b}
ROWS=${BENCH_ROWS:-strata0 compile strata3 eager hf}
PEAK=${PEAK_TFLOPS:-989}
BUDGET=${BENCH_BUDGET_S:-560}
ROW_MAX=${BENCH_ROW_S:-240}
STEPS=${BENCH_STEPS:-12}
TINY=${BENCH_TINY:-0}
PROFILE=${BENCH_PROFILE:-$([[ " $SIZES " == *" 124m "* || $TINY == 1 ]] && echo 1 || echo 0)}
DEADLINE=$(($(date +%s) + BUDGET))
log() { echo "[bench_gpu] $*"; }
for row in $ROWS; do
  case $row in
    strata0 | strata0-tc | strata3 | strata3-tc | strata0-tc-ckpt | strata0-tc-chunk | compile | eager | hf) ;;
    *) echo "bench_gpu: BENCH_ROWS: unknown row '$row' (strata0 strata0-tc strata3 strata3-tc strata0-tc-ckpt strata0-tc-chunk compile eager hf)" >&2; exit 2 ;;
  esac
done
[ -x "$S" ] || { echo "bench_gpu: no strata binary at $S (build with CUDA, or set STRATA)" >&2; exit 2; }
mkdir -p "$OUT/bench-logs"
ROWS_FILE=$OUT/$NAME.rows.jsonl
: > "$ROWS_FILE"
W=$(mktemp -d /tmp/strata-bench-gpu.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"

if [ "$TINY" = 1 ]; then
  DEVICE=cpu
  cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: 64, vocab_size: 256}
train: {steps: 5, micro_batch: 2}
optim: {lr: 1.0e-3, warmup_steps: 1}
YAML
else
  DEVICE=cuda
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/$NAME.gpu.txt" || true
  fi
fi
cat "$ROOT"/core/*.c "$ROOT"/core/*.h "$ROOT"/shard/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null

batch_of() { case $1 in tiny) echo 2 ;; 124m) echo 16 ;; *) echo 8 ;; esac; }
config_of() { [ "$1" = tiny ] && echo "$W/tiny.yaml" || echo "$ROOT/configs/gpt2-$1.yaml"; }
size_args() { [ "$1" = tiny ] && echo "--tiny" || echo "--size $1"; }
# seconds the next row may take: the smaller of BENCH_ROW_S and what the budget has left
row_limit() {
  local left=$((DEADLINE - $(date +%s)))
  echo $((left < ROW_MAX ? left : ROW_MAX))
}
failed_row() { # name size why
  "$PY" "$ROOT/bench/bench_gpu.py" fail --name "$1" --size "$2" --error "$3" --out "$ROWS_FILE" > /dev/null
  log "$1 ($2): $3"
}
first_error() { grep -m1 -iE "error|not fit|Traceback|out of memory|exit" "$1" | cut -c1-140 || tail -1 "$1" | cut -c1-140; }

strata_row() { # size name stage [env...]
  local size=$1 name=$2 st=$3
  shift 3
  local tag log limit cfg ckpt
  cfg=$(config_of "$size")
  ckpt=$(grep -oE "activation_checkpointing: *[a-z:0-9]+" "$cfg" | awk '{print $2}' || true)
  for w in ${STRATA_BENCH_SETS:-} ${ROW_SETS:-}; do # the row's own setting, when one is given
    [[ $w == train.activation_checkpointing=* ]] && ckpt=${w#*=}
  done
  [ -n "$ckpt" ] && [ "$ckpt" != none ] && name="$name (activation checkpointing: $ckpt)"
  tag=$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_')
  log=$OUT/bench-logs/$size-$tag.log
  limit=$(row_limit)
  [ "$limit" -ge 20 ] || { failed_row "$name" "$size" "skipped: the call's budget (BENCH_BUDGET_S=$BUDGET) ran out"; return 0; }
  local sets=()
  for w in ${STRATA_BENCH_SETS:-} ${ROW_SETS:-}; do sets+=(--set "$w"); done
  rm -rf "runs/$tag"
  log "$name ($size), at most $limit s"
  if env STRATA_CUDA_UNVERIFIED=1 "$@" timeout -k 10 "$limit" "$S" train "$cfg" --set device=$DEVICE \
       --set train.steps="$STEPS" --set train.micro_batch="$(batch_of "$size")" --set zero.stage="$st" \
       --set run.dir="runs/$tag" --set run.checkpoint_every=0 --set run.checkpoint_at_end=false \
       --set train.eval_every=0 --set train.sample_tokens=0 --set train.sample_every=0 \
       --set 'data.train=data/train_*.bin' --set data.val= "${sets[@]}" > "$log" 2>&1; then
    # shellcheck disable=SC2046
    "$PY" "$ROOT/bench/bench_gpu.py" strata --name "$name" $(size_args "$size") --batch "$(batch_of "$size")" \
      --metrics "runs/$tag/metrics.jsonl" --out "$ROWS_FILE" > /dev/null
  else
    failed_row "$name" "$size" "exit $? ($(first_error "$log"))"
  fi
}

torch_row() { # size impl [--compile]
  local size=$1 impl=$2 how=("${@:3}") name log limit
  name="PyTorch $impl $([ ${#how[@]} -gt 0 ] && echo torch.compile || echo eager)"
  log=$OUT/bench-logs/$size-torch-$impl${how[0]:+-compile}.log
  limit=$(row_limit)
  [ "$limit" -ge 20 ] || { failed_row "$name" "$size" "skipped: the call's budget (BENCH_BUDGET_S=$BUDGET) ran out"; return 0; }
  log "$name ($size), at most $limit s"
  local steps=()
  [ "$size" = tiny ] && steps=(--steps 2 --warmup 1)
  # shellcheck disable=SC2046
  timeout -k 10 "$limit" "$PY" "$ROOT/bench/bench_gpu.py" torch --impl "$impl" "${how[@]}" $(size_args "$size") \
    --batch "$(batch_of "$size")" --device $DEVICE "${steps[@]}" --out "$ROWS_FILE" > "$log" 2>&1 ||
    failed_row "$name" "$size" "exit $? ($(first_error "$log"))"
}

have_torch=1
"$PY" -c "import torch" 2> /dev/null || have_torch=0
have_hf=1
"$PY" -c "import transformers" 2> /dev/null || have_hf=0
[ "$TINY" = 1 ] && SIZES=tiny
for size in $SIZES; do
  for row in $ROWS; do
    case $row in
      strata0) strata_row "$size" "Strata stage 0" 0 ;;
      strata0-tc) strata_row "$size" "Strata stage 0, STRATA_ATTENTION=tc" 0 STRATA_ATTENTION=tc ;;
      strata3) strata_row "$size" "Strata stage 3 (world 1)" 3 ;;
      strata3-tc) strata_row "$size" "Strata stage 3 (world 1), STRATA_ATTENTION=tc" 3 STRATA_ATTENTION=tc ;;
      strata0-tc-ckpt) ROW_SETS=train.activation_checkpointing=blocks \
        strata_row "$size" "Strata stage 0, STRATA_ATTENTION=tc" 0 STRATA_ATTENTION=tc ;;
      strata0-tc-chunk) ROW_SETS=train.logits_chunk_mb=256 \
        strata_row "$size" "Strata stage 0, STRATA_ATTENTION=tc, logits in 256 MiB chunks" 0 STRATA_ATTENTION=tc ;;
      compile | eager | hf)
        if [ $have_torch = 0 ]; then failed_row "PyTorch $row" "$size" "no torch in $PY"
        elif [ "$row" = hf ] && [ $have_hf = 0 ]; then failed_row "PyTorch hf" "$size" "no transformers in $PY"
        elif [ "$row" = compile ]; then torch_row "$size" nanogpt --compile
        elif [ "$row" = eager ]; then torch_row "$size" nanogpt
        else torch_row "$size" hf; fi ;;
    esac
  done
done

{
  [ -s "$OUT/$NAME.gpu.txt" ] && echo "GPU: $(cat "$OUT/$NAME.gpu.txt")" && echo
  "$PY" "$ROOT/bench/bench_gpu.py" render --rows "$ROWS_FILE" --peak "$PEAK"
} > "$OUT/$NAME.md"

# the step by kernel group, with attention on CUDA cores and on tensor cores (the "before"
# and "after" of issue 17's largest change)
if [ "$PROFILE" = 1 ]; then
  size=$([ "$TINY" = 1 ] && echo tiny || echo 124m)
  for att in simt tc; do
    limit=$(row_limit)
    echo "Strata's step at $size, B=$(batch_of "$size"), stage 0, STRATA_ATTENTION=$att, by kernel group (STRATA_PROFILE=kernels):" >> "$OUT/$NAME.md"
    echo >> "$OUT/$NAME.md"
    if [ "$limit" -ge 20 ]; then
      log "kernel profile ($size, attention $att), at most $limit s"
      rm -rf runs/prof
      if STRATA_ATTENTION=$att STRATA_PROFILE=kernels timeout -k 10 "$limit" "$S" train "$(config_of "$size")" --set device=$DEVICE \
           --set train.steps=6 --set train.micro_batch="$(batch_of "$size")" --set run.dir=runs/prof --set run.checkpoint_every=0 \
           --set run.checkpoint_at_end=false --set train.eval_every=0 --set train.sample_tokens=0 \
           --set 'data.train=data/train_*.bin' --set data.val= > "$OUT/bench-logs/profile-$att.log" 2>&1; then
        { echo '```'; grep '\[prof\]' "$OUT/bench-logs/profile-$att.log" | sed 's/^\[prof\] //'; echo '```'; } >> "$OUT/$NAME.md"
      else
        echo "failed: exit $? ($(first_error "$OUT/bench-logs/profile-$att.log"))" >> "$OUT/$NAME.md"
      fi
    else
      echo "skipped: the call's budget (BENCH_BUDGET_S=$BUDGET) ran out" >> "$OUT/$NAME.md"
    fi
    echo >> "$OUT/$NAME.md"
  done
fi
cat "$OUT/$NAME.md"
