#!/usr/bin/env bash
# End to end: hostile and oversized inputs (issue 13) are refused with a message naming
# the thing and the documented exit code, before anything is allocated or written.
set -euo pipefail
S=${STRATA:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-hostile.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
# runs the command, with its exit code in $rc and stdout+stderr in $out
run() { set +e; out=$(timeout 60 "$@" 2>&1); rc=$?; set -e; }
expect() { # CODE TEXT WHAT
    [ "$rc" -eq "$1" ] || fail "$3: exit $rc, expected $1: $out"
    grep -qF -- "$2" <<<"$out" || fail "$3: message lacks '$2': $out"
    pass "$3"
}

cat "$STRATA_SOURCE_DIR"/core/*.h > corpus.txt
"$S" prepare --text corpus.txt --out data > /dev/null 2>&1
cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 256}
data: {train: "data/train_*.bin", val: "data/val_*.bin"}
train: {steps: 2, micro_batch: 2, eval_every: 0, log_every: 1, sample_tokens: 0}
run: {dir: runs/a, checkpoint_every: 2, keep: 0}
YAML

# --- 4: configs and other files read whole: only regular files, of a sane size
run "$S" train /dev/zero;                    expect 2 "/dev/zero: is a character device, not a regular file" "train /dev/zero"
printf 'base: /dev/zero\n' > base.yaml
run "$S" train base.yaml;                    expect 2 "base.yaml:1: key 'base': /dev/zero: is a character device" "base: /dev/zero"
mkfifo fifo.yaml
run "$S" plan fifo.yaml;                     expect 2 "fifo.yaml: is a FIFO, not a regular file" "a FIFO config"
head -c 1100000 /dev/zero | tr '\0' '#' > big.yaml
run "$S" config big.yaml;                    expect 2 "big.yaml: 1.05 MiB, more than the 1.00 MiB such a file may hold" "a 1 MiB+ config"
run "$S" config --from-deepspeed /dev/zero;  expect 2 "/dev/zero: is a character device" "DeepSpeed json /dev/zero"
run "$S" train tiny.yaml --set data.tokenizer=/dev/zero; expect 2 "/dev/zero" "data.tokenizer /dev/zero"
run "$S" prepare --text /dev/zero --out p;   expect 2 "--text: /dev/zero: is a character device" "prepare --text /dev/zero"
mkdir hf && ln -s /dev/zero hf/config.json && : > hf/model.safetensors
run "$S" train tiny.yaml --set model.init_from=hf; expect 2 "has no config.json" "init_from's config.json -> /dev/zero"
[ ! -d runs ] || fail "a refused input must not create the run directory"

# --- data.train naming a directory, a device or a FIFO: a config error, said so
run "$S" train tiny.yaml --set data.train=data; expect 2 "data: is a directory, not a token shard file" "data.train a directory"
run "$S" train tiny.yaml --set data.train=/dev/zero; expect 2 "/dev/zero: is a character device, not a token shard file" "data.train a device"
mkfifo shard.fifo
run "$S" train tiny.yaml --set data.val=shard.fifo; expect 2 "shard.fifo: is a FIFO, not a token shard file" "data.val a FIFO"

# --- 8: offload.nvme_path missing, or a regular file: config errors naming key and path
touch afile
for cmd in train plan; do
    run "$S" $cmd tiny.yaml --set offload.optimizer=nvme --set offload.nvme_path=missing-dir
    expect 2 "key 'offload.nvme_path': 'missing-dir': No such file or directory" "$cmd: nvme_path missing"
    run "$S" $cmd tiny.yaml --set offload.optimizer=nvme --set offload.nvme_path=afile
    expect 2 "key 'offload.nvme_path': 'afile' is not a directory" "$cmd: nvme_path a regular file"
done

# --- 7: a batch far beyond the machine is a plan verdict (exit 3), never an allocation
BIG=(--set model.seq_len=1048576 --set train.seq_len=1048576 --set train.micro_batch=8192)
for extra in "" "--gpu-gb 80"; do
    run "$S" plan tiny.yaml "${BIG[@]}" $extra
    expect 3 "verdict: DOES NOT FIT" "plan 1048576 x 8192 $extra: exit 3 with the table"
    grep -q "^  host " <<<"$out" || fail "the host batch buffers belong to the plan: $out"
done
run "$S" train tiny.yaml "${BIG[@]}";        expect 3 "verdict: DOES NOT FIT" "train 1048576 x 8192: exit 3 with the table"
run "$S" train tiny.yaml "${BIG[@]}" --set memory.gpu_gb=80 --set device=auto
expect 3 "verdict: DOES NOT FIT" "train 1048576 x 8192 on an 80 GB budget"

# --- a checkpoint to sample from and to edit
"$S" train tiny.yaml > a.log 2>&1 || fail "training the tiny model: $(tail -3 a.log)"
ck=runs/a/ckpt/step_00000002
head -1 $ck/manifest.yaml | grep -q '^manifest_crc32c: 0x[0-9a-f]\{8\}$' || fail "no checksum line: $(head -1 $ck/manifest.yaml)"

# --- 6: --tokens is bounded, and tokens stream out as they are made
run "$S" sample runs/a --tokens 1048577;     expect 2 "--tokens 1048577 is more than the 1048576" "sample --tokens over the limit"
run "$S" sample runs/a --tokens 1000000000;  expect 2 "more than the 1048576" "sample --tokens 1000000000"
run "$S" sample runs/a --weights sometimes;  expect 2 "--weights expects auto, device or host, got 'sometimes'" "sample --weights unknown"
run "$S" sample runs/a --device tpu;         expect 2 "--device expects cpu or cuda, got 'tpu'" "sample --device unknown"
run "$S" sample runs/a --context 0;          expect 2 "--context expects a number of tokens from 1 to 1048576, got '0'" "sample --context 0"
run "$S" sample runs/a --context 100000;     expect 2 "--context 100000 is more than the model's context" "sample --context past the model's"
run "$S" sample runs/a --context 8 --tokens 30; expect 0 "activations" "sample --context 8"
grep -q "for up to 8 tokens" <<<"$out" || fail "sample --context 8 should plan a window of 8: $out"
if ! nvidia-smi > /dev/null 2>&1; then
  run "$S" sample runs/a --device cuda;      expect 1 "(--device cpu samples on the CPU)" "sample --device cuda without a GPU"
fi
# the first bytes arrive while generation goes on: head closes the pipe after 64 of a
# million tokens, which only ends the run early if they were written as made
set +e; timeout 60 "$S" sample runs/a --tokens 1048576 --temperature 0 | head -c 64 > first.txt; rcs=("${PIPESTATUS[@]}"); set -e
[ "${rcs[0]}" -ne 124 ] || fail "sample of 1048576 tokens printed nothing before the end"
[ "$(wc -c < first.txt)" -eq 64 ] || fail "streamed output: $(wc -c < first.txt) bytes"
pass "sample streams: 64 bytes of 1048576 tokens arrive at once (exit ${rcs[0]} when the pipe closes)"
run /usr/bin/env time -f "maxrss %M" "$S" sample runs/a --tokens 2000 --temperature 0
rss_small=$(grep -o 'maxrss [0-9]*' <<<"$out" | cut -d' ' -f2)
run /usr/bin/env time -f "maxrss %M" "$S" sample runs/a --tokens 40000 --temperature 0
rss_large=$(grep -o 'maxrss [0-9]*' <<<"$out" | cut -d' ' -f2)
[ -n "$rss_small" ] && [ -n "$rss_large" ] || fail "no maxrss from time(1): $out"
[ "$rss_large" -lt $((rss_small + 1024)) ] || fail "memory grows with --tokens: $rss_small KiB for 2000, $rss_large KiB for 20000"
pass "sample memory does not grow with --tokens ($rss_small KiB at 2000, $rss_large KiB at 20000)"

# --- 5: prompt bytes beyond vocab_size are refused, naming byte and position
tr -cd '\11\12\40-\176' < corpus.txt > ascii.txt
"$S" prepare --text ascii.txt --out d128 > /dev/null 2>&1 && rm d128/tokenizer.json
"$S" train tiny.yaml --set model.vocab_size=128 --set data.train='d128/train_*.bin' --set data.val='d128/val_*.bin' \
    --set run.dir=runs/v128 > v.log 2>&1 || fail "training the 128-token model: $(tail -3 v.log)"
run "$S" sample runs/v128 --prompt "ab$(printf '\xc3\xa9')" --tokens 4
expect 2 "--prompt: byte 0xc3 at byte 2 is outside the model's vocabulary of 128" "sample prompt byte beyond vocab_size"
# ... and shard tokens beyond it stop the run (exit 1) naming the shard and position
{ printf 'caf\xc3\xa9 '; cat ascii.txt; } > high.txt # byte 0xc3 at position 3 of the first sequence
"$S" prepare --text high.txt --out bytes > /dev/null 2>&1 && rm bytes/tokenizer.json # else the tokenizer is refused first
run "$S" train tiny.yaml --set model.vocab_size=128 --set data.train='bytes/train_*.bin' --set data.val= --set data.shuffle=false --set run.dir=runs/v128b
expect 1 "train_000000.bin: token 195 at position 3 is >= vocab_size 128" "shard token beyond vocab_size"

# --- the manifest's checksum: an edited step is refused (exit 2), naming the file
cp -r $ck edited && sed -i 's/^step: 2$/step: 1/' edited/manifest.yaml
run "$S" sample edited --tokens 2;           expect 2 "edited/manifest.yaml: checksum mismatch" "sample: edited manifest"
run "$S" train tiny.yaml --set run.dir=runs/r --resume "$PWD/edited"
expect 2 "the manifest was edited or corrupted; refusing it" "train --resume: edited manifest"
# one written before checksums (the line removed) still loads, with a warning
cp -r $ck old && sed -i 1d old/manifest.yaml
run "$S" sample old --tokens 2;              expect 0 "has no checksum (written by an older Strata): loading it unverified" "old manifest loads, unverified"
