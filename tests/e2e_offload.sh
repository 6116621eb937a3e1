#!/usr/bin/env bash
# Offload on the CPU backend: optimizer state in pinned memory (cpu) or in an O_DIRECT file
# (nvme) gives bitwise the losses of no offload, at stages 0-3, world 1 and 2, over 20
# steps; at stage 3 the parameter shards live in the same tier too; a checkpoint taken with
# everything on NVMe resumes bitwise; a too-small, missing or read-only nvme_path is
# refused at start with a clear message; the pinned pool never grows; every offload run
# ends with its split and floor (the bytes themselves are checked in tests/test_engine.c).
set -euo pipefail
S=${STRATA:?set by ctest}
command -v mpirun > /dev/null || { echo "mpirun not found: skipping"; exit 77; }
MPI=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
W=$(mktemp -d /tmp/strata-e2e-offload.XXXXXX)
cleanup() { mountpoint -q "$W/small" 2>/dev/null && umount "$W/small"; mountpoint -q "$W/ro" 2>/dev/null && umount "$W/ro"; rm -rf "$W"; }
trap cleanup EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
run() { local n=$1; shift; if [ "$n" -eq 1 ]; then "$S" "$@"; else "${MPI[@]}" -np "$n" "$S" "$@"; fi; }
losses() { grep -o '"loss": [^,]*' "$1/metrics.jsonl"; }

head -c 80000 "$STRATA_SOURCE_DIR/core/model.c" > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
mkdir -p swap
cat > o.yaml <<YAML
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256}
data: {train: "data/train_*.bin"}
train: {steps: 20, micro_batch: 2, grad_accum: 2, eval_every: 0, log_every: 10, sample_tokens: 0}
optim: {lr: 3.0e-3, warmup_steps: 2}
run: {dir: runs/x}
offload: {nvme_path: "$W/swap", block_kb: 64, queue_depth: 8}
YAML
for n in 1 2; do
  for st in 0 1 2 3; do
    run $n train o.yaml --set run.dir=runs/none_${n}_$st --set zero.stage=$st > /dev/null
    for o in cpu nvme; do
      extra=()
      [ $st -eq 3 ] && extra=(--set offload.params=$o)
      run $n train o.yaml --set run.dir=runs/${o}_${n}_$st --set zero.stage=$st --set offload.optimizer=$o "${extra[@]}" > /dev/null
      diff <(losses runs/none_${n}_$st) <(losses runs/${o}_${n}_$st) > /dev/null || fail "world $n stage $st offload $o: losses differ"
      p2=$(grep '"step": 2,' runs/${o}_${n}_$st/metrics.jsonl | grep -o '"pinned_bytes": [0-9]*')
      p20=$(grep '"step": 20,' runs/${o}_${n}_$st/metrics.jsonl | grep -o '"pinned_bytes": [0-9]*')
      [ "$p2" = "$p20" ] && [ "$p2" != '"pinned_bytes": 0' ] || fail "world $n stage $st offload $o: pinned $p2 -> $p20"
    done
    [ -z "$(ls swap)" ] || fail "the NVMe swap file was not removed at exit: $(ls swap)"
  done
  pass "world $n, stages 0-3: offload cpu and nvme (params too at stage 3) give bitwise the losses of no offload over 20 steps; pinned pool flat"
done

# sampling loads the weights alone (launcher/infer.c): runs whose parameters lived in pinned
# memory or on NVMe at stage 3 sample the text of the same run without offload, and so do
# their blocks streamed in from host memory
for n in 1 2; do
  want=$("$S" sample runs/none_${n}_3 --tokens 60 --seed 3 2> /dev/null) || fail "sample of runs/none_${n}_3"
  for o in cpu nvme; do
    got=$("$S" sample runs/${o}_${n}_3 --tokens 60 --seed 3 2> s.err) || fail "sample of runs/${o}_${n}_3: $(cat s.err)"
    [ "$got" = "$want" ] || fail "world $n stage 3, parameters offloaded to $o: the sample differs from the run without offload"
  done
  got=$("$S" sample runs/nvme_${n}_3 --tokens 60 --seed 3 --weights host 2> s.err)
  [ "$got" = "$want" ] && grep -q "2 of the 2 blocks .* in pinned host memory" s.err ||
    fail "world $n: the sample with streamed blocks differs, or does not say so: $(cat s.err)"
done
pass "sample: stage-3 runs with parameters in pinned memory or on NVMe (world 1 and 2) give the text of no offload, blocks streamed or not"

# one rank with its gradients in pinned memory too (offload.gradients: cpu): copied out after
# each backward and back in to accumulate, bitwise the losses of no offload; a checkpoint of
# it resumes bitwise
for st in 0 3; do
  extra=()
  [ $st -eq 3 ] && extra=(--set offload.params=nvme)
  run 1 train o.yaml --set run.dir=runs/g_$st --set zero.stage=$st --set offload.optimizer=nvme --set offload.gradients=cpu \
    --set run.checkpoint_every=10 "${extra[@]}" > /dev/null
  diff <(losses runs/none_1_$st) <(losses runs/g_$st) > /dev/null || fail "stage $st, gradients in pinned memory: losses differ"
  run 1 train o.yaml --set run.dir=runs/g2_$st --set zero.stage=$st --set offload.optimizer=nvme --set offload.gradients=cpu \
    "${extra[@]}" --resume runs/g_$st/ckpt/step_00000010 > /dev/null
  diff <(losses runs/g_$st | sed -n '11,20p') <(losses runs/g2_$st) > /dev/null || fail "stage $st, gradients in pinned memory: resumed losses differ"
done
"$S" plan o.yaml --set offload.optimizer=cpu --set offload.gradients=cpu | grep -q "gradients: in pinned memory for the units the CPU updates" ||
  fail "the plan should say where the gradients are: $("$S" plan o.yaml --set offload.optimizer=cpu --set offload.gradients=cpu | tail -4)"
pass "world 1, stages 0 and 3: gradients in pinned memory (optimizer, and at stage 3 parameters, on NVMe) give bitwise the losses of no offload, and resume bitwise"

# the CPU's update on 1 and on 3 threads (offload.cpu_threads): said at start, and element-wise,
# so the same losses
for n in 1 3; do
  OMP_NUM_THREADS=2 run 1 train o.yaml --set run.dir=runs/t$n --set offload.optimizer=cpu --set offload.cpu_threads=$n \
    > t$n.log 2>&1 || fail "offload.cpu_threads=$n: $(tail -3 t$n.log)"
  grep -q "the CPU's update runs on $n thread" t$n.log || fail "offload.cpu_threads=$n is not said at start: $(grep offload t$n.log | head -3)"
  diff <(losses runs/none_1_0) <(losses runs/t$n) > /dev/null || fail "offload.cpu_threads=$n: losses differ"
done
pass "offload.cpu_threads 1 and 3: said at start, bitwise the losses of no offload"

# a checkpoint of a run whose parameters and optimizer state live on NVMe resumes bitwise;
# in chunks of 4096 elements, the smallest (a unit's update, and the checkpoint's reads and
# writes of state and parameters, go through the staging a chunk at a time)
run 2 train o.yaml --set run.dir=runs/res --set zero.stage=3 --set offload.optimizer=nvme --set offload.params=nvme \
  --set offload.chunk_kb=16 --set run.checkpoint_every=10 > /dev/null
run 2 train o.yaml --set run.dir=runs/res2 --set zero.stage=3 --set offload.optimizer=nvme --set offload.params=nvme \
  --set offload.chunk_kb=16 --resume runs/res/ckpt/step_00000010 > /dev/null
diff <(losses runs/res | sed -n '11,20p') <(losses runs/res2) > /dev/null || fail "nvme offload: resumed losses differ"
diff <(losses runs/none_2_3) <(losses runs/res) > /dev/null || fail "nvme offload with checkpoints: losses differ from no offload"
pass "world 2 stage 3, params and optimizer on NVMe in 4096-element chunks: resume from step 10 is bitwise identical (steps 11-20)"

# the optimizer state in three tiers: 40% on the device (offload.optimizer_ratio 0.6), of the
# rest half in pinned memory and half on NVMe (offload.nvme_ratio 0.5): the same losses, the
# plan names all three, and its checkpoint resumes bitwise fully offloaded and not offloaded
"$S" plan o.yaml --world 2 --set zero.stage=1 --set offload.optimizer=nvme --set offload.optimizer_ratio=0.6 \
  --set offload.nvme_ratio=0.5 > ratio_plan.txt || fail "three-tier plan: $(cat ratio_plan.txt)"
# the optimizer column of each tier's row ("pinned host" is two words)
opt=$(awk '$1 == "device" && NF > 8 {d = $6 $7} $1 == "pinned" {p = $7 $8} $1 == "nvme" {n = $6 $7} END {print d, p, n}' ratio_plan.txt)
grep -q ' 0B\|^0B' <<<"$opt" && fail "the three-tier plan should hold optimizer state in every tier, got '$opt': $(cat ratio_plan.txt)"
run 2 train o.yaml --set run.dir=runs/ratio --set zero.stage=1 --set offload.optimizer=nvme --set offload.optimizer_ratio=0.6 \
  --set offload.nvme_ratio=0.5 --set run.checkpoint_every=10 > ratio.log 2>&1 || fail "three-tier run: $(tail -3 ratio.log)"
diff <(losses runs/none_2_1) <(losses runs/ratio) > /dev/null || fail "three tiers: losses differ from no offload"
for o in "--set offload.optimizer=cpu" "--set offload.optimizer=none"; do
  rm -rf runs/ratio2
  run 2 train o.yaml --set run.dir=runs/ratio2 --set zero.stage=1 $o --resume runs/ratio/ckpt/step_00000010 > /dev/null
  diff <(losses runs/ratio | sed -n '11,20p') <(losses runs/ratio2) > /dev/null || fail "three-tier checkpoint resumed with $o: losses differ"
done
pass "world 2 stage 1, the optimizer state on the device, in pinned memory and on NVMe: bitwise the losses of no offload; its checkpoint resumes bitwise fully offloaded and not offloaded"


# steady state: a run right after another (same nvme_path, same run dir) starts as fast,
# finds no stale swap file or lock, and leaves none behind
t_start() { local t0; t0=$(date +%s%N); "$S" train o.yaml --set run.dir=runs/again --set zero.stage=3 --set offload.optimizer=nvme \
  --set offload.params=nvme --set train.steps=2 > again.log 2>&1 || fail "back-to-back run failed: $(tail -3 again.log)"; echo $(( ($(date +%s%N) - t0) / 1000000 )); }
ms1=$(t_start); ms2=$(t_start)
[ "$ms2" -le $(( ms1 * 3 / 2 + 500 )) ] || fail "the second run took $ms2 ms against $ms1 ms for the first"
[ -z "$(ls swap)" ] || fail "stale swap files after two runs: $(ls swap)"
[ -z "$(find runs/again -name '*.tmp*')" ] || fail "temporary files left in the run dir: $(find runs/again -name '*.tmp*')"
pass "back-to-back runs on the same nvme_path: $ms1 ms then $ms2 ms, no stale files"
for tier in "device memory" "pinned host memory"; do
  grep -q "\[plan\] $tier: planned \(.*\), peak allocated \1 (+0.00%)" again.log || fail "end-of-run $tier line: $(grep plan again.log)"
done
grep -q "\[plan\] nvme: planned \(.*\), held \1 in " again.log || fail "end-of-run nvme line: $(grep plan again.log)"
pass "the end of a run reports every tier, planned against allocated: $(grep -c '^\[plan\]' again.log) lines"

# the split and its floor: every offload run ends with them; the step is never much
# below the floor (a lower bound: 0.9 allows for noise), and the floor names its term
floor_ok() { # log label
  grep -q '\[offload\]   D2H gradients .* | H2D parameters' "$1" || fail "$2: no split in the report: $(grep offload "$1")"
  grep -q '\[offload\] floor .* ms, set by ' "$1" || fail "$2: no floor in the report: $(grep offload "$1")"
  local x; x=$(grep -o 'ms = [0-9.]*x the floor' "$1" | grep -o '[0-9.]*x' | tr -d x)
  [ -n "$x" ] && awk -v x="$x" 'BEGIN { exit !(x >= 0.9) }' || fail "$2: step/floor ratio '$x'"
  echo "$2: $(grep -o 'floor [0-9.]* ms, set by [^(]*' "$1"), step ${x}x the floor"
}
floor_ok again.log "stage 3, params and optimizer on NVMe, world 1"
run 2 train o.yaml --set run.dir=runs/split2 --set zero.stage=1 --set offload.optimizer=cpu --set train.steps=4 > split2.log 2>&1 ||
  fail "world 2 split run: $(tail -3 split2.log)"
floor_ok split2.log "stage 1, optimizer in pinned memory, world 2"
grep -q '"offload_d2h_bytes": [1-9]' runs/split2/metrics.jsonl || fail "metrics.jsonl has no split figures"
STRATA_OFFLOAD_FLOOR=off "$S" train o.yaml --set run.dir=runs/nofloor --set offload.optimizer=cpu --set train.steps=3 > nofloor.log 2>&1 ||
  fail "STRATA_OFFLOAD_FLOOR=off run: $(tail -3 nofloor.log)"
grep -q 'floor: not measured' nofloor.log && grep -q 'CPU AdamW' nofloor.log || fail "STRATA_OFFLOAD_FLOOR=off: $(grep offload nofloor.log)"
"$S" train o.yaml --set run.dir=runs/nosplit --set train.steps=3 > nosplit.log 2>&1 || fail "plain run: $(tail -3 nosplit.log)"
! grep -q '\[offload\]' nosplit.log || fail "a run without offload printed a split: $(grep offload nosplit.log)"
pass "offload runs end with the split and the floor (step >= 0.9 x floor); STRATA_OFFLOAD_FLOOR=off skips the floor; no split without offload"

# nvme_path too small: refused at start with the bytes needed and free
if mkdir small && mount -t tmpfs -o size=64k tmpfs small 2>/dev/null; then
  set +e; out=$("$S" train o.yaml --set offload.optimizer=nvme --set "offload.nvme_path=$W/small" 2>&1); rc=$?; set -e
  [ $rc -eq 3 ] || fail "too-small nvme_path: exit $rc: $out"
  grep -q "nvme ($W/small): needs .* free" <<<"$out" || fail "too-small nvme_path message: $out"
  pass "too-small nvme_path refused with exit 3: $(grep -o 'nvme ([^)]*): needs [^)]*free' <<<"$out" | head -1)"
else
  echo "note: cannot mount a tmpfs here; the too-small nvme_path check is skipped"
fi
set +e; out=$("$S" train o.yaml --set offload.optimizer=nvme --set "offload.nvme_path=$W/missing" 2>&1); rc=$?; set -e
[ $rc -ne 0 ] && grep -q "$W/missing" <<<"$out" || fail "missing nvme_path: exit $rc: $out"
pass "missing nvme_path refused: $(grep -m1 -o "error.*" <<<"$out" | cut -c1-160)"
if mkdir ro && mount -t tmpfs -o size=1m,ro tmpfs ro 2>/dev/null; then
  set +e; out=$("$S" train o.yaml --set offload.optimizer=nvme --set "offload.nvme_path=$W/ro" 2>&1); rc=$?; set -e
  [ $rc -ne 0 ] && grep -q "$W/ro" <<<"$out" || fail "read-only nvme_path: exit $rc: $out"
  pass "read-only nvme_path refused: $(grep -m1 -o "error.*" <<<"$out" | cut -c1-160)"
else
  echo "note: cannot mount a read-only tmpfs here; that check is skipped"
fi
echo "all e2e_offload checks passed"
