#!/usr/bin/env bash
# bench/bench_prepare.sh: how fast `strata prepare` turns conversations (--jsonl) and plain
# text (--text) into shards, on 1, 2, 4 ... threads up to the CPUs here, as a markdown table
# (docs/benchmarks.md, "Preparing data on every core"): MB of input a second, and the
# speed-up over one thread. The conversations are made from tiny shakespeare (a user's
# line, then a reply of a log-normal number of lines, as bench/bench_packing.sh makes
# them), to about MB megabytes; the text is tiny shakespeare repeated to about MB megabytes,
# one file. The tokenizers are the Llama 3- and Qwen2-style byte-level BPEs the tests
# build offline (tests/tokenizers_reference.py: 3000 merges, so more merging than the real
# ones' 128k-150k vocabularies need). Beside them, as the peer: Hugging Face `tokenizers`
# (Rust, its own thread pool) encoding the same conversations rendered in the chat
# template with encode_batch; it reads no JSON and packs nothing. Each thread count's
# shards are checked to be one thread's, byte for byte.
# Usage: [STRATA=build/strata] [CORPUS=../shared/data/tinyshakespeare.txt] [MB=40] bench/bench_prepare.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
S=$(realpath "${STRATA:-$ROOT/build/strata}")
CORPUS=$(realpath "${CORPUS:-$ROOT/../shared/data/tinyshakespeare.txt}")
MB=${MB:-40}
PY=$("$ROOT/launcher/python-env.sh" --has tokenizers)
[ -n "$PY" ] || { echo "needs a Python with tokenizers (launcher/python-env.sh --install)" >&2; exit 1; }
W=$(mktemp -d /tmp/strata-bench-prepare.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
"$PY" - "$ROOT/tests" "$CORPUS" "$MB" <<'PY'
import json, random, sys
sys.path.insert(0, sys.argv[1])
import tokenizers_reference as tref
tref.make_llama3(sys.argv[2], "llama3")
tref.make_qwen2(sys.argv[2], "qwen2")
want = int(sys.argv[3]) << 20
lines = [l.strip() for l in open(sys.argv[2], encoding="utf-8") if l.strip()]
r, size = random.Random(1), 0
with open("chat.jsonl", "w") as f:
    while size < want:
        i = 0
        while i < len(lines):
            n = max(1, int(r.lognormvariate(3.0, 1.0)))
            conv = [{"role": "user", "content": lines[i]},
                    {"role": "assistant", "content": " ".join(lines[i + 1:i + 1 + n])}]
            size += f.write(json.dumps({"messages": conv}) + "\n")
            i += n + 1
text = open(sys.argv[2], encoding="utf-8").read()
with open("corpus.txt", "w", encoding="utf-8") as f:
    f.write(text * max(1, want // len(text.encode())))
PY
mb() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
jsonl_bytes=$(stat -c %s chat.jsonl)
text_bytes=$(stat -c %s corpus.txt)
cpus=$(nproc)
threads="1"
for t in 2 4 8 16 32 64; do [ "$t" -le "$cpus" ] && threads="$threads $t"; done
[[ " $threads " == *" $cpus "* ]] || threads="$threads $cpus"
echo "$(mb "$jsonl_bytes") MB of JSONL ($(wc -l < chat.jsonl) conversations), $(mb "$text_bytes") MB of text, $cpus CPUs"
echo
echo "| input | tokenizer | threads | seconds | MB/s | speed-up |"
echo "|---|---|---|---|---|---|"
for tk in llama3 qwen2; do
  fmt=$([ $tk = llama3 ] && echo llama3 || echo chatml)
  for input in jsonl text; do
    one=
    size=$([ $input = jsonl ] && echo "$jsonl_bytes" || echo "$text_bytes")
    for t in $threads; do
      start=$(date +%s.%N)
      if [ $input = jsonl ]; then
        "$S" prepare --jsonl chat.jsonl --tokenizer $tk --messages-field messages --chat-format $fmt --seq-len 2048 \
          --threads "$t" --out "d$t" > /dev/null 2>&1
      else
        "$S" prepare --text corpus.txt --tokenizer $tk --threads "$t" --out "d$t" > /dev/null 2>&1
      fi
      secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.2f", b - a}')
      [ -n "$one" ] || one=$secs
      for f in d1/*.bin; do cmp -s "$f" "d$t/$(basename "$f")" || { echo "$t threads: $f differs" >&2; exit 1; }; done
      echo "| $input | $tk | $t | $secs | $(awk -v b="$size" -v s="$secs" 'BEGIN {printf "%.1f", b / 1048576 / s}') |" \
           "$(awk -v a="$one" -v s="$secs" 'BEGIN {printf "%.2fx", a / s}') |"
    done
    rm -rf d*
  done
  "$PY" - "$tk" "$fmt" "$jsonl_bytes" <<'PY'
import json, sys, time
from tokenizers import Tokenizer
tk, fmt, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = Tokenizer.from_file(tk + "/tokenizer.json")
def render(conv):
    if fmt == "llama3":
        return "<|begin_of_text|>" + "".join("<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>" % (
            m["role"], m["content"].strip()) for m in conv)
    return "".join("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"]) for m in conv)
texts = [render(json.loads(line)["messages"]) for line in open("chat.jsonl", encoding="utf-8")]
start = time.perf_counter()
tok.encode_batch(texts, add_special_tokens=False)
secs = time.perf_counter() - start
print("| jsonl, rendered: tokenizers encode_batch (no JSON, no packing) | %s | all | %.2f | %.1f | |" % (
    tk, secs, size / 1048576 / secs))
PY
done
