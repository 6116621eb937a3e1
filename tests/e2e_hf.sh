#!/usr/bin/env bash
# Hugging Face model directories in and out, without Python:
#  - `strata export RUN --out DIR` -> `model.init_from: DIR` gives the step-0 loss of the
#    run it came from bit for bit (the loss of the resumed run's next step, on the same
#    batch), at world 1 and at world 2 stage 3 (also with optimizer and parameter shards
#    offloaded to pinned memory and to NVMe);
#  - a sharded directory (--max-shard-size, with model.safetensors.index.json) and a lone
#    .safetensors file load alike; re-exporting unsharded leaves no stale index;
#  - a run from model.init_from validates before its first step (train.eval_at_start): the
#    source run's last validation loss bit for bit, as metrics.jsonl's step 0; kept once by
#    a resume (world 2 stage 3 agrees within 1e-6); off on request, and on request from
#    random weights (eval_batches 0: all);
#  - run.keep_best: ckpt/best names the saved step of the lowest validation loss, which
#    run.keep then keeps; its export validates at step 0 to that loss bit for bit, and is
#    what run.export_dir writes at the end of the run;
#  - resuming wins over model.init_from; a YAML shape that disagrees with config.json,
#    a missing init_from and bad export options are refused with exit 2 naming the value;
#    a NaN in its weights stops the run at load with exit 1, naming tensor and element;
#  - every subcommand answers --help on stdout with exit 0; --version names the build.
set -euo pipefail
S=${STRATA:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-hf.XXXXXX)
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

# --- --help and --version: every command the usage lists (launcher/main.c's table) has its own
cmds=$("$S" --help | sed -n 's/^  \([a-z-]\+\) .*/\1/p')
for c in train prepare config plan sample chat eval plot bench export dump-grads; do
  grep -qx "$c" <<<"$cmds" || fail "strata --help should list $c: $(echo $cmds)"
done
for c in $cmds; do
  [ "$(code "$S" $c --help)" = 0 ] || fail "strata $c --help should exit 0: $(cat out.txt)"
  grep -q "^usage: strata $c" out.txt || fail "strata $c --help should print its usage: $(head -3 out.txt)"
  # (grep without -q reads to the end: with -q it could leave before a help of more than
  # stdio's 4 KiB buffer is written, and the SIGPIPE would fail the pipeline)
  "$S" $c --help 2> /dev/null | grep "usage: strata $c" > /dev/null || fail "strata $c --help prints on stdout"
done
[ "$(code "$S" sample --help)" = 0 ] && grep -q -- "--tokenizer" out.txt || fail "sample --help names its options"
"$S" --version > version.txt || fail "--version should exit 0"
for w in "^strata [0-9]" CUDA NCCL MPI io_uring; do grep -q "$w" version.txt || fail "--version should name $w: $(cat version.txt)"; done
pass "every subcommand answers --help (stdout, exit 0); --version: $(head -1 version.txt), $(grep -c . version.txt) lines"

# --- data whose every step sees the same batch: 40 bytes = 2 sequences of 16 + 1 tokens,
# one global batch (2 sequences), read unshuffled, so step N+1 of a resumed run and step 1
# of a run from the exported weights compute the loss of the same weights on the same tokens
printf 'Pretrained weights in, fine-tuned out....' | head -c 40 > tiny.txt
"$S" prepare --text tiny.txt --out data --val-fraction 0 > /dev/null
cat > base.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 16, vocab_size: 256}
data: {train: "data/train_*.bin", val: "", shuffle: false}
train: {steps: 3, micro_batch: 2, eval_every: 0, sample_tokens: 0}
optim: {lr: 1.0e-2, warmup_steps: 0}
run: {dir: runs/a, checkpoint_every: 3, keep: 0}
YAML
cat > ft.yaml <<'YAML'
device: cpu
model: {init_from: hf}
data: {train: "data/train_*.bin", val: "", shuffle: false}
train: {steps: 1, micro_batch: 2, eval_every: 0, sample_tokens: 0}
run: {dir: runs/b}
YAML
"$S" train base.yaml > a.log
"$S" export runs/a --out hf > /dev/null
for f in config.json generation_config.json model.safetensors tokenizer.json vocab.json merges.txt tokenizer_config.json; do
  [ -s "hf/$f" ] || fail "export --out DIR should write $f"
done
grep -q '"n_layer": 2' hf/config.json && grep -q '"vocab_size": 256' hf/config.json || fail "config.json: $(cat hf/config.json)"
"$S" train base.yaml --set train.steps=4 --resume latest > a4.log
ref=$(loss_at runs/a 4)
"$S" train ft.yaml > b.log
grep -q "initialised from hf: 28 tensors in 1 file, F32" b.log || fail "init_from should say what it read: $(grep init b.log)"
[ "$(loss_at runs/b 1)" = "$ref" ] || fail "world 1: init_from's step-0 loss $(loss_at runs/b 1) vs the run's $ref"
[ -s runs/b/tokenizer.json ] || fail "the fine-tuning run should record its tokenizer"
pass "world 1: export -> init_from gives the run's next loss bit for bit ($ref)"

# --- validation before the first step (train.eval_at_start): from model.init_from, the
# weights' own validation loss, which the run they came from measured after its last step
# (same weights, same batches: bit for bit), as step 0's row; not when turned off, once on
# a resume, and on request for a run from random weights
printf 'Validation before the first step shows where the weights start; after it, training.' | head -c 80 > v.txt
"$S" prepare --text v.txt --out vdata --val-fraction 0.5 > /dev/null
val_at() { grep "\"step\": $2," "$1/metrics.jsonl" | grep -o '"val_loss": [^,}]*' | cut -d' ' -f2; }
"$S" train base.yaml --set data.train='vdata/train_*.bin' --set data.val='vdata/val_*.bin' --set run.dir=runs/va \
  > va.log
"$S" export runs/va --out hfv > /dev/null
vref=$(val_at runs/va 3)
"$S" train ft.yaml --set model.init_from=hfv --set data.train='vdata/train_*.bin' --set data.val='vdata/val_*.bin' \
  --set run.dir=runs/vb --set run.checkpoint_every=1 > vb.log
[ -n "$vref" ] && [ "$(val_at runs/vb 0)" = "$vref" ] && [ "$(head -1 runs/vb/metrics.jsonl)" = "{\"step\": 0, \"val_loss\": $vref}" ] &&
  grep -q "^step      0/1 | val .* (before training, 8 batches)" vb.log ||
  fail "init_from: step 0's validation should be the source run's last ($vref): $(head -1 runs/vb/metrics.jsonl); $(grep 'step  *0' vb.log)"
"$S" train ft.yaml --set model.init_from=hfv --set data.train='vdata/train_*.bin' --set data.val='vdata/val_*.bin' \
  --set run.dir=runs/vb --set train.steps=2 --resume latest > vb2.log
[ "$(grep -c '"step": 0,' runs/vb/metrics.jsonl)" = 1 ] && ! grep -q "before training" vb2.log &&
  [ "$(wc -l < runs/vb/metrics.jsonl)" = 3 ] || fail "a resume keeps step 0's row once and validates nothing first: $(cat runs/vb/metrics.jsonl | cut -c1-40)"
"$S" train ft.yaml --set model.init_from=hfv --set data.train='vdata/train_*.bin' --set data.val='vdata/val_*.bin' \
  --set run.dir=runs/vc --set train.eval_at_start=false > vc.log
[ -z "$(val_at runs/vc 0)" ] && ! grep -q "before training" vc.log || fail "eval_at_start false: no validation first"
"$S" train base.yaml --set data.train='vdata/train_*.bin' --set data.val='vdata/val_*.bin' --set run.dir=runs/vd \
  --set train.eval_at_start=true --set train.eval_batches=0 > vd.log
[ -n "$(val_at runs/vd 0)" ] && grep -q "^step      0/3 | val .* (before training, 1 batches)" vd.log ||
  fail "eval_at_start true from random weights, eval_batches 0 (2 val sequences, B 2: 1 batch): $(grep 'step  *0' vd.log)"
pass "validation before the first step: from init_from it is the source run's last, bit for bit ($vref); off, once on a resume, on request"

# --- the best checkpoint (run.keep_best): validation on noise gets worse as the model learns
# the text; ckpt/best names the step of the lowest validation loss, retention (run.keep 1)
# keeps it, and its export starts a run whose step-0 validation is that loss, bit for bit
LC_ALL=C awk 'BEGIN {srand(7); for (i = 0; i < 4000; i++) printf "%c", 1 + int(rand() * 255)}' > noise.bin
"$S" prepare --text noise.bin --out ndata --val-fraction 0.5 > /dev/null
"$S" train base.yaml --set data.train='vdata/train_*.bin' --set data.val='ndata/val_*.bin' --set run.dir=runs/best \
  --set train.steps=8 --set train.eval_every=2 --set run.checkpoint_every=2 --set run.keep=1 --set run.keep_best=true \
  --set run.export_dir=hfauto > best.log
read -r bstep bval <<< "$(grep -o '"step": [0-9]*, "loss": [^,]*, "val_loss": [^,]*' runs/best/metrics.jsonl |
                          awk '{print $2, $6}' | tr -d , | sort -g -k2 | head -1)"
bname=$(printf 'step_%08d' "$bstep")
[ "$(head -1 runs/best/ckpt/best)" = "$bname" ] && [ -d "runs/best/ckpt/$bname" ] && [ "$bstep" != 8 ] &&
  [ -d runs/best/ckpt/step_00000008 ] && [ "$(ls -d runs/best/ckpt/step_* | wc -l)" = 2 ] &&
  grep -q "the lowest validation loss of a saved step, .* is runs/best/ckpt/$bname" best.log ||
  fail "ckpt/best should name $bname (val $bval), kept beside the newest: $(cat runs/best/ckpt/best); $(ls runs/best/ckpt)"
"$S" export runs/best/ckpt/best --out hfbest > /dev/null
"$S" train ft.yaml --set model.init_from=hfbest --set data.train='vdata/train_*.bin' --set data.val='ndata/val_*.bin' \
  --set run.dir=runs/frombest > frombest.log
[ "$(val_at runs/frombest 0)" = "$bval" ] || fail "export of ckpt/best: step 0's validation $(val_at runs/frombest 0) vs $bval"
# run.export_dir: the run's own export at its end is the best's (run.export_checkpoint auto)
for f in model.safetensors config.json tokenizer.json; do
  cmp -s "hfauto/$f" "hfbest/$f" || fail "run.export_dir's $f differs from exporting ckpt/best by hand"
done
grep -q "run.export_dir: exporting runs/best/ckpt/best to hfauto" best.log || fail "the run should say what it exports"
[ "$(code "$S" train base.yaml --set run.dir=runs/x --set run.export_dir=nowhere/hf)" = 2 ] &&
  grep -q "run.export_dir': 'nowhere/hf' cannot be written" out.txt && [ ! -e runs/x ] ||
  fail "an export_dir that cannot be written should be refused at start: $(cat out.txt)"
pass "run.keep_best: ckpt/best names step $bstep of the lowest validation ($bval), kept beside the newest; its export validates to it bit for bit; run.export_dir writes that export at the end (refused at start where it cannot)"

# --- strata eval: the best checkpoint on its run's data.val, as the run validated it (its
# micro-batch, train.eval_batches 8), gives the loss the run recorded, bit for bit: with the
# blocks resident or streamed from pinned memory, and from its export (a Hugging Face directory)
ev_loss() { grep -o '"loss": [^,]*' <<<"$1" | cut -d' ' -f2; }
ev1=$("$S" eval runs/best/ckpt/best --batches 8 --json 2> ev1.err) || fail "eval: $(cat ev1.err)"
ev2=$("$S" eval runs/best/ckpt/best --batches 8 --json --weights host 2> ev2.err) || fail "eval --weights host: $(cat ev2.err)"
ev3=$("$S" eval hfbest --data 'ndata/val_*.bin' --micro-batch 2 --batches 8 --json 2> ev3.err) || fail "eval of the export: $(cat ev3.err)"
[ "$(ev_loss "$ev1")" = "$bval" ] && [ "$(ev_loss "$ev2")" = "$bval" ] && [ "$(ev_loss "$ev3")" = "$bval" ] &&
  grep -q '"batches": 8, "micro_batch": 2, "seq_len": 16, "tokens": 256, "learned_tokens": 256' <<<"$ev1" ||
  fail "eval should give the run's validation loss $bval: $ev1 / $ev2 / $ev3"
"$S" eval runs/best/ckpt/best > ev_all.txt 2> /dev/null && grep -q "^loss .* over 62 batches of 2 x 16 tokens (1984 learned) of ndata/val_\*.bin" ev_all.txt ||
  fail "eval over the whole of data.val: $(cat ev_all.txt)"
[ "$(code "$S" eval hfbest)" = 2 ] && grep -q "\-\-data GLOB names the token shards to evaluate on (a Hugging Face model has none of its own)" out.txt &&
  [ "$(code "$S" eval runs/best --batches 100)" = 0 ] && grep -q "100 batches of 2 take 200 sequences, and ndata/val_\*.bin holds 124: they repeat" out.txt &&
  [ "$(code "$S" eval runs/best --seq-len 17)" = 2 ] && grep -q "more than the model's context, 16" out.txt ||
  fail "eval's refusals: $(cat out.txt)"
pass "eval: the best checkpoint gives the run's validation loss $bval bit for bit (blocks resident or streamed, and from its export); the whole of data.val; refusals name why"

# --- early stopping on the same noise validation: the run ends at the validation that makes
# train.early_stop_patience (2) in a row without a lower loss, as a replay of metrics.jsonl says,
# with its checkpoint; the lowest's is kept (run.keep 1, no run.keep_best); a resume goes on
# counting where the run was and ends at its next validation
es_replay() { # the steps of the lowest validation and of the stop, from the validations in metrics.jsonl
  grep -o '"step": [0-9]*, "loss": [^,]*, "val_loss": [^,]*' "$1/metrics.jsonl" | awk '{print $2, $6}' | tr -d , |
    awk -v p=2 'BEGIN {best = 1e30} {if ($2 < best) {best = $2; at = $1; n = 0} else if (++n >= p) {print at, $1; exit}}'
}
"$S" train base.yaml --set data.train='vdata/train_*.bin' --set data.val='ndata/val_*.bin' --set run.dir=runs/es \
  --set train.steps=60 --set train.eval_every=2 --set run.checkpoint_every=2 --set run.keep=1 \
  --set train.early_stop_patience=2 > es.log
read -r es_best es_stop <<< "$(es_replay runs/es)"
es_last=$(tail -1 runs/es/metrics.jsonl | grep -o '"step": [0-9]*' | cut -d' ' -f2)
[ -n "$es_stop" ] && [ "$es_last" = "$es_stop" ] && [ "$es_stop" -lt 60 ] &&
  grep -q "early stop after step $es_stop of 60: 2 validations in a row have not come below the lowest validation loss, .* at step $es_best " es.log &&
  [ "$(head -1 runs/es/ckpt/best)" = "$(printf 'step_%08d' "$es_best")" ] && [ -d "runs/es/ckpt/$(printf 'step_%08d' "$es_best")" ] &&
  [ -d "runs/es/ckpt/$(printf 'step_%08d' "$es_stop")" ] ||
  fail "early stop: the replay says lowest at $es_best, stop at $es_stop; the run ended at $es_last: $(grep -E 'early|lowest' es.log); $(ls runs/es/ckpt)"
"$S" train base.yaml --set data.train='vdata/train_*.bin' --set data.val='ndata/val_*.bin' --set run.dir=runs/es \
  --set train.steps=60 --set train.eval_every=2 --set run.checkpoint_every=2 --set run.keep=1 \
  --set train.early_stop_patience=2 --resume latest > es2.log
grep -q "the lowest validation loss so far is .* (step $es_best), 2 validations since" es2.log &&
  grep -q "early stop after step $((es_stop + 2)) of 60: 3 validations" es2.log ||
  fail "early stop, resumed: $(grep -E 'early' es2.log)"
[ "$(code "$S" train base.yaml --set train.early_stop_patience=2 --set run.dir=runs/x)" = 2 ] &&
  grep -q "train.early_stop_patience 2 counts validations, and this run has none: it needs data.val (empty) and train.eval_every > 0 (it is 0)" out.txt ||
  fail "early stopping without validations should be refused: $(cat out.txt)"
pass "train.early_stop_patience: the run ends at step $es_stop of 60 (lowest validation at $es_best, kept as ckpt/best), as metrics.jsonl replays; a resume goes on counting; refused without validations"

# --- sharded, and a lone file (whose n_head comes from Strata's own metadata)
"$S" export runs/a/ckpt/step_00000003 --out hf_sharded --max-shard-size 8KB > /dev/null
n_shards=$(ls hf_sharded/model-*-of-*.safetensors | wc -l)
[ "$n_shards" -gt 2 ] && [ -s hf_sharded/model.safetensors.index.json ] && [ ! -e hf_sharded/model.safetensors ] ||
  fail "--max-shard-size 8KB should shard with an index: $(ls hf_sharded)"
"$S" train ft.yaml --set model.init_from=hf_sharded --set run.dir=runs/c > c.log
grep -q "in $n_shards files (sharded, with an index)" c.log || fail "sharded init_from: $(grep init c.log)"
[ "$(loss_at runs/c 1)" = "$ref" ] || fail "sharded directory: $(loss_at runs/c 1) vs $ref"
mkdir lone && "$S" export runs/a/ckpt/step_00000003 --out lone/w.safetensors > /dev/null
"$S" train ft.yaml --set model.init_from=lone/w.safetensors --set run.dir=runs/d > d.log
[ "$(loss_at runs/d 1)" = "$ref" ] || fail "lone .safetensors: $(loss_at runs/d 1) vs $ref"
"$S" export runs/a/ckpt/step_00000003 --out hf_sharded > /dev/null
[ -s hf_sharded/model.safetensors ] && ! ls hf_sharded/model-*-of-* > /dev/null 2>&1 &&
  [ ! -e hf_sharded/model.safetensors.index.json ] || fail "re-export unsharded should remove the old shards: $(ls hf_sharded)"
pass "a sharded directory ($n_shards files + index) and a lone .safetensors load alike; re-export leaves no stale index"

# --- resume wins over init_from
"$S" train ft.yaml --set run.dir=runs/a --set train.steps=5 --set model.init_from=hf_sharded --resume latest > e.log
grep -q "resumed from" e.log && ! grep -q "initialised from" e.log || fail "--resume should win over model.init_from"
pass "--resume wins over model.init_from"

# --- a NaN in the weights: refused as it is read, naming the tensor and the element (exit 1,
# as for a damaged checkpoint), before any step rather than as a diverged run
cp -r hf hf_nan
st=hf_nan/model.safetensors
hl=$(od -An -t u8 -N8 $st | tr -d ' ')
start=$(head -c $((8 + hl)) $st | tail -c $hl | grep -o '"transformer.h.1.mlp.c_fc.weight":{[^}]*}' |
        grep -o 'data_offsets":\[[0-9]*' | grep -o '[0-9]*$')
[ -n "$start" ] || fail "no transformer.h.1.mlp.c_fc.weight in the exported header"
printf '\x00\x00\xc0\x7f' | dd of=$st bs=1 seek=$((8 + hl + start + 4 * 100)) conv=notrunc 2> /dev/null # element 100: NaN
rc=$(code "$S" train ft.yaml --set model.init_from=hf_nan --set run.dir=runs/nan)
[ "$rc" = 1 ] || fail "NaN weights: exit $rc, expected 1: $(grep -v '^ ' out.txt | tail -3)"
grep -q 'loading model.init_from: .*hf_nan/model.safetensors: tensor "transformer.h.1.mlp.c_fc.weight" holds NaN at element 100 (row 0, column 100)' out.txt ||
  fail "NaN weights should be named where they are: $(grep -v '^ ' out.txt | tail -3)"
[ ! -s runs/nan/metrics.jsonl ] && ! grep -qi "learning rate" out.txt || fail "NaN weights were trained on: $(tail -3 out.txt)"
pass "a NaN in model.init_from's weights stops the run at load (exit 1), naming the tensor, element, row and column"

# --- refusals
[ "$(code "$S" train ft.yaml --set model.n_layer=3)" = 2 ] || fail "a disagreeing n_layer should exit 2"
grep -q "model.n_layer is 3, but model.init_from's hf/config.json has n_layer 2" out.txt || fail "message: $(cat out.txt)"
[ "$(code "$S" train ft.yaml --set model.seq_len=32)" = 2 ] && grep -q "has n_positions 16" out.txt ||
  fail "a disagreeing seq_len should exit 2 naming n_positions: $(cat out.txt)"
[ "$(code "$S" train ft.yaml --set model.init_from=nowhere)" = 2 ] && grep -q "'nowhere': no such file" out.txt ||
  fail "a missing init_from should exit 2: $(cat out.txt)"
mkdir empty && echo '{"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 16, "vocab_size": 256}' > empty/config.json
[ "$(code "$S" train ft.yaml --set model.init_from=empty --set run.dir=runs/x)" = 1 ] &&
  grep -q "found neither model.safetensors nor model.safetensors.index.json" out.txt || fail "no weights: $(cat out.txt)"
sed 's/"gelu_new"/"relu"/' hf/config.json > relu.json && mkdir relu && cp hf/model.safetensors relu/ && mv relu.json relu/config.json
[ "$(code "$S" train ft.yaml --set model.init_from=relu)" = 2 ] && grep -q '"activation_function" is "relu"' out.txt ||
  fail "an activation Strata does not compute: $(cat out.txt)"
[ "$(code "$S" prepare --tokenizer nowhere --text tiny.txt --out x)" = 2 ] && grep -q "tokenizer nowhere" out.txt ||
  fail "prepare with a missing tokenizer should exit 2: $(cat out.txt)"
[ "$(code "$S" train base.yaml --set model.vocab_size=200 --set run.dir=runs/x)" = 2 ] &&
  grep -q "data/tokenizer.json has 256 tokens, more than model.vocab_size 200" out.txt ||
  fail "a tokenizer larger than the vocabulary should exit 2: $(cat out.txt)"
[ "$(code "$S" export runs/a --out x --max-shard-size lots)" = 2 ] || fail "a bad --max-shard-size should exit 2"
[ "$(code "$S" export runs/a --out x.safetensors --max-shard-size 1GB)" = 2 ] || fail "--max-shard-size with a file should exit 2"
pass "disagreeing shapes, missing weights, unsupported config.json keys, tokenizers that do not fit and bad export options are refused by name"

# --- world 2, ZeRO stage 3: each rank reads only its shards; offloaded tiers too
if [ ${#MPI[@]} -eq 0 ]; then echo "mpirun not found: skipping the world-2 checks"; exit 0; fi
cat > base2.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 16, vocab_size: 256}
data: {train: "data/train_*.bin", val: "", shuffle: false}
train: {steps: 3, micro_batch: 1, eval_every: 0, sample_tokens: 0}
optim: {lr: 1.0e-2, warmup_steps: 0}
run: {dir: runs/a2, checkpoint_every: 3, keep: 0}
zero: {stage: 3}
YAML
"${MPI[@]}" -np 2 "$S" train base2.yaml > a2.log
"$S" export runs/a2 --out hf2 --max-shard-size 20KB > /dev/null
"${MPI[@]}" -np 2 "$S" train base2.yaml --set train.steps=4 --resume latest > a24.log
ref2=$(loss_at runs/a2 4)
mkdir -p swap
for off in none cpu nvme split; do
  extra=()
  [ $off != none ] && extra=(--set offload.optimizer=$off --set offload.params=$off --set "offload.nvme_path=$W/swap")
  # the optimizer state in three tiers (device, pinned, NVMe), the parameter shards on the device
  [ $off = split ] && extra=(--set offload.optimizer=nvme --set offload.optimizer_ratio=0.6 --set offload.nvme_ratio=0.5
                             --set "offload.nvme_path=$W/swap")
  "${MPI[@]}" -x STRATA_LOG=debug -np 2 "$S" train ft.yaml --set model.init_from=hf2 --set run.dir=runs/b2_$off \
    --set train.micro_batch=1 --set zero.stage=3 "${extra[@]}" > b2_$off.log 2>&1
  [ "$(loss_at runs/b2_$off 1)" = "$ref2" ] || fail "world 2 stage 3 offload $off: $(loss_at runs/b2_$off 1) vs $ref2"
  # each rank read its own shards only: together the whole model once, each about half
  # (the last rank's shard of a unit is short by the unit's padding)
  read -r r0 r1 total <<< "$(grep -o 'this rank read [0-9]* of the model.s [0-9]*' b2_$off.log |
                             awk '{r[NR]=$4; t=$8} END {print r[1], r[2], t}')"
  [ -n "$total" ] && [ $((r0 + r1)) -eq "$total" ] && [ $((10 * r0)) -lt $((6 * total)) ] &&
    [ $((10 * r1)) -lt $((6 * total)) ] || fail "offload $off: ranks read $r0 and $r1 of $total parameters"
done
pass "world 2, stage 3 (shards on the device, in pinned memory, on NVMe; the optimizer state split over all three): init_from gives the run's next loss bit for bit ($ref2); each rank read only its half ($r0 + $r1 = $total parameters)"

# --- validation before the first step at world 2, stage 3: the parameters gathered from
# their shards before any step; the same sequences as world 1's (B 1 on each of 2 ranks)
"${MPI[@]}" -np 2 "$S" train ft.yaml --set model.init_from=hfv --set data.train='vdata/train_*.bin' \
  --set data.val='vdata/val_*.bin' --set run.dir=runs/vw2 --set train.micro_batch=1 --set zero.stage=3 > vw2.log 2>&1
v2=$(val_at runs/vw2 0)
[ -n "$v2" ] && awk -v a="$v2" -v b="$vref" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6 * b)}' ||
  fail "world 2 stage 3: step 0's validation $v2 vs world 1's $vref"
pass "world 2, stage 3: the validation before the first step agrees with world 1 ($v2 vs $vref)"
