#!/usr/bin/env bash
# `strata export` and `strata dump-grads`: their command-line failures, atomic output, and
# (tests/torch_reference.py) logits, loss and every gradient against Hugging Face
# transformers' GPT2LMHeadModel, loading `strata export --out DIR` with from_pretrained as it
# is. The Python is launcher/python-env.sh's (launcher/test.sh installs it); exits 77 (skip)
# when there is none, after the checks that need neither. STRATA_TORCH_124M=1 also runs the GPT-2 124M shape
# (about 2 minutes and 3 GB of disk on 2 cores).
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-torch.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
command -v python3 > /dev/null || { echo "SKIP: no python3"; exit 77; }

# --- a checkpoint to export
cat "$SRC"/core/*.c > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null
cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 256}
data: {train: "data/train_*.bin", val: ""}
train: {steps: 2, micro_batch: 2, sample_tokens: 0, eval_every: 0}
run: {dir: run}
YAML
"$S" train tiny.yaml > train.log

# --- command-line failures exit 2 and say why
code() { set +e; "$@" > out.txt 2>&1; echo $?; set -e; }
[ "$(code "$S" export run)" = 2 ] || fail "export without --out should exit 2"
grep -q "usage: strata export" out.txt || fail "export usage: $(cat out.txt)"
[ "$(code "$S" export nowhere --out x.safetensors)" = 2 ] || fail "export of a missing checkpoint should exit 2"
grep -q "nowhere" out.txt || fail "message should name the checkpoint: $(cat out.txt)"
[ "$(code "$S" dump-grads run --out g.safetensors)" = 2 ] || fail "dump-grads without --data should exit 2"
[ "$(code "$S" dump-grads run --data 'data/train_*.bin' --out g.safetensors --batch 0)" = 2 ] ||
    fail "--batch 0 should exit 2"
[ "$(code "$S" dump-grads run --data 'data/train_*.bin' --out g.safetensors --seq 17)" = 2 ] ||
    fail "--seq beyond model.seq_len should exit 2"
grep -q "train.seq_len (17)" out.txt || fail "message should name train.seq_len: $(cat out.txt)"
[ "$(code "$S" dump-grads run --data 'nodata/*.bin' --out g.safetensors)" = 1 ] || fail "missing data should exit 1"
grep -q "nodata" out.txt || fail "message should name the data glob: $(cat out.txt)"
[ ! -e g.safetensors ] || fail "a failed dump-grads must not leave a file"
pass "bad command lines exit 2 (1 for missing data) naming the problem"

# --- output is atomic: a failed export leaves the previous file and no temporary
"$S" export run --out w.safetensors > /dev/null
cp w.safetensors w.orig
[ "$(code "$S" export run --out missing-dir/w.safetensors)" = 1 ] || fail "unwritable --out should exit 1"
grep -q "missing-dir/w.safetensors" out.txt || fail "message should name the file: $(cat out.txt)"
ck=$(cat run/ckpt/latest)
ck=${ck##*/}
cp -r "run/ckpt/$ck" bad
python3 - bad/rank00000.bin <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(100)
    b = f.read(1)
    f.seek(100)
    f.write(bytes([b[0] ^ 0x40]))
PY
[ "$(code "$S" export bad --out w.safetensors)" = 1 ] || fail "export of a corrupt checkpoint should exit 1"
grep -q "checksum mismatch" out.txt || fail "message should report the checksum: $(cat out.txt)"
cmp -s w.safetensors w.orig || fail "a failed export changed the existing file"
! ls w.safetensors.tmp.* > /dev/null 2>&1 || fail "a failed export left a temporary file"
pass "export is atomic: failures keep the old file and leave no temporary"

# --- the comparison with PyTorch (77 when torch/transformers are missing)
# (without one, python3 runs the structural checks and the script exits 77)
PY=$("$SRC/launcher/python-env.sh")
PY=${PY:-python3}
set +e
"$PY" "$SRC/tests/torch_reference.py" --strata "$S" --workdir "$W/tiny"
rc=$?
set -e
[ $rc -eq 0 ] || exit $rc
if [ "${STRATA_TORCH_124M:-0}" = 1 ]; then
    "$PY" "$SRC/tests/torch_reference.py" --strata "$S" --workdir "$W/gpt2" --gpt2-124m-shape
fi
pass "strata matches transformers"
