#!/usr/bin/env python3
"""tests/hf_reference.py: Strata against Hugging Face transformers and tokenizers.

1. Weights in: a GPT2LMHeadModel made and saved by transformers (fp32; fp16; bf16 in
   shards with an index; GPT2Model's prefix-less names with the old attention-mask
   buffers) is loaded with `model.init_from`, and Strata's first loss equals
   transformers' loss on the same tokens (the model's own weights, in fp32) to 1e-5.
2. Tokenizers: a byte-level BPE trained by `tokenizers` on tiny shakespeare encodes the
   corpus and a Unicode-heavy file (emoji, CJK, CRLF, runs of spaces, contractions, ...)
   to the same ids with `strata prepare --tokenizer` as with `tokenizers`; so does the
   GPT-2 layout transformers saves (tokenizer.json) and GPT-2's original vocab.json +
   merges.txt.
3. Out again: a run trained on those tokens exports a directory that
   GPT2LMHeadModel.from_pretrained and AutoTokenizer.from_pretrained load as they are,
   with the tokenizer's ids; `strata sample` echoes an encoded prompt and refuses one
   outside the model's vocabulary.

Exits 77 (the ctest skip code) when torch, transformers or tokenizers cannot be imported.
usage: hf_reference.py --strata BIN --workdir DIR [--corpus FILE]
"""
import argparse
import array
import json
import os
import shutil
import subprocess
import sys

from reference_common import Failures, run

SKIP = 77

UNICODE_TEXT = (
    "Hello, world! It's a test: we'll see, they're here, I'm fine, you've done, he'd go. DON'T 'S 'LL\r\n"
    "Emoji \U0001F600\U0001F603\U0001F389 and \U0001F469\u200d\U0001F469\u200d\U0001F467 family, flags \U0001F1EB\U0001F1F7.\n"
    "CJK: \u4f60\u597d\uff0c\u4e16\u754c\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\ud55c\uad6d\uc5b4.\n"
    "Runs of spaces:     five    four   three  two one\n"
    "\t\ttabs\tand\u00a0nbsp\u2003em\u3000ideographic\u2028line\u2029para\u0085nel\u000bvt\u000cff\n"
    "Numbers 12345 1.5e-3 \u0663\u0664\u0665 \u2167 \u00bd 10,000 3rd 2nd\n"
    "Accents: caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m Z\u00fcrich, combining e\u0301 a\u0308\n"
    "Indic \u0915\u094d\u0937 \u200d\u200c zero-width \ufeffBOM-in-text\n"
    "Math \u2211\u222b\u221a\u221e \u2264\u2265 \u2190 \u2192 and symbols \u00a9\u00ae\u2122 \u00a7\u00b6 \u2020\u2021 \u2022\u2026\n"
    "   leading spaces\n\n\n   \n trailing   \r\n\r\n"
    "<|endoftext|>after special<|endoftext|><|endoftext|>\n"
    "Greek \u0391\u0392\u0393 \u03b1\u03b2\u03b3, Cyrillic \u041f\u0440\u0438\u0432\u0435\u0442, Arabic \u0645\u0631\u062d\u0628\u0627, "
    "Hebrew \u05e9\u05dc\u05d5\u05dd, Thai \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\n"
    "\x00\x01\x7f control\x1b[0m bytes\n"
    "ends without a newline   ")



def read_shards(pattern_dir, prefix="train"):
    ids = []
    for name in sorted(os.listdir(pattern_dir)):
        if not (name.startswith(prefix + "_") and name.endswith(".bin")):
            continue
        with open(os.path.join(pattern_dir, name), "rb") as f:
            b = f.read()
        header = array.array("i")
        header.frombytes(b[:1024])
        toks = array.array("H")
        toks.frombytes(b[1024:])
        assert header[2] == len(toks)
        ids.extend(toks)
    return ids


def first_loss(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return json.loads(f.readline())["loss"]


# ---- 1. weights in ----

def weights_in(args, work, fails, torch, transformers):
    import torch.nn.functional as F
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel
    print("weights in: transformers' GPT2LMHeadModel -> model.init_from")
    T, B = 32, 4
    text = os.path.join(work, "w.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write(UNICODE_TEXT * 4)
    run([args.strata, "prepare", "--text", text, "--out", "wdata", "--val-fraction", "0"], work, "prepare")
    tokens = read_shards(os.path.join(work, "wdata"))
    inputs = torch.tensor([tokens[g * T:g * T + T] for g in range(B)])
    targets = torch.tensor([tokens[g * T + 1:g * T + T + 1] for g in range(B)])
    # GPT-2's defaults otherwise: dropout 0.1 (Strata trains without it), gelu_new, eps 1e-5
    cfg = GPT2Config(vocab_size=256, n_positions=T, n_embd=48, n_layer=2, n_head=4)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # make the biases and norms non-trivial, as a trained model's are
        for n, p in model.named_parameters():
            if n.endswith(".bias") or ".ln_" in n:
                p.add_(0.05 * torch.randn_like(p))
    variants = []
    d = os.path.join(work, "gpt2_f32")
    model.save_pretrained(d)
    variants.append(("fp32, model.safetensors", d))
    d = os.path.join(work, "gpt2_f16")
    GPT2LMHeadModel.from_pretrained(os.path.join(work, "gpt2_f32"), torch_dtype=torch.float16).save_pretrained(d)
    variants.append(("fp16", d))
    d = os.path.join(work, "gpt2_bf16_sharded")
    GPT2LMHeadModel.from_pretrained(os.path.join(work, "gpt2_f32"), torch_dtype=torch.bfloat16).save_pretrained(
        d, max_shard_size="40KB")
    fails.check(os.path.exists(os.path.join(d, "model.safetensors.index.json")), "bf16 saved in shards with an index")
    variants.append(("bf16, sharded", d))
    # GPT2Model's names (no "transformer."), with the attention-mask buffers old files carry
    d = os.path.join(work, "gpt2_bare")
    os.makedirs(d)
    sd = {k[len("transformer."):]: v.contiguous() for k, v in model.state_dict().items() if k.startswith("transformer.")}
    for l in range(cfg.n_layer):
        sd["h.%d.attn.bias" % l] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
        sd["h.%d.attn.masked_bias" % l] = torch.tensor(-1e4)
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(work, "gpt2_f32", "config.json"), d)
    variants.append(("GPT2Model names + mask buffers", d))

    yaml = os.path.join(work, "ft.yaml")
    with open(yaml, "w") as f:
        f.write('device: cpu\nmodel: {init_from: gpt2_f32}\ndata: {train: "wdata/train_*.bin", val: "", shuffle: false}\n'
                "train: {steps: 1, micro_batch: %d, eval_every: 0, sample_tokens: 0}\n"
                "run: {dir: runs/x, checkpoint_at_end: false}\n" % B)
    for i, (label, d) in enumerate(variants):
        run_dir = "runs/w%d" % i
        run([args.strata, "train", yaml, "--set", "model.init_from=" + os.path.basename(d), "--set", "run.dir=" + run_dir],
            work, "train from " + label)
        got = first_loss(os.path.join(work, run_dir))
        ref_model = GPT2LMHeadModel.from_pretrained(d, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            logits = ref_model(inputs).logits
            ref = F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1)).item()
        fails.check(abs(got - ref) <= 1e-5 * abs(ref), "%s: strata loss %.7f, transformers %.7f (rel. error %.1e <= 1e-5)"
                    % (label, got, ref, abs(got - ref) / abs(ref)))


# ---- 2. tokenizers ----

def tokenizers_equal(args, work, fails, transformers, corpus):
    from tokenizers import ByteLevelBPETokenizer, Tokenizer
    print("tokenizers: byte-level BPE trained on %s" % os.path.basename(corpus))
    tok = ByteLevelBPETokenizer()
    tok.train([corpus], vocab_size=2000, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
    tok_json = os.path.join(work, "bpe.json")
    tok.save(tok_json)
    uni = os.path.join(work, "unicode.txt")
    with open(uni, "w", encoding="utf-8", newline="") as f:
        f.write(UNICODE_TEXT)
    hf = Tokenizer.from_file(tok_json)

    def strata_ids(tokenizer, path, out):
        # on 3 threads: GPT-2's pattern lets prepare cut tiny shakespeare into parts (io/bpe.h)
        run([args.strata, "prepare", "--tokenizer", tokenizer, "--text", path, "--out", out, "--val-fraction", "0",
             "--threads", "3"], work, "prepare --tokenizer")
        return read_shards(os.path.join(work, out))

    texts = {}
    for path in (corpus, uni):
        with open(path, encoding="utf-8", newline="") as f:
            texts[path] = f.read()
    for path in (corpus, uni):
        want = hf.encode(texts[path]).ids
        got = strata_ids(tok_json, path, "tok_" + os.path.basename(path))
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        fails.check(got == want, "tokenizer.json, %s: %d ids, identical to tokenizers'%s" % (
            os.path.basename(path), len(want), "" if got == want else
            " (first difference at %s: %s vs %s)" % (first, got[first:first + 5] if first is not None else got[-5:],
                                                     want[first:first + 5] if first is not None else want[-5:])))

    # GPT-2's layouts: what transformers saves, and the original vocab.json + merges.txt
    from transformers import GPT2TokenizerFast
    vm = os.path.join(work, "vocab_merges")
    os.makedirs(vm)
    tok.save_model(vm)  # vocab.json + merges.txt
    gpt2_tok = GPT2TokenizerFast.from_pretrained(vm)
    saved = os.path.join(work, "gpt2_tokenizer")
    gpt2_tok.save_pretrained(saved)
    fails.check(os.path.exists(os.path.join(saved, "tokenizer.json")), "transformers saved GPT-2's tokenizer.json")
    want = gpt2_tok(texts[uni])["input_ids"]
    fails.check(strata_ids(saved, uni, "tok_saved") == want, "the directory transformers saved: same ids as "
                "GPT2TokenizerFast (%d)" % len(want))
    fails.check(strata_ids(vm, uni, "tok_vm") == want, "vocab.json + merges.txt: same ids as GPT2TokenizerFast")
    return tok_json, uni


# ---- 3. out again ----

def out_again(args, work, fails, torch, transformers, tok_json, corpus, uni):
    from transformers import AutoTokenizer, GPT2LMHeadModel
    from tokenizers import Tokenizer
    print("out again: a run on BPE tokens -> strata export -> from_pretrained")
    run([args.strata, "prepare", "--tokenizer", tok_json, "--text", corpus, "--out", "bdata", "--val-fraction", "0.05"],
        work, "prepare")
    yaml = os.path.join(work, "bpe.yaml")
    with open(yaml, "w") as f:
        f.write('device: cpu\nmodel: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 2000}\n'
                'data: {train: "bdata/train_*.bin", val: ""}\n'
                "train: {steps: 3, micro_batch: 4, eval_every: 0, sample_tokens: 8}\nrun: {dir: runs/bpe}\n")
    run([args.strata, "train", yaml], work, "train on BPE tokens")
    out = os.path.join(work, "export")
    run([args.strata, "export", "runs/bpe", "--out", out], work, "export")
    model, info = GPT2LMHeadModel.from_pretrained(out, output_loading_info=True)
    fails.check(not info["missing_keys"] and not info["unexpected_keys"] and model.config.vocab_size == 2000,
                "from_pretrained(export) loads with nothing missing or unexpected")
    hf_tok = AutoTokenizer.from_pretrained(out)
    with open(uni, encoding="utf-8", newline="") as f:
        text = f.read()
    want = Tokenizer.from_file(tok_json).encode(text).ids
    fails.check(hf_tok(text)["input_ids"] == want, "AutoTokenizer.from_pretrained(export) (%s) gives the training "
                "tokenizer's ids" % type(hf_tok).__name__)
    eot = Tokenizer.from_file(tok_json).token_to_id("<|endoftext|>")
    with open(os.path.join(out, "generation_config.json")) as f:
        gen = json.load(f)
    fails.check(model.config.eos_token_id == eot and gen.get("eos_token_id") == eot and hf_tok.eos_token == "<|endoftext|>",
                "config, generation_config and tokenizer name <|endoftext|> (%d) as end of text" % eot)
    prompt = "ROMEO: what light through yonder window"
    p = run([args.strata, "sample", "runs/bpe", "--prompt", prompt, "--tokens", "8", "--temperature", "0"], work, "sample")
    fails.check(p.stdout.startswith(prompt), "strata sample encodes the prompt with the run's tokenizer and decodes it "
                "back: %r" % p.stdout[:60])
    # a byte-level model asked for a prompt in a 2000-token vocabulary
    run([args.strata, "prepare", "--text", uni, "--out", "bytes", "--val-fraction", "0"], work, "prepare bytes")
    with open(os.path.join(work, "bytes.yaml"), "w") as f:
        f.write('device: cpu\nmodel: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 256}\n'
                'data: {train: "bytes/train_*.bin", val: ""}\ntrain: {steps: 1, micro_batch: 1, eval_every: 0, '
                "sample_tokens: 0}\nrun: {dir: runs/bytes}\n")
    run([args.strata, "train", "bytes.yaml"], work, "train bytes")
    p = run([args.strata, "sample", "runs/bytes", "--tokenizer", tok_json, "--prompt", prompt], work,
            "sample out of vocabulary", expect=2)
    fails.check("outside the model's vocabulary of 256" in p.stderr, "a prompt outside the model's vocabulary is "
                "refused (exit 2): %s" % p.stderr.strip()[:120])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--corpus", required=True, help="text to train the BPE on (tiny shakespeare in CI)")
    args = ap.parse_args()
    args.strata = os.path.abspath(args.strata)
    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    try:
        import torch
        import transformers
        import tokenizers  # noqa: F401
        import safetensors  # noqa: F401
    except Exception as e:
        print("SKIP: torch, transformers, tokenizers or safetensors not importable (%s)" % e)
        return SKIP
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    print("torch %s, transformers %s, tokenizers %s" % (torch.__version__, transformers.__version__, tokenizers.__version__))
    fails = Failures()
    weights_in(args, work, fails, torch, transformers)
    tok_json, uni = tokenizers_equal(args, work, fails, transformers, os.path.abspath(args.corpus))
    out_again(args, work, fails, torch, transformers, tok_json, os.path.abspath(args.corpus), uni)
    return fails.verdict("strata matches transformers and tokenizers")


if __name__ == "__main__":
    sys.exit(main())
