#!/usr/bin/env python3
"""tests/tokenizers_reference.py: the tokenizers of today's models in Strata as in Hugging
Face `tokenizers`.

Fixtures are made offline from the exact components those models' tokenizer.json files
have, trained on tiny shakespeare:
  llama3   byte-level BPE, ignore_merges, Llama 3's Split pattern then ByteLevel without its
           regex, 256 special tokens at ids 128000-128255 (the model vocabulary padded to
           128000 with tokens no text reaches), TemplateProcessing "<|begin_of_text|> $A":
           a vocabulary of 128256, so prepare writes 32-bit shards;
  qwen2    byte-level BPE, NFC normalizer, Qwen2's Split pattern then ByteLevel, ChatML's
           special tokens, no BOS;
  llama2   SentencePiece-style BPE as tokenizers writes Llama 2's and TinyLlama's: Prepend +
           Replace normalizers, byte_fallback to <0x00>-<0xFF>, <unk> fused, the Replace/
           ByteFallback/Fuse/Strip decoder, TemplateProcessing "<s> $A";
  mistral  a SentencePiece model trained by `sentencepiece` itself (BPE, byte fallback, split
           digits, identity normalization), converted as transformers' LlamaConverter does
           (its extractor's vocabulary and merges, Metaspace with prepend_scheme "first",
           split false) with Mistral's "<s> $A": skipped without sentencepiece; its ids on tiny
           shakespeare must also be sentencepiece's own;
  nfc      NFC before a byte-level BPE with no merges, so the ids are the bytes of the
           normalized text: an exact oracle of NFC itself on every precomposed character,
           its decomposition, shuffled combining marks and Hangul jamo.
Each encodes tiny shakespeare and a Unicode-heavy text (emoji, CJK, combining marks, CRLF,
runs of spaces, digit runs, contractions, the special tokens' strings) with `strata prepare
--tokenizer` (ids read back from its shards) and must give tokenizers' encode(text).ids,
on one thread and on three (Llama 3's and Qwen2's cut into parts there, the others not);
`test_bpe --decode` must give tokenizers' decode(ids, skip_special_tokens=False).

Exits 77 (the ctest skip code) when `tokenizers` cannot be imported.
usage: tokenizers_reference.py --strata BIN --test-bpe BIN --workdir DIR --corpus FILE
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shard_io  # noqa: E402
from reference_common import Failures  # noqa: E402

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
except ImportError as e:
    print("SKIP: this Python (%s) has no tokenizers: %s" % (sys.executable, e))
    sys.exit(77)

# the patterns of Llama 3's and Qwen2's tokenizer.json, as they are
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")

UNICODE_TEXT = (
    "Hello, world! It's a test: we'll see, they're here, I'm fine, you've done, he'd go. DON'T 'S 'LL 'Ve \u017f'\u017f\r\n"
    "Emoji \U0001F600\U0001F603\U0001F389 and \U0001F469\u200d\U0001F469\u200d\U0001F467 family, flags \U0001F1EB\U0001F1F7.\n"
    "CJK: \u4f60\u597d\uff0c\u4e16\u754c\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\ud55c\uad6d\uc5b4.\n"
    "Runs of spaces:     five    four   three  two one\n"
    "\t\ttabs\tand\u00a0nbsp\u2003em\u3000ideographic\u2028line\u2029para\u0085nel\u000bvt\u000cff\n"
    "Numbers 12345 1.5e-3 1234567890123 007 \u0663\u0664\u0665 \u2167 \u00bd 10,000 3rd 2nd x2y22z222\n"
    "Accents: caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m Z\u00fcrich, combining e\u0301 a\u0308 A\u030a "
    "\u212b o\u0308\u0304 a\u0301\u0328 \u1100\u1161\u11a8 \u0915\u093c\n"
    "Indic \u0915\u094d\u0937 \u200d\u200c zero-width \ufeffBOM-in-text\n"
    "Math \u2211\u222b\u221a\u221e \u2264\u2265 \u2190 \u2192 and symbols \u00a9\u00ae\u2122 \u00a7\u00b6 \u2020\u2021 \u2022\u2026\n"
    "   leading spaces\n\n\n   \n trailing   \r\n\r\n"
    "<|endoftext|>after special<|endoftext|><|endoftext|>\n"
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|> <|im_start|>assistant\nok<|im_end|>\n"
    "<s>Hello</s> <unk> <s> </s><0x41> <0xZZ>\n"
    "Greek \u0391\u0392\u0393 \u03b1\u03b2\u03b3, Cyrillic \u041f\u0440\u0438\u0432\u0435\u0442, Arabic \u0645\u0631\u062d\u0628\u0627, "
    "Hebrew \u05e9\u05dc\u05d5\u05dd, Thai \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\n"
    "\x00\x01\x7f control\x1b[0m bytes \u2581already\u2581metaspace\u2581\n"
    "ends without a newline   ")


def run(cmd, cwd, what):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        print("FAIL: %s (exit %d)\n%s%s" % (what, p.returncode, p.stdout[-3000:], p.stderr[-3000:]))
        sys.exit(1)
    return p


# ---- the fixtures ----

def save(tok, directory, config=None):
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    if config is not None:
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
    return Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))


def byte_level_bpe(corpus, split, ignore_merges, normalizer, vocab_size):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train([corpus], trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def make_llama3(corpus, d):
    tok = byte_level_bpe(corpus, LLAMA3_SPLIT, True, None, 3000)
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    n = len(vocab)
    for i in range(n, 128000):  # unreachable: no byte-level text has these characters
        vocab["\u27e8unused %d\u27e9" % i] = i
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
             "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    names += ["<|reserved_special_token_%d|>" % i for i in range(3, 3 + 256 - len(names))]
    j["added_tokens"] = [dict(id=128000 + i, content=c, single_word=False, lstrip=False, rstrip=False, normalized=False,
                              special=True) for i, c in enumerate(names)]
    bos = {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
    j["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000],
                                                  "tokens": ["<|begin_of_text|>"]}}}]}
    tok = Tokenizer.from_str(json.dumps(j))
    return save(tok, d, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                         "eos_token": "<|end_of_text|>"})


def make_qwen2(corpus, d):
    tok = byte_level_bpe(corpus, QWEN2_SPLIT, False, normalizers.NFC(), 3000)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(x, normalized=False, special=True)
                            for x in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    return save(tok, d, {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|endoftext|>",
                         "pad_token": "<|endoftext|>"})


def sentencepiece_pieces(tok, byte_ids):
    """The vocabulary with <unk>, <s>, </s> and <0x00>-<0xFF> first, as Llama 2's is."""
    j = json.loads(tok.to_str())
    old = j["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = 3 + b
    for piece, _ in sorted(old.items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    return vocab, [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in j["model"]["merges"]]


def llama_decoder():
    return decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                              decoders.Strip(" ", 1, 0)])


def finish_llama(tok, d):
    tok.add_special_tokens([AddedToken(x, normalized=False, special=True) for x in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return save(tok, d, {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                         "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False})


def make_llama2(corpus, d):
    norm = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = norm
    trainer_tok.train([corpus], trainers.BpeTrainer(vocab_size=2500, show_progress=False, special_tokens=["<unk>"]))
    vocab, merges = sentencepiece_pieces(trainer_tok, True)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = norm
    tok.decoder = llama_decoder()
    return finish_llama(tok, d)


def make_mistral(corpus, d, work):
    try:
        import sentencepiece as spm
        from transformers.convert_slow_tokenizer import SentencePieceExtractor
    except Exception as e:  # ImportError, or a transformers without the extractor
        return None, None, "no sentencepiece or transformers' SentencePieceExtractor (%s)" % e
    prefix = os.path.join(work, "sp")
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=2000, model_type="bpe",
                                   byte_fallback=True, character_coverage=1.0, split_digits=True,
                                   allow_whitespace_only_pieces=True, normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2,
                                   pad_id=-1, minloglevel=2)
    kw = SentencePieceExtractor(prefix + ".model").extract(None)
    tok = Tokenizer(models.BPE(vocab=kw["vocab"], merges=kw["merges"], unk_token="<unk>", fuse_unk=True,
                               byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = llama_decoder()
    return finish_llama(tok, d), spm.SentencePieceProcessor(model_file=prefix + ".model"), None


def make_nfc(d):
    vocab = {}
    table = pre_tokenizers.ByteLevel.alphabet()
    # the 256 byte characters in byte order (GPT-2's table), id = byte
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    for b, c in zip(bs, cs):
        vocab[chr(c)] = b
    assert set(vocab) == set(table)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return save(tok, d)


def nfc_text():
    """Every character with a canonical decomposition, as itself and decomposed; marks in
    shuffled orders after a base; Hangul jamo runs: one line each."""
    rng = random.Random(29)
    lines = []
    marks = [0x300, 0x301, 0x302, 0x303, 0x308, 0x30A, 0x323, 0x327, 0x328, 0x331, 0x345, 0x5B0, 0x93C, 0x3099, 0x1DC0,
             0x7FD, 0x1DF6, 0x1ABF, 0x898]  # the last four: marks of Unicode 10-14, unknown to tokenizers
    for cp in range(0x80, 0x30000):
        d = unicodedata.decomposition(chr(cp))
        if d and not d.startswith("<") and unicodedata.category(chr(cp)) != "Cs":
            lines.append(chr(cp) + " " + unicodedata.normalize("NFD", chr(cp)))
    for _ in range(3000):
        base = rng.choice("aeiouAEOUnNcCsSzZ\u0391\u03b1\u0435\u0438\u05d0\u0915\u304b\u30cfx ")
        ms = [chr(rng.choice(marks)) for _ in range(rng.randint(1, 4))]
        lines.append(base + "".join(ms))
    for _ in range(500):
        lines.append("".join(chr(rng.choice([0x1100 + rng.randrange(19), 0x1161 + rng.randrange(21),
                                             0x11A8 + rng.randrange(27), 0xAC00 + rng.randrange(11172)]))
                             for _ in range(rng.randint(2, 6))))
    return "\n".join(lines) + "\n"


# ---- the comparison ----

# The fixtures whose text prepare cuts into parts on several threads (io/bpe.h
# strata_bpe_line_cuts: Llama 3's and Qwen2's Split patterns); the others encode on one.
CUTS = {"llama3", "qwen2"}


def strata_ids(args, work, fails, name, tok_dir, text_path, out):
    """The ids prepare writes on one thread; on three it must write the same, in parts
    exactly for the fixtures of CUTS (the debug log says how many)."""
    base = [args.strata, "prepare", "--tokenizer", tok_dir, "--text", text_path, "--val-fraction", "0"]
    run(base + ["--out", out, "--threads", "1"], work, "prepare --tokenizer %s" % os.path.basename(tok_dir))
    ids = shard_io.read_ids(os.path.join(work, out))
    if os.path.getsize(text_path) >= (128 << 10):
        p = subprocess.run(base + ["--out", out + "_t3", "--threads", "3"], cwd=work, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=dict(os.environ, STRATA_LOG="debug"))
        parts = re.search(r"encoded in (\d+) parts on 3 threads", p.stdout + p.stderr)
        same = p.returncode == 0 and shard_io.read_ids(os.path.join(work, out + "_t3")) == ids
        fails.check(same and (name in CUTS) == bool(parts and int(parts.group(1)) > 1),
                    "%s, %s: on 3 threads, the ids of one (%s)" % (
                        name, os.path.basename(text_path), "%s parts" % parts.group(1) if parts else "not cut"))
    return ids


def shard_bits(work, out):
    with open(os.path.join(work, out, "train_000000.bin"), "rb") as f:
        h = f.read(8)
    return 32 if h[4] == 2 else 16


def compare(args, work, fails, name, hf, tok_dir, path, text):
    out = "ids_%s_%s" % (name, os.path.basename(path).split(".")[0])
    got = strata_ids(args, work, fails, name, tok_dir, path, out)
    want = hf.encode(text).ids
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if first is None and len(got) != len(want):
        first = min(len(got), len(want))
    detail = ""
    if got != want:
        ctx = hf.decode(want[max(0, first - 5):first + 5], skip_special_tokens=False)
        detail = " (first difference at %d: strata %s, tokenizers %s, near %r)" % (
            first, got[first:first + 5], want[first:first + 5], ctx)
    fails.check(got == want, "%s, %s: %d ids identical to tokenizers'%s%s" % (
        name, os.path.basename(path), len(want), " (32-bit shards)" if shard_bits(work, out) == 32 else "", detail))
    # decoding: test_bpe --decode against tokenizers' decode, special tokens kept
    ids_file = os.path.join(work, out + ".ids")
    with open(ids_file, "w") as f:
        f.write(" ".join(map(str, want)))
    dec_file = os.path.join(work, out + ".txt")
    run([args.test_bpe, "--decode", tok_dir, ids_file, dec_file], work, "test_bpe --decode")
    with open(dec_file, "rb") as f:
        mine = f.read().decode("utf-8")
    theirs = hf.decode(want, skip_special_tokens=False)
    k = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
    fails.check(mine == theirs, "%s, %s: decoded text identical to tokenizers' decode (%d characters)%s%s" % (
        name, os.path.basename(path), len(theirs), "" if mine == theirs else
        " (differs at %d: %r vs %r)" % (k, mine[k:k + 20], theirs[k:k + 20]),
        ", and it is the text" if theirs == text else ""))
    return want


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", required=True)
    ap.add_argument("--test-bpe", required=True, help="the test_bpe binary (its --decode mode)")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    args = ap.parse_args()
    import tokenizers
    print("tokenizers %s, Python unicodedata %s" % (tokenizers.__version__, unicodedata.unidata_version))
    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    fails = Failures()
    corpus = os.path.abspath(args.corpus)
    with open(corpus, encoding="utf-8", newline="") as f:
        shakespeare = f.read()
    uni = os.path.join(work, "unicode.txt")
    with open(uni, "w", encoding="utf-8", newline="") as f:
        f.write(UNICODE_TEXT * 150)  # 160 KB: cut into parts on several threads
    only = set(filter(None, args.only.split(",")))

    fixtures = []
    if not only or "llama3" in only:
        fixtures.append(("llama3", make_llama3(corpus, os.path.join(work, "llama3"))))
    if not only or "qwen2" in only:
        fixtures.append(("qwen2", make_qwen2(corpus, os.path.join(work, "qwen2"))))
    if not only or "llama2" in only:
        fixtures.append(("llama2", make_llama2(corpus, os.path.join(work, "llama2"))))
    sp = None
    if not only or "mistral" in only:
        hf, sp, why = make_mistral(corpus, os.path.join(work, "mistral"), work)
        if hf is None:
            print("skip  mistral: %s" % why)
        else:
            fixtures.append(("mistral", hf))
    for name, hf in fixtures:
        d = os.path.join(work, name)
        want = compare(args, work, fails, name, hf, d, corpus, shakespeare)
        if name == "mistral":
            own = [1] + sp.encode(shakespeare)
            fails.check(want == own, "mistral: the converted fixture gives sentencepiece's own ids on tiny shakespeare "
                        "(%d), so it is the SentencePiece model" % len(own))
        compare(args, work, fails, name, hf, d, uni, UNICODE_TEXT * 150)
    if not only or "nfc" in only:
        text = nfc_text()
        path = os.path.join(work, "nfc.txt")
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        hf = make_nfc(os.path.join(work, "nfc"))
        want = compare(args, work, fails, "nfc", hf, os.path.join(work, "nfc"), path, text)
        py = list(unicodedata.normalize("NFC", text).encode("utf-8"))
        print("note: tokenizers' NFC %s Python's unicodedata %s NFC on this text" % (
            "equals" if want == py else "differs from", unicodedata.unidata_version))
        fixtures.append(("nfc", hf))

    return fails.verdict("strata encodes and decodes as tokenizers for %s" % ", ".join(n for n, _ in fixtures))


if __name__ == "__main__":
    sys.exit(main())
