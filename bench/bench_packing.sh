#!/usr/bin/env bash
# bench/bench_packing.sh: what `strata prepare --jsonl --pack best-fit` saves over packing in
# order, as a markdown table (docs/benchmarks.md, "Packing fine-tuning data"): conversations
# made from tiny shakespeare (a user's line, then an assistant's reply of several lines) in
# Llama 3's chat format, with a Llama 3-style byte-level BPE the tests build offline
# (tests/tokenizers_reference.py); two length mixes: replies of 2-6 lines (short, alike) and
# replies of a log-normal number of lines (median 20, a long tail, as real chat data has);
# at --seq-len 2048 and 8192. For each: the train sequences (the steps an epoch takes) and
# the share of padding. Needs a Python with `tokenizers` (launcher/python-env.sh).
# Usage: [STRATA=build/strata] [CORPUS=../shared/data/tinyshakespeare.txt] bench/bench_packing.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=$(realpath "${STRATA:-$ROOT/build/strata}")
CORPUS=$(realpath "${CORPUS:-$ROOT/../shared/data/tinyshakespeare.txt}")
PY=$("$ROOT/launcher/python-env.sh" --has tokenizers)
[ -n "$PY" ] || { echo "needs a Python with tokenizers (launcher/python-env.sh --install)" >&2; exit 1; }
W=$(mktemp -d /tmp/strata-bench-packing.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
"$PY" - "$ROOT/tests" "$CORPUS" <<'PY'
import json, random, sys
sys.path.insert(0, sys.argv[1])
import tokenizers_reference as tref
tref.make_llama3(sys.argv[2], "tk")
lines = [l.strip() for l in open(sys.argv[2], encoding="utf-8") if l.strip()]
for name, reply in (("alike", lambda r: r.randint(2, 6)), ("long-tail", lambda r: max(1, int(r.lognormvariate(3.0, 1.0))))):
    r, i = random.Random(1), 0
    with open(name + ".jsonl", "w") as f:
        while i < 3 * len(lines):
            n, j = reply(r), i % len(lines)
            conv = [{"role": "user", "content": lines[j]},
                    {"role": "assistant", "content": " ".join(lines[(j + 1) % len(lines):(j + 1) % len(lines) + n])}]
            f.write(json.dumps({"messages": conv}) + "\n")
            i += n + 1
PY
echo "| conversations | --seq-len | best-fit: sequences | padding | in-order: sequences | padding | steps saved |"
echo "|---|---|---|---|---|---|---|"
for mix in alike long-tail; do
  for T in 2048 8192; do
    row="| $mix ($(wc -l < $mix.jsonl)) | $T"
    declare -A seqs
    for p in best-fit in-order; do
      line=$("$S" prepare --jsonl $mix.jsonl --tokenizer tk --messages-field messages --chat-format llama3 --seq-len $T \
        --val-fraction 0 --pack $p --out d-$p 2>/dev/null | tail -1)
      seqs[$p]=$(echo "$line" | grep -o 'into [0-9]* train' | cut -d' ' -f2)
      row="$row | ${seqs[$p]} | $(echo "$line" | grep -o 'padding [0-9.]*%' | cut -d' ' -f2)"
    done
    echo "$row | $(awk -v a="${seqs[best-fit]}" -v b="${seqs[in-order]}" 'BEGIN {printf "%.1f%%", 100 * (b - a) / b}') |"
  done
done
