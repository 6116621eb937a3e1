#!/usr/bin/env bash
# bench/bench_gpu.sh and bench/bench_gpu.py without a GPU: both scripts parse; the table
# (MFU from Strata's FLOP count, the ratio to torch.compile, failed and skipped rows) from
# fixed rows; bad settings exit 2; then, with launcher/python-env.sh's torch, the whole
# script on the CPU with a tiny model (BENCH_TINY=1): Strata's and PyTorch's rows and the
# kernel profile under the table. Exits 77 (skip) without torch, after the rest.
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
W=$(mktemp -d /tmp/strata-e2e-bench-gpu.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
command -v python3 > /dev/null || { echo "SKIP: no python3"; exit 77; }

bash -n "$SRC/bench/bench_gpu.sh" && bash -n "$SRC/bench/gpu-check.sh" || fail "a script does not parse"
pass "bench_gpu.sh and gpu-check.sh parse"

# 124M: 6 (12 L C^2 + V C) + 12 L C T = 854,438,400 FLOPs per token (L 12, C 768, V 50257, T 1024)
cat > rows.jsonl <<'JSON'
{"run": "Strata stage 0", "size": "124m", "layers": 12, "channels": 768, "vocab": 50257, "seq": 1024, "batch": 16, "tok_s": 460000, "ms_step": 35.6, "peak_alloc_bytes": 8589934592, "device_used_bytes": 9663676416}
{"run": "PyTorch nanoGPT torch.compile", "impl": "nanogpt", "compile": true, "size": "124m", "layers": 12, "channels": 768, "vocab": 50257, "seq": 1024, "batch": 16, "tok_s": 400000, "ms_step": 41.0, "peak_reserved_bytes": 9019431321}
{"run": "PyTorch HF GPT2LMHeadModel sdpa eager", "size": "124m", "error": "exit 1 (Traceback)"}
{"run": "Strata stage 0", "size": "1.5b", "layers": 48, "channels": 1600, "vocab": 50257, "seq": 1024, "batch": 8, "tok_s": 40000, "ms_step": 204.8, "peak_alloc_bytes": 1073741824}
JSON
python3 "$SRC/bench/bench_gpu.py" render --rows rows.jsonl --peak 989 > table.md
grep -qF "| Strata stage 0 | 460,000 | 35.6 | 393.0 | 39.7% | 8.00 / 9.00 | 1.15x |" table.md || fail "Strata's row: $(cat table.md)"
grep -qF "| PyTorch nanoGPT torch.compile | 400,000 | 41.0 | 341.8 | 34.6% | 8.40 / - | 1.00x |" table.md || fail "compile's row: $(cat table.md)"
grep -qF "| PyTorch HF GPT2LMHeadModel sdpa eager | failed: exit 1 (Traceback) |" table.md || fail "a failed row: $(cat table.md)"
grep -qF "GPT-2 1.5b: 48 layers, 1600 channels, B=8, T=1024, bf16; MFU against 989 TFLOP/s" table.md || fail "1.5b's heading"
grep -F "| Strata stage 0 | 40,000 |" table.md > row15.md && grep -qF "| - |" row15.md || fail "no compile row at 1.5b: the ratio must be -"
PEAK_TFLOPS=756 python3 "$SRC/bench/bench_gpu.py" render --rows rows.jsonl > table756.md
grep -qF "MFU against 756 TFLOP/s" table756.md || fail "PEAK_TFLOPS"
pass "the table: MFU from Strata's FLOP count, the ratio to torch.compile, failed rows"

set +e
out=$(STRATA="$S" OUT="$W/o1" BENCH_TINY=1 BENCH_ROWS="strata0 fast" bash "$SRC/bench/bench_gpu.sh" 2>&1); rc=$?
set -e
[ $rc -eq 2 ] && grep -q "BENCH_ROWS: unknown row 'fast'" <<<"$out" || fail "an unknown row: exit $rc: $out"
set +e
out=$(STRATA="$W/none" OUT="$W/o2" bash "$SRC/bench/bench_gpu.sh" 2>&1); rc=$?
set -e
[ $rc -eq 2 ] && grep -q "no strata binary at $W/none" <<<"$out" || fail "a missing binary: exit $rc: $out"
pass "bad settings exit 2, naming them"

PY=$("$SRC/launcher/python-env.sh")
[ -n "$PY" ] || { echo "SKIP: no Python with torch (launcher/python-env.sh): the tiny run on the CPU"; exit 77; }
STRATA="$S" OUT="$W/out" PYTHON="$PY" BENCH_TINY=1 BENCH_ROWS="strata0 eager strata0-tc-ckpt strata0-tc-chunk" bash "$SRC/bench/bench_gpu.sh" > tiny.log 2>&1 ||
  fail "BENCH_TINY=1: $(tail -5 tiny.log)"
md=$W/out/bench_gpu.md
grep -q "^| Strata stage 0 | [0-9,]* |" "$md" || fail "no Strata row: $(cat "$md")"
grep -q "^| PyTorch nanoGPT eager | [0-9,]* |" "$md" || fail "no PyTorch row: $(cat "$md")"
grep -q "^| Strata stage 0, STRATA_ATTENTION=tc (activation checkpointing: blocks) | [0-9,]* |" "$md" ||
  fail "no checkpointed Strata row: $(cat "$md")"
grep -q "^| Strata stage 0, STRATA_ATTENTION=tc, logits in 256 MiB chunks | [0-9,]* |" "$md" ||
  fail "no Strata row with the head in chunks: $(cat "$md")"
[ "$(wc -l < "$W/out/bench_gpu.rows.jsonl")" -eq 4 ] || fail "4 rows expected in bench_gpu.rows.jsonl"
grep -q "^  forward    layernorm                    5 " "$md" || fail "no kernel profile (layernorm forward 2 x 2 + 1): $(tail -30 "$md")"
pass "BENCH_TINY=1: Strata's rows (one with checkpointing, one with the head in chunks) and PyTorch's on the CPU, and the kernel profile under them"
