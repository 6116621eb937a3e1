#!/usr/bin/env python3
"""tests/added_tokens_reference.py: added tokens in Strata as in Hugging Face `tokenizers`.

Tokenizers with added tokens of every kind (normalized or not, single_word, lstrip, rstrip,
special, overlapping one another, inside words, next to Unicode whitespace and word
characters) are made offline: a byte-level BPE trained by `tokenizers` on a small text,
then tokenizers' own add_tokens. Each is saved as tokenizer.json; `strata prepare
--tokenizer` encodes a list of crafted strings and a few hundred random ones (a fixed
seed), each as its own text file, and the ids must be tokenizers' encode(s).ids. On a
difference the strings are encoded one by one and the first few that differ are named
with both encodings.

Exits 77 (the ctest skip code) when `tokenizers` cannot be imported.
usage: added_tokens_reference.py --strata BIN --workdir DIR
"""
import argparse
import array
import os
import random
import shutil
import subprocess
import sys

try:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as e:
    print("SKIP: this Python (%s) has no tokenizers: %s" % (sys.executable, e))
    sys.exit(77)

CORPUS = [
    "First Citizen: Before we proceed any further, hear me speak. All: Speak, speak.",
    "Citizens of the city, my name is Anthony; the mask, the masks, unmasked.",
    "hello world <mask> there, a b ab abc b a; x_y snake_case 12345 caf\u00e9 na\u00efve \u4e2d\u6587",
]

# (name, add_prefix_space, added tokens): each a dict of AddedToken's arguments
def tok(content, **flags):
    return dict(content=content, **flags)

CASES = [
    ("issue", False, [tok("Cit", normalized=False), tok("Citizen", normalized=True),
                      tok("<|endoftext|>", normalized=False, special=True)]),
    ("reversed", False, [tok("Cit", normalized=True), tok("Citizen", normalized=False),
                         tok("izen", normalized=True)]),
    ("single_word", False, [tok("<mask>", single_word=True, normalized=False), tok("ony", single_word=True),
                            tok("name", normalized=True), tok("ab", single_word=True, normalized=False),
                            tok("b", normalized=False), tok("x_y", single_word=True)]),
    ("strip", False, [tok("<mask>", lstrip=True, rstrip=True, single_word=True, normalized=False),
                      tok("my", lstrip=True, rstrip=True, normalized=True), tok("[SEP]", rstrip=True),
                      tok("[CLS]", lstrip=True, normalized=False, special=True)]),
    ("overlap", False, [tok("<a>", rstrip=True, normalized=False), tok(" ", normalized=False),
                        tok(" <b>", normalized=False), tok("a b", normalized=True), tok("b", single_word=True)]),
    ("prefix_space", True, [tok("Cit", normalized=False), tok("Citizen", normalized=True, lstrip=True),
                            tok("<mask>", rstrip=True, normalized=False), tok(" hello", normalized=True)]),
    ("unicode", False, [tok("caf\u00e9", single_word=True, normalized=False), tok("\u4e2d", single_word=True),
                        tok("\u00e9", normalized=False), tok("na\u00efve", lstrip=True, rstrip=True),
                        tok("\u2000x", normalized=True)]),
]

CRAFTED = [
    "Citizen", "Citizens", "First Citizen:", "Cit", "Citi", "izen", "CitCitizen", " Citizen ", "citizen",
    "<|endoftext|>Citizen<|endoftext|>", "Cit<|endoftext|>izen",
    "<mask>", " <mask> ", "a<mask>", "<mask>a", "<mask>, <mask>- x<mask>", "My name is Anthony <mask>",
    "<mask> My name <mask> A<mask> <mask>ony <mask>", "ony", "phony", " ony ", "ony_", "_ony",
    "\u25cc\u0330<mask>", "<mask>\u0301", "1<mask>", "<mask>\u200d",
    "xab", "xab b", "ab", " ab ", "abab", "b", "bb", "a b", "a  b", "ab\u00e9",
    "Hi <mask> there\t<mask>\t<mask>\u2000", "[CLS] my name is [SEP]", "[CLS]my[SEP]x", "  [CLS]  my  [SEP]  ",
    "my my  my\n\nmy", "\u3000my\u3000", "\u00a0my\u00a0", "\u0085my\u2028", "\u200bmy\u200b",
    "<a> <b>z", "<a>   z", "<a> a b", "a b<a>", "<a>\t\t<b>", "<a><a> <a>",
    " hello", "hello", "x hello world", "Cit hello", "\tCitizen",
    "caf\u00e9", "caf\u00e9s", "le caf\u00e9.", "\u00e9t\u00e9", "na\u00efve  caf\u00e9", "\u4e2d\u6587", " \u4e2d ",
    "\u2000x\u2000x", "x\u2000xx",
    "x_y", "x_y_z", "(x_y)", "snake_case x_y.",
]

FRAGMENTS = [" ", "  ", "\t", "\n", "\u2000", "\u3000", "\u00a0", "a", "b", "x", "_", "1", ",", "-", ".",
             "\u00e9", "\u0301", "\u4e2d", "\u200d", "hello", "world", "Cit", "izen", "Citizen", "<mask>", "ony",
             "name", "my", "ab", "<a>", "<b>", "[SEP]", "[CLS]", "<|endoftext|>", "caf\u00e9", "na\u00efve", "x_y"]


def random_strings(rng, n):
    out = []
    for _ in range(n):
        s = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 8)))
        out.append(s)
    return out


def make_tokenizer(add_prefix_space, added):
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(CORPUS * 20, trainer)
    tk.add_tokens([AddedToken(**a) for a in added])
    return tk


def read_train_ids(out_dir):
    ids = []
    for name in sorted(os.listdir(out_dir)):
        if name.startswith("train_") and name.endswith(".bin"):
            with open(os.path.join(out_dir, name), "rb") as f:
                b = f.read()
            header = array.array("i")
            header.frombytes(b[:1024])
            toks = array.array("H")
            toks.frombytes(b[1024:])
            assert header[2] == len(toks), name
            ids.extend(toks)
    return ids


def strata_ids(strata, tok_path, files, out_dir):
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = [strata, "prepare", "--tokenizer", tok_path, "--val-fraction", "0", "--out", out_dir, "--text"] + files
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    if p.returncode != 0:
        return None, p.stdout.strip().splitlines()[-1:] or ["exit %d" % p.returncode]
    return read_train_ids(out_dir), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    rng = random.Random(31)
    failed = []
    for name, aps, added in CASES:
        d = os.path.join(args.workdir, name)
        os.makedirs(d, exist_ok=True)
        tk = make_tokenizer(aps, added)
        tok_path = os.path.join(d, "tokenizer.json")
        tk.save(tok_path)
        strings = CRAFTED + random_strings(rng, 300)
        files = []
        for i, s in enumerate(strings):
            path = os.path.join(d, "s%04d.txt" % i)
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(s)
            files.append(path)
        want = [tk.encode(s).ids for s in strings]
        got, err = strata_ids(args.strata, tok_path, files, os.path.join(d, "out"))
        if got == [i for w in want for i in w]:
            print("  ok   %-12s %d strings encode to tokenizers' ids (%d ids)" % (name, len(strings), len(got)))
            continue
        if err:
            print("  FAIL %-12s strata prepare refused the tokenizer: %s" % (name, err[0]))
            failed.append(name)
            continue
        bad = []
        for s, f, w in zip(strings, files, want):
            g, e = strata_ids(args.strata, tok_path, [f], os.path.join(d, "one"))
            if g != w:
                bad.append((s, w, g if g is not None else e))
                if len(bad) == 5:
                    break
        print("  FAIL %-12s Strata's ids differ from tokenizers' (added: %s):" %
              (name, ", ".join("%r%s" % (a["content"], "".join(" " + k for k, v in sorted(a.items())
                                                             if k != "content" and v)) for a in added)))
        for s, w, g in bad:
            print("         %r: tokenizers %s %s, strata %s" % (s, w, tk.encode(s).tokens, g))
        failed.append(name)
    if failed:
        sys.exit("added_tokens_reference: %d of %d tokenizers differ: %s" % (len(failed), len(CASES), ", ".join(failed)))
    print("added_tokens_reference: %d tokenizers agree with tokenizers %s" % (len(CASES), __import__("tokenizers").__version__))


if __name__ == "__main__":
    main()
