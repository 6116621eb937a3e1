#!/usr/bin/env bash
# Fine-tuning data from JSONL, end to end:
#  - tests/jsonl_reference.py: `strata prepare --jsonl` (prompt/response, Llama 3's and
#    ChatML's chat formats, plain text; --overflow split and drop; --skip-bad; 1 to 4
#    --threads) gives the ids and loss masks of a Python reference that applies the same
#    templates with `tokenizers`, and names every bad line (file, line, field) with exit 2;
#  - a Llama-family model with Llama 3's 128256-token vocabulary trains on the conversations
#    (32-bit masked shards): world 1 with the global batch in one micro-batch, world 2
#    (mpirun, when there is one) and accumulation 4 (both from train.global_batch 4 of
#    micro-batches of 1) give the same losses and validation
#    losses within 1e-6 relative and the same learned-token counts (metrics.jsonl), fewer
#    than the step's tokens;
#  - `strata sample --chat` writes the prompt in the run's chat format and generates after
#    it; `strata export` ships the chat template, so transformers' apply_chat_template gives
#    the ids the run trained on, and AutoModelForCausalLM loads the model; with
#    --system-prompt the template holds the default system message where prepare put it,
#    and sample --chat starts with it;
#  - the conversations packed into a sequence are kept apart (data.document_mask): the
#    logits and loss `strata dump-grads` computes over packed rows are transformers' over
#    each conversation alone, and differ from its over the rows whole;
#  - train.epochs takes the steps from the data, optim.warmup_ratio the warmup from them;
#  - a vocabulary past 65536 on llm.c's uint16 shards, and a train.seq_len other than the
#    --seq-len the examples were packed to, are refused at start (exit 2).
# Needs `tokenizers` (transformers and torch for the export checks, which are skipped
# without them, saying so): the Python is $STRATA_PYTHON, else launcher/python-env.sh's
# venv, else python3; exits 77 (skip), saying why, without it or without the corpus.
# STRATA_E2E_DEVICE=cuda (bench/gpu-check.sh's finetune part) trains and dumps on the GPU in
# bf16: one rank (several share no GPU here), bf16's tolerances; STRATA_E2E_CORPUS names
# another text for the tokenizers (the GPU machine has no tiny shakespeare).
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
DEV=${STRATA_E2E_DEVICE:-cpu}
corpus=${STRATA_E2E_CORPUS:-"$SRC/../shared/data/tinyshakespeare.txt"}
[ -f "$corpus" ] || { echo "SKIP: no $corpus (tiny shakespeare)"; exit 77; }
# relative agreement of two runs' losses, and of the logits against transformers (of max |logit|)
if [ "$DEV" = cpu ]; then TOL_RUNS=1e-6 TOL_LOGITS=1e-4 TOL_LOSS=1e-5; else TOL_RUNS=2e-2 TOL_LOGITS=3e-2 TOL_LOSS=2e-2; fi
PY=$("$SRC/launcher/python-env.sh" --has tokenizers)
[ -n "$PY" ] || { echo "SKIP: no Python with tokenizers (set STRATA_PYTHON, or launcher/python-env.sh --install)"; exit 77; }
W=$(mktemp -d /tmp/strata-e2e-jsonl.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
code() { set +e; "$@" > out.txt 2>&1; echo $?; set -e; }

"$PY" "$SRC/tests/jsonl_reference.py" --strata "$S" --workdir "$W/ref" --corpus "$corpus"
cd "$W"
data=ref/messages-llama3_split
tok=ref/llama3

# --- training on masked conversations: world 1, world 2, accumulation 4 agree
cat > chat.yaml <<YAML
device: $DEV
model: {arch: llama, n_layer: 1, n_head: 2, n_kv_head: 1, n_embd: 32, intermediate_size: 64, seq_len: 64,
        vocab_size: 128256, tie_embeddings: true}
data: {train: "$data/train_*.bin", val: "$data/val_*.bin", shuffle: false}
train: {steps: 2, micro_batch: 4, eval_every: 1, eval_batches: 1, log_every: 1, sample_tokens: 0}
optim: {lr: 1.0e-3, warmup_steps: 0}
run: {dir: runs/w1, checkpoint_every: 2, keep: 0}
YAML
field() { grep "\"step\": $2," "$1/metrics.jsonl" | grep -o "\"$3\": [^,}]*" | cut -d' ' -f2; }
"$S" train chat.yaml > w1.log 2>&1 || { tail -20 w1.log; fail "train at world 1"; }
# accumulation from train.global_batch: 4 sequences a step of micro-batches of 1 (accumulation 4
# here, 2 at world 2 below)
"$S" train chat.yaml --set run.dir=runs/a4 --set train.micro_batch=1 --set train.global_batch=4 --set train.eval_batches=4 \
  > a4.log 2>&1 ||
  { tail -20 a4.log; fail "train with accumulation 4"; }
grep -q "batch: 1 x 64 tokens x 4 accumulation x 1 ranks" a4.log || fail "global_batch 4 of 1 at world 1: $(grep 'batch:' a4.log)"
runs="runs/a4"
if command -v mpirun > /dev/null && [ "$DEV" = cpu ]; then
  MPI=(mpirun -np 2 --oversubscribe -x OMP_NUM_THREADS=1)
  [ "$(id -u)" -eq 0 ] && MPI+=(--allow-run-as-root)
  "${MPI[@]}" "$S" train chat.yaml --set run.dir=runs/w2 --set train.micro_batch=1 --set train.global_batch=4 \
    --set train.eval_batches=2 > w2.log 2>&1 || { tail -20 w2.log; fail "train at world 2"; }
  grep -q "batch: 1 x 64 tokens x 2 accumulation x 2 ranks" w2.log || fail "global_batch 4 of 1 at world 2: $(grep 'batch:' w2.log)"
  runs="runs/a4 runs/w2"
fi
for r in $runs; do
  for step in 1 2; do
    for f in loss val_loss; do
      a=$(field runs/w1 $step $f)
      b=$(field "$r" $step $f)
      "$PY" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > $TOL_RUNS * abs(a))" "$a" "$b" ||
        fail "$r step $step $f $b differs from world 1's $a by more than $TOL_RUNS relative"
    done
    [ "$(field runs/w1 $step learned_tokens)" = "$(field "$r" $step learned_tokens)" ] ||
      fail "$r step $step: learned_tokens $(field "$r" $step learned_tokens) vs $(field runs/w1 $step learned_tokens)"
  done
done
[ "$(code "$S" train chat.yaml --set train.seq_len=32 --set run.dir=runs/t32)" = 2 ] &&
  grep -q "hold examples packed into sequences of 64 tokens (strata prepare --jsonl --seq-len 64), but the run reads sequences of 32" out.txt &&
  [ ! -e runs/t32/metrics.jsonl ] || fail "train.seq_len 32 on shards packed to 64 should exit 2 naming both: $(cat out.txt)"
pass "train.seq_len 32 on shards packed to 64: refused at start (exit 2), naming both lengths"
learned=$(field runs/w1 1 learned_tokens)
[ "$learned" -gt 0 ] && [ "$learned" -lt 256 ] || fail "step 1 learned $learned of 256 tokens"
pass "losses and validation losses of world 1, ${runs// / and } agree within $TOL_RUNS ($DEV); $learned of 256 tokens learned in step 1"
# strata eval of the last checkpoint on the run's data.val (its micro-batch, one batch, as the run
# validated): the masked mean over the packed conversations, each kept apart, the run's val_loss
ev=$("$S" eval runs/w1 --batches 1 --json 2> ev.err) || fail "eval: $(cat ev.err)"
ev_loss=$(grep -o '"loss": [^,]*' <<<"$ev" | cut -d' ' -f2)
"$PY" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(a != b if '$DEV' == 'cpu' else abs(a - b) > $TOL_RUNS * abs(a))" \
  "$(field runs/w1 2 val_loss)" "$ev_loss" && grep -q '"learned_tokens": [1-9]' <<<"$ev" && ! grep -q '"learned_tokens": 256' <<<"$ev" ||
  fail "eval of runs/w1: $ev; the run's last validation: $(field runs/w1 2 val_loss)"
pass "eval of fine-tuning data (masked, packed, kept apart): the run's validation loss ($ev_loss, $DEV)"

# --- train.epochs: passes over the conversations decide the steps (rounded up), and a resume agrees
"$S" train chat.yaml --set run.dir=runs/ep --set train.epochs=4 --set train.eval_every=0 --set optim.warmup_ratio=0.5 \
  > ep.log 2>&1 || { tail -20 ep.log; fail "train with train.epochs 4"; }
n=$(grep -o 'over the [0-9]* of data.train' ep.log | grep -o '[0-9]*' || true)
steps=$(grep -o 'train.epochs 4: [0-9]* steps of 4 sequences' ep.log | cut -d' ' -f3 || true)
[ -n "$n" ] && [ "$steps" = $(( (4 * n + 3) / 4 )) ] && [ "$(wc -l < runs/ep/metrics.jsonl)" = "$steps" ] &&
  grep -q "the train.steps given is not used" ep.log || fail "train.epochs 4 over $n sequences: $(grep epochs ep.log)"
"$S" train chat.yaml --set run.dir=runs/ep --set train.epochs=4 --resume latest > ep2.log 2>&1 &&
  grep -q "run already at step $steps of $steps" ep2.log || fail "resume of the train.epochs run: $(tail -3 ep2.log)"
warm=$(( (steps + 1) / 2 )) # round(0.5 x steps)
grep -q "optim.warmup_ratio 0.5: $warm warmup steps of $steps" ep.log &&
  grep -q '"lr": 0.0005,' <(grep '"step": 1,' runs/ep/metrics.jsonl) ||
  fail "warmup_ratio 0.5 of $steps steps should be $warm (lr 5e-4 at step 1 of a 2-step warmup to 1e-3): $(grep warmup ep.log); $(grep -o '"lr": [^,]*' runs/ep/metrics.jsonl | head -2)"
pass "train.epochs 4 over $n sequences of 4 a step: $steps steps, optim.warmup_ratio 0.5 of them $warm; its resume finds it done"

# --- sample in the chat format, and the export's chat template
"$S" sample runs/w1 --chat --prompt "  Hi there " --tokens 3 --temperature 0 > sample.txt 2> sample.err ||
  { cat sample.err; fail "sample --chat"; }
"$PY" - sample.txt <<'PY' || fail "sample --chat output: $(cat sample.txt)"
import sys
text = open(sys.argv[1], encoding="utf-8").read()
want = "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
sys.exit(not text.startswith(want))
PY
pass "sample --chat: the prompt as a user's turn in Llama 3's format (trimmed), special tokens as text, then the reply"
# a run on data prepared with --system-prompt: sample --chat starts with the default system turn
"$S" train chat.yaml --set run.dir=runs/sys --set data.train='ref/system_llama3/train_*.bin' --set data.val= \
  --set train.steps=1 > sys.log 2>&1 || { tail -20 sys.log; fail "train on --system-prompt data"; }
"$S" sample runs/sys --chat --prompt "Hi" --tokens 2 --temperature 0 > sys_sample.txt 2> sys_sample.err || fail "sample --chat: $(cat sys_sample.err)"
"$PY" - sys_sample.txt "$SRC/tests" <<'PY' || fail "sample --chat with a default system message: $(cat sys_sample.txt)"
import sys
sys.path.insert(0, sys.argv[2])
import jsonl_reference as ref
text = open(sys.argv[1], encoding="utf-8").read()
want = ("<|start_header_id|>system<|end_header_id|>\n\n" + ref.SYSTEM_PROMPT.strip() + "<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
sys.exit(not text.startswith(want))
PY
"$S" sample runs/sys --chat --system " Be short. " --prompt "Hi" --tokens 1 --temperature 0 > sys_sample2.txt 2> sys_sample2.err &&
  grep -q "^<|start_header_id|>system<|end_header_id|>" sys_sample2.txt &&
  [ "$(grep -c 'Be short.<|eot_id|><|start_header_id|>user' sys_sample2.txt)" = 1 ] &&
  ! grep -q "Be kind" sys_sample2.txt || fail "sample --chat --system: $(cat sys_sample2.txt)"
[ "$(code "$S" sample runs/sys --system x --prompt Hi)" = 2 ] && grep -q "system goes with --chat" out.txt ||
  fail "sample --system without --chat: $(cat out.txt)"
pass "sample --chat on --system-prompt data: the default system turn first, as the template has it; --system replaces it"
# --prompts FILE: a JSON line for each prompt, its completion the reply sample --chat gives it
# alone (with the file's "system" as --system), the turn's end left out and said by "stopped"
printf '%s\n' '{"prompt": "  Hi there "}' '' '{"prompt": "Hi", "system": " Be short. "}' > prompts.jsonl
"$S" sample runs/w1 --chat --prompts prompts.jsonl --tokens 3 --temperature 0 > p_w1.jsonl 2> p.err || fail "--prompts: $(cat p.err)"
"$S" sample runs/sys --chat --prompts prompts.jsonl --tokens 1 --temperature 0 > p_sys.jsonl 2> p.err || fail "--prompts: $(cat p.err)"
"$PY" - p_w1.jsonl sample.txt p_sys.jsonl sys_sample2.txt <<'PY' || fail "--prompts: $(cat p_w1.jsonl p_sys.jsonl)"
import json, sys
def reply(path):  # what the single sample generated after the assistant's header
    return open(path).read()[:-1].rsplit("<|end_header_id|>\n\n", 1)[1]
w1 = [json.loads(l) for l in open(sys.argv[1])]
sys_ = [json.loads(l) for l in open(sys.argv[3])]
assert [r["prompt"] for r in w1] == ["  Hi there ", "Hi"], w1
for got, path in ((w1[0], sys.argv[2]), (sys_[1], sys.argv[4])):
    want = reply(path)
    assert got["completion"] + ("<|eot_id|>" if got["stopped"] else "") == want, (got, want)
print("ok: --prompts: each completion is the reply sample --chat gives the prompt alone")
PY
[ "$(code "$S" sample runs/w1 --prompts prompts.jsonl --prompt x)" = 2 ] && grep -q "one prompt, or a file of them" out.txt &&
  [ "$(code "$S" sample runs/w1 --prompts prompts.jsonl)" = 2 ] && grep -q 'prompts.jsonl:3: "system" goes with --chat' out.txt ||
  fail "--prompts refusals: $(cat out.txt)"
pass "sample --prompts: a JSON line per prompt, each the reply of the prompt alone; refusals name the line"
[ "$(code "$S" sample runs/w1 --tokenizer $tok/tokenizer.json --chat --prompt x)" = 2 ] && grep -q "chat template" out.txt ||
  fail "sample --chat with a tokenizer without our template should exit 2 naming it: $(cat out.txt)"
"$S" export runs/w1 --out hf > /dev/null
grep -q '"chat_template"' hf/tokenizer_config.json || fail "export has no chat_template"
# sample straight from the export (a Hugging Face directory): the run's text, template and stop;
# and from a copy whose template Strata did not write (an Instruct model's own), whose special
# tokens say the format
"$S" sample hf --chat --prompt "  Hi there " --tokens 3 --temperature 0 > hf_sample.txt 2> hf_sample.err ||
  { cat hf_sample.err; fail "sample --chat of the export"; }
cmp -s sample.txt hf_sample.txt || fail "sample --chat of the export: $(cat hf_sample.txt); the run's: $(cat sample.txt)"
cp -r hf hf_foreign
"$PY" - hf_foreign/tokenizer_config.json <<'PY' || fail "rewriting the copy's chat template"
import json, sys
c = json.load(open(sys.argv[1]))
c["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
json.dump(c, open(sys.argv[1], "w"))
PY
"$S" sample hf_foreign --chat --prompt "  Hi there " --tokens 3 --temperature 0 > hf_foreign.txt 2> /dev/null &&
  cmp -s sample.txt hf_foreign.txt || fail "sample --chat of a model with a foreign template: $(cat hf_foreign.txt)"
"$S" sample hf --prompt "Hello there" --tokens 8 --temperature 0 --device cpu > hf_greedy.txt 2> hf_greedy.err ||
  { cat hf_greedy.err; fail "sample of the export"; }
grep -q "^\[sample\] weights .*; read from hf: .* tensors in 1 file" hf_greedy.err || fail "sample of a model directory should say what it read: $(cat hf_greedy.err)"
# strata chat: two user messages on stdin (a blank line between, which says nothing), two
# replies on stdout (checked against transformers below)
printf '%s\n' '  Hi there ' '' 'And then?' | "$S" chat runs/w1 --tokens 3 --temperature 0 --device cpu > chat.txt 2> chat.err ||
  fail "chat: $(cat chat.err)"
pass "sample of the export (a Hugging Face directory): the run's text; a foreign template's format from its special tokens"
if "$PY" -c "import transformers, torch" > /dev/null 2>&1; then
  "$PY" - hf "$SRC/tests" <<'PY' || fail "export: apply_chat_template or from_pretrained"
import sys
sys.path.insert(0, sys.argv[2])
from transformers import AutoModelForCausalLM, AutoTokenizer
from tokenizers import Tokenizer
import jsonl_reference as ref
tok = AutoTokenizer.from_pretrained(sys.argv[1])
raw = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
for conv in ref.CONVERSATIONS:
    got = tok.apply_chat_template(conv, tokenize=True)
    got = list(got["input_ids"] if hasattr(got, "keys") else got)  # transformers 5 returns a BatchEncoding
    want, _ = ref.example("messages", "llama3", raw, {"messages": conv}, raw.token_to_id("<|eot_id|>"))
    assert got == want, (conv, got, want)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
assert model.config.vocab_size == 128256 and tok.eos_token == "<|eot_id|>"
# greedy decoding of the export, as strata sample --temperature 0 did (hf_greedy.txt): the
# same tokens, up to a step whose two likeliest are too close for fp32's orders to agree on
import torch
ids = tok("Hello there")["input_ids"]
n_prompt, decided = len(ids), None
with torch.no_grad():
    for step in range(8):
        top = torch.topk(model(torch.tensor([ids])).logits[0, -1].double(), 2)
        if decided is None and float(top.values[0] - top.values[1]) < 1e-4:
            decided = len(ids)  # this step's draw may go either way: compare what came before it
        ids.append(int(top.indices[0]))
got = open(sys.argv[1] + "/../hf_greedy.txt").read()[:-1]
want = tok.decode(ids[1:decided or len(ids)], skip_special_tokens=False, clean_up_tokenization_spaces=False)
assert got.startswith(want) if decided else got == want, (got, want, decided)
print("ok: strata sample of the export decodes greedily as transformers does (%d tokens%s)" % (
    len(ids) - n_prompt, ", up to a near tie" if decided else ""))
# strata chat's two replies (chat.txt): the conversation so far, its replies as the model wrote
# them, then the next user turn, decoded greedily as transformers does
eot = tok.convert_tokens_to_ids("<|eot_id|>")
def greedy(ids, n):
    out, tie = [], False
    with torch.no_grad():
        for _ in range(n):
            top = torch.topk(model(torch.tensor([ids + out])).logits[0, -1].double(), 2)
            tie |= float(top.values[0] - top.values[1]) < 1e-4
            out.append(int(top.indices[0]))
            if out[-1] == eot:
                break
    return out, tie
def turn(text, first):
    got = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    got = list(got["input_ids"] if hasattr(got, "keys") else got)
    return got if first else got[1:]  # the BOS starts the conversation only
got = open(sys.argv[1] + "/../chat.txt").read()
conv = turn("  Hi there ", True)
r1, tie1 = greedy(conv, 3)
conv += r1 + ([] if r1[-1] == eot else [eot]) + turn("And then?", False)
r2, tie2 = greedy(conv, 3)
text = lambda r: tok.decode([t for t in r if t != eot], skip_special_tokens=False, clean_up_tokenization_spaces=False)
# each reply then a newline; the first is also sample --chat's (its text after the header)
alone = open(sys.argv[1] + "/../sample.txt").read()[:-1].rsplit("<|end_header_id|>\n\n", 1)[1]
assert tie1 or (got.startswith(text(r1) + "\n") and alone in (text(r1), text(r1) + "<|eot_id|>")), (got, text(r1), alone)
assert tie1 or tie2 or got == text(r1) + "\n" + text(r2) + "\n", (got, text(r1), text(r2))
print("ok: strata chat's two replies are transformers' greedy replies to the conversation, the first sample --chat's%s" % (
    " (a near tie: not compared)" if tie1 or tie2 else ""))
print("ok: export: apply_chat_template gives the ids the run trained on for every conversation; "
      "LlamaForCausalLM loads (vocab 128256)")
# --system-prompt: the template prepare wrote puts the default system message where prepare did
for fmt, tk_name in (("llama3", "llama3"), ("chatml", "qwen2")):
    d = sys.argv[1] + "/../ref/system_" + fmt
    tok = AutoTokenizer.from_pretrained(d)
    raw = Tokenizer.from_file(d + "/tokenizer.json")
    eos = raw.token_to_id("<|eot_id|>" if fmt == "llama3" else "<|im_end|>")
    for conv in ref.CONVERSATIONS:
        got = tok.apply_chat_template(conv, tokenize=True)
        got = list(got["input_ids"] if hasattr(got, "keys") else got)
        full = conv if conv[0]["role"] == "system" else [{"role": "system", "content": ref.SYSTEM_PROMPT}] + conv
        want, _ = ref.example("messages", fmt, raw, {"messages": full}, eos)
        assert got == want, (fmt, conv, got, want)
print("ok: --system-prompt: transformers' apply_chat_template of the template beside the shards puts the default "
      "system message where prepare did (llama3, chatml)")
PY
  # short conversations, several to a sequence of 64
  "$PY" - short.jsonl <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(16):
        conv = [{"role": "user", "content": "Hi %d" % i}, {"role": "assistant", "content": "Hello %d." % (i * 7)}]
        if i % 4 == 0:
            conv.insert(0, {"role": "system", "content": "Be brief."})
        f.write(json.dumps({"messages": conv}) + "\n")
PY
  "$S" prepare --jsonl short.jsonl --tokenizer $tok --messages-field messages --chat-format llama3 --seq-len 64 \
    --val-fraction 0 --out short > prep.txt || fail "prepare short conversations: $(cat prep.txt)"
  "$S" dump-grads runs/w1 --data "short/train_*.bin" --batch 3 --device $DEV --out packed.safetensors > dump.txt ||
    fail "dump-grads on packed conversations: $(cat dump.txt)"
  "$S" dump-grads runs/w1 --data "short/train_*.bin" --batch 3 --device $DEV --out joined.safetensors \
    --set data.document_mask=false > dump.txt || fail "dump-grads, data.document_mask false: $(cat dump.txt)"
  "$PY" - packed.safetensors hf joined.safetensors $TOL_LOGITS $TOL_LOSS <<'PY' || fail "packed conversations vs transformers"
import sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
d = load_file(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32).eval()
logits, inputs, targets, pos = d["logits"], d["inputs"].long(), d["targets"].long(), d["positions"]
B, T = inputs.shape
scale = logits.abs().max().item()
worst, docs, packed, nll, learned = 0.0, 0, 0, 0.0, 0
with torch.no_grad():
    for b in range(B):
        starts = [t for t in range(T) if pos[b, t] == 0] + [T]
        packed += len(starts) > 2
        for s, e in zip(starts, starts[1:]):
            assert all(pos[b, t] == t - s for t in range(s, e)), "positions count from each start"
            out = model(inputs[b:b + 1, s:e]).logits[0].float()
            worst = max(worst, (out - logits[b, s:e]).abs().max().item() / scale)
            tg = targets[b, s:e]
            keep = tg >= 0
            if keep.any():
                nll += torch.nn.functional.cross_entropy(out[keep], tg[keep], reduction="sum").item()
                learned += int(keep.sum())
            docs += 1
    whole = (model(inputs).logits.float() - logits).abs().max().item() / scale
    j = load_file(sys.argv[3])
    joined = (model(inputs).logits.float() - j["logits"]).abs().max().item() / scale
assert "positions" not in j and torch.equal(j["inputs"], d["inputs"])
loss = nll / learned
rel = abs(loss - d["loss"].item()) / loss
print("packed: %d conversations in %d rows (%d holding several): logits within %.1e of max |logit| of each alone in "
      "transformers, loss %.6f vs %.6f (rel %.1e); the rows whole differ by %.1e; with data.document_mask false, "
      "the rows whole are transformers' within %.1e" % (
          docs, B, packed, worst, d["loss"].item(), loss, rel, whole, joined))
tol_logits, tol_loss = float(sys.argv[4]), float(sys.argv[5])
assert packed >= 2 and worst < tol_logits and rel < tol_loss and whole > max(1e-3, 3 * tol_logits) and joined < tol_logits
PY
  pass "dump-grads over packed conversations = transformers over each conversation alone"
else
  echo "skip: the export's checks with transformers (not importable here)"
fi

# --- --pack takes best-fit or in-order, and goes with --jsonl
[ "$(code "$S" prepare --jsonl none.jsonl --tokenizer $tok --text-field text --seq-len 64 --pack tight --out p)" = 2 ] &&
  grep -q "pack is best-fit or in-order, not 'tight'" out.txt && [ ! -e p ] || fail "--pack tight: $(cat out.txt)"
pass "--pack tight is refused (exit 2), naming the choices"
[ "$(code "$S" prepare --jsonl none.jsonl --tokenizer $tok --text-field text --seq-len 64 --threads 0 --out p)" = 2 ] &&
  grep -q "threads expects an integer in \[1, 64\], got '0'" out.txt && [ ! -e p ] || fail "--threads 0: $(cat out.txt)"
[ "$(code "$S" prepare --jsonl none.jsonl --tokenizer $tok --messages-field m --seq-len 64 --system-prompt "" --out p)" = 2 ] &&
  grep -q "system-prompt expects UTF-8 text, not empty" out.txt && [ ! -e p ] || fail "--system-prompt '': $(cat out.txt)"
printf '{"text": "a"}\n' > plain.jsonl
[ "$(code "$S" prepare --jsonl plain.jsonl --tokenizer $tok --seq-len 64 --system-prompt Hi --out p)" = 2 ] &&
  grep -q "system-prompt goes with a chat" out.txt && [ ! -e p ] || fail "--system-prompt on text: $(cat out.txt)"
[ "$(code "$S" prepare --jsonl plain.jsonl --tokenizer $tok --seq-len 64 --messages-field "prompt," --out p)" = 2 ] &&
  grep -q "messages-field expects field names, none of them empty (several are comma-separated), got 'prompt,'" out.txt &&
  [ ! -e p ] || fail "--messages-field 'prompt,': $(cat out.txt)"
pass "--threads 0, an empty --system-prompt, one on examples that are no chat and an empty field name are refused (exit 2), saying why"

# --- a vocabulary past 65536 on uint16 shards is refused at start
printf 'some text to make byte-level shards of, long enough for a sequence or two.\n%.0s' {1..20} > t.txt
"$S" prepare --text t.txt --out bytes > /dev/null
[ "$(code "$S" train chat.yaml --set 'data.train=bytes/train_*.bin' --set data.val= --set run.dir=runs/u16)" = 2 ] ||
  fail "vocab 128256 on uint16 shards should exit 2: $(cat out.txt)"
grep -q "hold uint16 tokens" out.txt || fail "the refusal should say why: $(cat out.txt)"
pass "a vocabulary of 128256 on llm.c's uint16 shards is refused at start (exit 2), saying why"
echo "PASS"
