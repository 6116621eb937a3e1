#!/usr/bin/env python3
"""tests/jsonl_reference.py: `strata prepare --jsonl` against a Python reference that applies
the same templates with Hugging Face `tokenizers`.

JSONL fixtures hold good lines and bad ones: a missing field, a field that is not a string,
invalid UTF-8, an empty response, not JSON, not an object, a bad message role, a
conversation without an assistant turn; blank lines; an example longer than --seq-len;
contents with the special tokens' strings, whitespace to trim, and text of every script.
For each of
  prompt/response  with the Llama 3 fixture (32-bit shards, its BOS and its EOS),
  messages llama3  with the Llama 3 fixture,
  messages chatml  with the Qwen2 fixture,
  text             with the Llama 2 fixture (SentencePiece-style),
each --overflow split, truncate and drop, the ids and masks of every shard (train and val) must be
exactly those of the reference's examples packed the documented way (io/jsonl.h), the
counts printed must be the reference's, every bad line alone must stop prepare with exit 2
naming the file, line 1 and the field, and --skip-bad must skip exactly the bad lines. For
Llama 3's template the reference also checks that its examples are what tokenizing the
whole rendered conversation gives. TRL's conversational prompt/completion learns only the
completion's assistant turns; --system-prompt gives the conversations without a system
message that one. Without a field option, prepare takes the layout from the
first example's keys (Alpaca's, prompt/completion, ShareGPT's conversations, text): the shards
of naming the fields; keys of no known layout are refused naming them.

Exits 77 (the ctest skip code) when `tokenizers` cannot be imported.
usage: jsonl_reference.py --strata BIN --workdir DIR --corpus FILE
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shard_io  # noqa: E402
from reference_common import Failures  # noqa: E402
import tokenizers_reference as tref  # noqa: E402  (exits 77 without tokenizers)

T = 24  # --seq-len: 24 for prompts and texts, 64 for conversations (main sets it per case)

GOOD_PROMPTS = [
    ("What is 2+2?", " Four."),
    ("Name a colour.", " Blue, like the sky over Verona."),
    ("", "An empty prompt is fine; an empty response is not."),
    ("Quote <|eot_id|> and <s> literally:", " <|begin_of_text|> stays a special token, as in tokenizers."),
    ("Long answer, please.", " " + " ".join("word%d" % i for i in range(40))),  # longer than T
    ("Unicode: caf\u00e9 \u4f60\u597d \U0001F600 e\u0301", " r\u00e9ponse \u00e0 l'instant\r\n  done  "),
]

CONVERSATIONS = [
    [{"role": "system", "content": "  You are terse.  "}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}],
    [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": " one, two, three \n"},
     {"role": "user", "content": "And back?"}, {"role": "assistant", "content": "three, two, one"}],
    [{"role": "user", "content": "Say <|im_end|> please"}, {"role": "assistant", "content": "caf\u00e9 \u4e2d\u6587 <|eot_id|>!"}],
    [{"role": "user", "content": "Tell me a long story."},
     {"role": "assistant", "content": "Once upon a time " + "and then " * 40 + "the end."}],
    [{"role": "user", "content": "Empty system is fine"}, {"role": "system", "content": ""},
     {"role": "assistant", "content": "Yes."}],
]

# the default system message of --system-prompt: a newline, quotes and a backslash
SYSTEM_PROMPT = "Be kind.\nIt's 'fine' \\ ok."

GOOD_TEXTS = ["First Citizen: Before we proceed any further, hear me speak.",
              "All: Speak, speak.",
              " ".join(["You are all resolved rather to die than to famish?"] * 4),
              "Unicode \u4f60\u597d caf\u00e9 \U0001F600 <s> </s> <0x41>"]


def bad_lines(kind, field):
    """(raw bytes of the line, the field its message must name): one per kind of fault."""
    if kind == "prompt":
        return [(b'{"prompt": "no response here"}', "response"),
                (b'{"prompt": "x", "response": 42}', "response"),
                (b'{"prompt": "bad \xff\xfe utf-8", "response": "x"}', "prompt"),
                (b'{"prompt": "x", "response": ""}', "response"),
                (b'{"prompt": "x", "response": "y", }', "response"),
                (b'["prompt", "response"]', None)]
    if kind == "messages":
        return [(b'{"other": []}', "messages"),
                (b'{"messages": "hi"}', "messages"),
                (b'{"messages": [{"role": "wizard", "content": "x"}, {"role": "assistant", "content": "y"}]}',
                 "messages[0].role"),
                (b'{"messages": [{"role": "user", "content": "x"}]}', "messages"),
                (b'{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]}',
                 "messages[1].content"),
                (b'{"messages": [{"role": "user", "content": 7}, {"role": "assistant", "content": "y"}]}',
                 "messages[0].content"),
                (b'{"messages": [{"role": "user", "content": "\xc3("}, {"role": "assistant", "content": "y"}]}',
                 "messages")]
    return [(b'{"txt": "wrong name"}', field), (b'{"text": null}', field), (b'{"text": ""}', field),
            (b'{"text": "\xed\xa0\x80 surrogate"}', field), (b'not json at all', None)]


def write_jsonl(path, kind):
    """The fixture: good lines with bad ones and blank lines between; returns the good
    examples' sources in order and the number of bad lines."""
    goods = {"prompt": [json.dumps({"prompt": p, "response": r}) for p, r in GOOD_PROMPTS],
             "messages": [json.dumps({"messages": c, "extra": 1}) for c in CONVERSATIONS],
             "text": [json.dumps({"text": t, "id": i}) for i, t in enumerate(GOOD_TEXTS)]}[kind]
    bads = [b for b, _ in bad_lines(kind, "text")]
    lines, order = [], []
    extra = len(bads) - len(goods)  # the bad lines first, so the last quarter (val) holds good ones
    lines.extend(bads[:max(extra, 0)])
    for i, g in enumerate(goods):
        if max(extra, 0) + i < len(bads):
            lines.append(bads[max(extra, 0) + i])
        lines.append(g.encode("utf-8"))
        order.append(json.loads(g))
        if i % 2:
            lines.append(b"   \r")
    with open(path, "wb") as f:
        f.write(b"\n".join(lines) + b"\r\n")
    return order, len(bads), len(lines)


# ---- the reference ----

def enc(tok, s):
    return tok.encode(s, add_special_tokens=False).ids


def tid(tok, s):
    i = tok.token_to_id(s)
    assert i is not None, s
    return i


def template(tok):
    """The ids encode(text) puts around a text (TemplateProcessing's single)."""
    probe = "x"
    with_specials, plain = tok.encode(probe).ids, enc(tok, probe)
    k = with_specials.index(plain[0]) if plain else len(with_specials)
    return with_specials[:k], with_specials[k + len(plain):]


def example(kind, chat, tok, src, eos):
    ids, mask = [], []

    def add(xs, learned):
        ids.extend(xs)
        mask.extend([learned] * len(xs))
    if kind in ("prompt", "text"):
        prefix, suffix = template(tok)
        add(prefix, 0)
        if kind == "prompt":
            add(enc(tok, src["prompt"]), 0)
            add(enc(tok, src["response"]), 1)
        else:
            add(enc(tok, src["text"]), 1)
        add(suffix if suffix else [eos], 1)
    elif chat == "llama3":
        add([tid(tok, "<|begin_of_text|>")], 0)
        for m in src["messages"]:
            a = 1 if m["role"] == "assistant" else 0
            add([tid(tok, "<|start_header_id|>")], 0)
            add(enc(tok, m["role"]), 0)
            add([tid(tok, "<|end_header_id|>")], 0)
            add(enc(tok, "\n\n"), 0)
            add(enc(tok, m["content"].strip()), a)
            add([tid(tok, "<|eot_id|>")], a)
    else:
        for m in src["messages"]:
            a = 1 if m["role"] == "assistant" else 0
            add([tid(tok, "<|im_start|>")], 0)
            add(enc(tok, m["role"] + "\n"), 0)
            add(enc(tok, m["content"]), a)
            add([tid(tok, "<|im_end|>")], a)
            add(enc(tok, "\n"), 0)
    mask[0] = 2  # not learned; bit 1 marks where the example starts (io/data.h)
    return ids, mask


def pack(examples, overflow, pad, open_max=1):
    """The packed stream (ids, mask) of one split, as io/jsonl.h describes (overflow: split,
    truncate or drop; open_max sequences filled at once: 1 packs in order, 64 is --pack
    best-fit); and the counts split, dropped and truncated."""
    ids, mask, n_split, n_drop, n_trunc = [], [], 0, 0, 0
    bins = []  # open sequences, oldest first: [ids, mask]

    def close(i):
        b_ids, b_mask = bins.pop(i)
        ids.extend(b_ids + [pad] * (T - len(b_ids)))
        mask.extend(b_mask + [0] * (T - len(b_ids)))

    def close_fullest():
        close(max(range(len(bins)), key=lambda i: (len(bins[i][0]), -i)))

    any_packed = False
    for e_ids, e_mask in examples:
        if len(e_ids) > T:
            if overflow == "truncate":
                e_ids, e_mask = e_ids[:T], e_mask[:T]
            if overflow == "drop" or not any(m & 1 for m in e_mask):
                n_drop += 1
                continue
            n_split += overflow == "split"
            n_trunc += overflow == "truncate"
        any_packed = True
        at = 0
        if len(e_ids) > T:  # its whole sequences at once; what is left begins an open one
            if len(bins) == open_max:
                close_fullest()
            at = len(e_ids) // T * T
            ids.extend(e_ids[:at])
            mask.extend(e_mask[:at])
            if at == len(e_ids):
                continue
        rest_ids, rest_mask = e_ids[at:], e_mask[at:]
        if at and open_max > 1:  # other sequences may come between: its first target is no longer its own
            rest_mask = [2] + rest_mask[1:]
        fits = [i for i, b in enumerate(bins) if T - len(b[0]) >= len(rest_ids)] if not at else []
        if fits:
            i = min(fits, key=lambda i: (T - len(bins[i][0]), i))
        else:
            if len(bins) == open_max:
                close_fullest()
            bins.append([[], []])
            i = len(bins) - 1
        bins[i][0].extend(rest_ids)
        bins[i][1].extend(rest_mask)
        if len(bins[i][0]) == T:
            close(i)
    while bins:
        close(0)
    if any_packed:
        ids.append(pad)
        mask.append(0)
    return ids, mask, n_split, n_drop, n_trunc


def splitmix64(x):
    """core/common.c's strata_hash64."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def val_lines(n, n_val, at_end):
    """The indices of a file's n examples held out for validation (io/jsonl.h): the last n_val,
    or the n_val whose index hashes lowest."""
    if at_end:
        return set(range(n - n_val, n))
    return set(sorted(range(n), key=lambda k: (splitmix64(k), k))[:n_val])


def targets_stay_within(ids, mask):
    """Whether every sequence's last target (the next sequence's first token) is learned only
    where the next sequence continues the example the sequence ends in: the sequence holds
    that one example alone (no start after its first token) and the next starts no other."""
    for r in range(max(0, len(ids) - 1) // T - 1):
        nxt = mask[(r + 1) * T]
        if nxt & 1 and (nxt & 2 or any(m & 2 for m in mask[r * T + 1:(r + 1) * T])):
            return False
    return True


def read_stream(directory, prefix):
    """A split's shards as one stream: each shard after the first repeats the token the one
    before ended on, which is dropped here; and whether every shard is k*T + 1 tokens."""
    ids, mask, whole = [], [], True
    split = shard_io.read_split(directory, prefix)
    for i, (_, toks, m) in enumerate(split):
        whole &= m is not None and (len(toks) - 1) % T == 0
        if i:
            whole &= ids[-1] == toks[0] and mask[-1] == m[0]
            toks, m = toks[1:], m[1:]
        ids += toks
        mask += m
    return ids, mask, whole, len(split)


def run_prepare(args, work, cmd):
    p = subprocess.run([args.strata, "prepare"] + cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, errors="replace")
    return p.returncode, p.stdout + p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--corpus", required=True)
    args = ap.parse_args()
    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    fails = Failures()
    corpus = os.path.abspath(args.corpus)
    toks = {"llama3": tref.make_llama3(corpus, os.path.join(work, "llama3")),
            "qwen2": tref.make_qwen2(corpus, os.path.join(work, "qwen2")),
            "llama2": tref.make_llama2(corpus, os.path.join(work, "llama2"))}
    cases = [("prompt", None, "llama3", ["--prompt-field", "prompt", "--response-field", "response"]),
             ("messages", "llama3", "llama3", ["--messages-field", "messages", "--chat-format", "llama3"]),
             ("messages", "chatml", "qwen2", ["--messages-field", "messages", "--chat-format", "chatml"]),
             ("text", None, "llama2", ["--text-field", "text"])]
    eos_of = {"llama3": tid(toks["llama3"], "<|end_of_text|>"), "qwen2": tid(toks["qwen2"], "<|endoftext|>"),
              "llama2": tid(toks["llama2"], "</s>")}
    global T
    for kind, chat, tk_name, fields in cases:
        T = 64 if chat else 24
        name = kind + ("-" + chat if chat else "")
        tok, tok_dir = toks[tk_name], os.path.join(work, tk_name)
        path = os.path.join(work, name + ".jsonl")
        order, n_bad, n_lines = write_jsonl(path, kind)
        eos = tid(tok, "<|eot_id|>") if chat == "llama3" else tid(tok, "<|im_end|>") if chat else eos_of[tk_name]
        pad = tid(tok, "<|endoftext|>") if tk_name == "qwen2" else eos  # the config's pad_token, else the EOS
        exs = [example(kind, chat, tok, src, eos) for src in order]
        if chat == "llama3":  # the claim of io/chat.h: as tokenizing the rendered conversation whole
            same = all(ids == enc(tok, "<|begin_of_text|>" + "".join(
                "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>" % (m["role"], m["content"].strip())
                for m in src["messages"])) for (ids, _), src in zip(exs, order))
            fails.check(same, "%s: each example's ids are those of the whole rendered conversation" % name)
        base = ["--jsonl", path, "--tokenizer", tok_dir, "--seq-len", str(T)] + fields
        # the first bad line stops it, naming file, line and field; --skip-bad skips each
        rc, out = run_prepare(args, work, base + ["--out", "stop_" + name])
        fails.check(rc == 2 and (path + ":1:") in out, "%s: the first bad line stops prepare with exit 2 naming %s:1 "
                    "(exit %d: %s)" % (name, os.path.basename(path), rc, out.strip()[-200:]))
        for k, (raw, field) in enumerate(bad_lines(kind, "text")):
            one = os.path.join(work, "%s_bad%d.jsonl" % (name, k))
            with open(one, "wb") as f:
                f.write(raw + b"\n")
            rc, out = run_prepare(args, work, ["--jsonl", one, "--tokenizer", tok_dir, "--seq-len", str(T)] + fields +
                                  ["--out", "bad_" + name])
            named = (one + ":1:") in out and (field is None or ("field '%s'" % field) in out)
            fails.check(rc == 2 and named, "%s: bad line %d (%r) alone: exit 2 naming line 1%s (exit %d: %s)" % (
                name, k, raw[:40], ", field '%s'" % field if field else "", rc, out.strip()[-160:]))
        padding = {}
        for k, (overflow, packing) in enumerate((("split", None), ("drop", None), ("truncate", None),
                                                 ("split", "in-order"))):
            out_dir = "%s_%s" % (name, overflow) + ("_" + packing if packing else "")
            how = "--overflow %s%s" % (overflow, " --pack " + packing if packing else "")
            # every split but drop holds out each file's last quarter (--val-split end), so the e2e
            # runs have validation data; drop's is spread over the file (the default); each
            # tokenizes on its own number of threads, 1 to 4
            spread = overflow == "drop"
            rc, out = run_prepare(args, work, base + ["--out", out_dir, "--skip-bad", "--overflow", overflow,
                                                      "--val-fraction", "0.25", "--threads", str(1 + k)] +
                                  (["--pack", packing] if packing else []) + ([] if spread else ["--val-split", "end"]))
            if rc != 0:
                fails.check(False, "%s %s: prepare exit %d: %s" % (name, how, rc, out[-400:]))
                continue
            # a quarter of the file's non-blank lines go to val: the last, or those hashing lowest
            nonblank = [ln for ln in open(path, "rb").read().split(b"\n") if ln.strip(b" \t\r")]
            held = val_lines(len(nonblank), int(len(nonblank) * 0.25), not spread)
            goods = {json.dumps(src, sort_keys=True) for src in order}
            train_ex, val_ex = [], []
            for i, ln in enumerate(nonblank):
                try:
                    src = json.loads(ln.decode("utf-8"))
                except (ValueError, UnicodeDecodeError):
                    continue
                if not isinstance(src, dict) or json.dumps(src, sort_keys=True) not in goods:
                    continue
                (val_ex if i in held else train_ex).append(exs[order.index(src)])
            open_max = 1 if packing == "in-order" else 64
            want_t = pack(train_ex, overflow, pad, open_max)
            want_v = pack(val_ex, overflow, pad, open_max)
            got_t = read_stream(os.path.join(work, out_dir), "train")
            got_v = read_stream(os.path.join(work, out_dir), "val")
            for label, want, got in (("train", want_t, got_t), ("val", want_v, got_v)):
                ok = got[0] == want[0] and got[1] == want[1] and got[2]
                k = next((i for i, (a, b) in enumerate(zip(got[0], want[0])) if a != b), None)
                fails.check(targets_stay_within(*got[:2]), "%s %s, %s: no sequence's last target is learned from "
                            "another example" % (name, how, label))
                fails.check(ok, "%s %s, %s: %d ids and masks identical to the reference (%d learned, %d sequences of "
                            "%d), shards of whole sequences + 1%s" % (
                                name, how, label, len(want[0]), sum(m & 1 for m in want[1]),
                                max(0, len(want[0]) - 1) // T, T,
                                "" if ok else " (first difference at %s; %d vs %d tokens)" % (k, len(got[0]), len(want[0]))))
            if overflow == "split":
                padding[packing or "best-fit"] = (len(want_t[0]) + len(want_v[0]),
                                                  sum(1 for m in want_t[1] + want_v[1] if m == 0))
            lens = sorted(len(e[0]) for e in train_ex + val_ex)  # nearest rank
            stats = "example lengths in tokens: median %d, 99th percentile %d, longest %d (--seq-len %d)" % (
                lens[(len(lens) + 1) // 2 - 1], lens[(99 * len(lens) + 99) // 100 - 1], lens[-1], T)
            fails.check(stats in out, "%s %s: prints '%s'" % (name, how, stats))
            n_split, n_drop, n_trunc = want_t[2] + want_v[2], want_t[3] + want_v[3], want_t[4] + want_v[4]
            if overflow == "truncate":
                said = ("longer than --seq-len: %d truncated, %d dropped (nothing learned in their first --seq-len "
                        "tokens); bad lines skipped: %d" % (n_trunc, n_drop, n_bad))
            else:
                said = "longer than --seq-len: %d %s; bad lines skipped: %d" % (
                    n_split if overflow == "split" else n_drop, overflow if overflow == "split" else "dropped", n_bad)
            fails.check(said in out and n_split + n_drop + n_trunc > 0 and
                        ("packed by best fit" if not packing else "packed in order") in out,
                        "%s %s: prints '%s' and how it packed" % (name, how, said))
            # the tokenizer files beside the shards: the chat template of a messages format
            with open(os.path.join(work, out_dir, "tokenizer_config.json")) as f:
                cfg = json.load(f)
            if chat:
                fails.check("chat_template" in cfg and cfg["eos_token"] == ("<|eot_id|>" if chat == "llama3" else "<|im_end|>"),
                            "%s: tokenizer_config.json beside the shards holds the chat template and the turn's end as "
                            "eos_token" % name)
        if len(padding) == 2:
            (n_bf, pad_bf), (n_io, pad_io) = padding["best-fit"], padding["in-order"]
            fails.check(n_bf <= n_io, "%s: best fit packs into no more tokens than packing in order (%d vs %d; tokens "
                        "not learned %d vs %d)" % (name, n_bf, n_io, pad_bf, pad_io))
    # ShareGPT's conversations ({"from": human|gpt|system, "value": ...}) are the same
    # examples as role/content ones: the same ids and masks, packed the same way
    T = 64
    tok, tok_dir = toks["llama3"], os.path.join(work, "llama3")
    who = {"system": "system", "user": "human", "assistant": "gpt"}
    path = os.path.join(work, "sharegpt.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for c in CONVERSATIONS:
            f.write(json.dumps({"conversations": [{"from": who[m["role"]], "value": m["content"]} for m in c]}) + "\n")
    rc, out = run_prepare(args, work, ["--jsonl", path, "--tokenizer", tok_dir, "--seq-len", str(T), "--messages-field",
                                       "conversations", "--chat-format", "llama3", "--val-fraction", "0", "--out",
                                       "sharegpt"])
    eot = tid(tok, "<|eot_id|>")
    want = pack([example("messages", "llama3", tok, {"messages": c}, eot) for c in CONVERSATIONS], "split", eot, 64)
    got = read_stream(os.path.join(work, "sharegpt"), "train") if rc == 0 else ([], [], False, 0)
    fails.check(got[0] == want[0] and got[1] == want[1], "ShareGPT's from/value conversations: the ids and masks of the "
                "same conversations as role/content (%d tokens; exit %d%s)" % (len(want[0]), rc,
                                                                            "" if rc == 0 else ": " + out[-200:]))
    for k, (line, field) in enumerate([
            ('{"conversations": [{"from": "tool", "value": "x"}, {"from": "gpt", "value": "y"}]}',
             "conversations[0].from"),
            ('{"conversations": [{"from": "human", "value": "x"}, {"from": "gpt"}]}', "conversations[1].value"),
            ('{"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": ""}]}',
             "conversations[1].value")]):
        one = os.path.join(work, "sharegpt_bad%d.jsonl" % k)
        with open(one, "w") as f:
            f.write(line + "\n")
        rc, out = run_prepare(args, work, ["--jsonl", one, "--tokenizer", tok_dir, "--seq-len", str(T),
                                           "--messages-field", "conversations", "--chat-format", "llama3", "--out",
                                           "sharegpt_bad"])
        fails.check(rc == 2 and ("field '%s'" % field) in out, "ShareGPT bad line %d: exit 2 naming %s (exit %d: %s)" % (
            k, field, rc, out.strip()[-160:]))

    # without --chat-format, the format whose special tokens the tokenizer has: the same
    # shards as naming it; a tokenizer of neither format (Llama 2's) is refused, exit 2
    for fmt, tk_name in (("llama3", "llama3"), ("chatml", "qwen2")):
        path = os.path.join(work, "sharegpt.jsonl")
        common = ["--jsonl", path, "--tokenizer", os.path.join(work, tk_name), "--seq-len", str(T), "--messages-field",
                  "conversations", "--val-fraction", "0"]
        rc1, out1 = run_prepare(args, work, common + ["--chat-format", fmt, "--out", "named_" + fmt])
        rc2, out2 = run_prepare(args, work, common + ["--out", "auto_" + fmt])
        same = rc1 == 0 and rc2 == 0 and all(
            open(os.path.join(work, "named_" + fmt, f), "rb").read() == open(os.path.join(work, "auto_" + fmt, f), "rb").read()
            for f in ("train_000000.bin", "tokenizer_config.json"))
        fails.check(same and ("chat format: %s" % fmt) in out2, "no --chat-format with %s's tokenizer: %s, the shards "
                    "and template of naming it (exit %d, %d)" % (tk_name, fmt, rc1, rc2))
    rc, out = run_prepare(args, work, ["--jsonl", os.path.join(work, "sharegpt.jsonl"), "--tokenizer",
                                       os.path.join(work, "llama2"), "--seq-len", str(T), "--messages-field",
                                       "conversations", "--out", "auto_none"])
    fails.check(rc == 2 and "needs --chat-format llama3 or chatml" in out, "no --chat-format with Llama 2's tokenizer: "
                "exit 2, asking for one (exit %d: %s)" % (rc, out.strip()[-160:]))

    # Alpaca's instruction, input and output: --prompt-field instruction,input joins the
    # fields that are there and not empty with a blank line, tokenized as one string
    alpaca = [{"instruction": "Name a colour.", "input": "", "output": "Blue."},
              {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
              {"instruction": "Translate to French.", "input": "cheese\n", "output": "fromage"},
              {"instruction": "Say hi.", "output": "Hi!"},
              {"instruction": "", "input": "Only an input here.", "output": "Then this."},
              {"instruction": "Shout.", "input": None, "output": "HEY"}]
    path = os.path.join(work, "alpaca.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(a) + "\n" for a in alpaca)
    eos = tid(tok, "<|end_of_text|>")
    prompts = ["\n\n".join(x for x in (a["instruction"], a.get("input")) if x) for a in alpaca]
    want = pack([example("prompt", None, tok, {"prompt": p, "response": a["output"]}, eos)
                 for p, a in zip(prompts, alpaca)], "split", eos, 64)
    base = ["--jsonl", path, "--tokenizer", tok_dir, "--seq-len", str(T), "--prompt-field", "instruction,input",
            "--response-field", "output"]
    rc, out = run_prepare(args, work, base + ["--val-fraction", "0", "--out", "alpaca"])
    got = read_stream(os.path.join(work, "alpaca"), "train") if rc == 0 else ([], [], False, 0)
    fails.check(got[0] == want[0] and got[1] == want[1], "Alpaca's instruction,input: the ids and masks of the fields "
                "joined by a blank line (%d tokens; exit %d%s)" % (len(want[0]), rc, "" if rc == 0 else ": " + out[-200:]))
    for k, (line, field) in enumerate([('{"instruction": "x", "input": 5, "output": "y"}', "input"),
                                       ('{"input": "x", "output": "y"}', "instruction")]):
        one = os.path.join(work, "alpaca_bad%d.jsonl" % k)
        with open(one, "w") as f:
            f.write(line + "\n")
        rc, out = run_prepare(args, work, ["--jsonl", one] + base[2:] + ["--out", "alpaca_bad"])
        fails.check(rc == 2 and ("field '%s'" % field) in out, "Alpaca bad line %d: exit 2 naming %s (exit %d: %s)" % (
            k, field, rc, out.strip()[-160:]))

    # many documents of lengths from a few tokens to most of a sequence (lines of the corpus
    # run together): best fit against the reference both ways, and into fewer sequences
    lines = [ln.strip() for ln in open(corpus, encoding="utf-8") if ln.strip()]
    texts, at = [], 0
    for i in range(300):
        k = 1 + (i * 7919) % 6 + 10 * (i % 37 == 0)  # 1 to 6 lines, now and then 11 to 16
        texts.append(" ".join(lines[at:at + k]))
        at += k
    path = os.path.join(work, "many.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    eos = tid(tok, "<|end_of_text|>")
    exs = [example("text", None, tok, {"text": t}, eos) for t in texts]
    sizes = {}
    for packing, open_max in (("best-fit", 64), ("in-order", 1)):
        out_dir = "many_" + packing
        rc, out = run_prepare(args, work, ["--jsonl", path, "--tokenizer", tok_dir, "--seq-len", str(T), "--text-field",
                                           "text", "--val-fraction", "0", "--pack", packing, "--out", out_dir])
        want = pack(exs, "split", eos, open_max)
        got = read_stream(os.path.join(work, out_dir), "train") if rc == 0 else ([], [], False, 0)
        fails.check(got[0] == want[0] and got[1] == want[1] and got[2], "300 documents --pack %s: %d ids and masks "
                    "identical to the reference (exit %d)" % (packing, len(want[0]), rc))
        fails.check(targets_stay_within(*got[:2]) and want[2] > 0, "300 documents --pack %s: %d longer than a "
                    "sequence split, and no sequence's last target learned from another example" % (packing, want[2]))
        lens = sorted(len(e[0]) for e in exs)
        stats = "median %d, 99th percentile %d, longest %d" % (lens[149], lens[296], lens[-1])  # ranks 150, 297, 300
        fails.check(stats in out and lens[296] < lens[-1], "300 documents --pack %s: lengths %s" % (packing, stats))
        sizes[packing] = (len(want[0]) - 1) // T, sum(1 for m in want[1][:-1] if m == 0)
    # a tenth held out, spread over the file (the default): the documents whose index hashes lowest
    held = val_lines(len(texts), len(texts) // 10, False)
    rc, out = run_prepare(args, work, ["--jsonl", path, "--tokenizer", tok_dir, "--seq-len", str(T), "--text-field",
                                       "text", "--val-fraction", "0.1", "--out", "many_val"])
    got_t = read_stream(os.path.join(work, "many_val"), "train") if rc == 0 else ([], [], False, 0)
    got_v = read_stream(os.path.join(work, "many_val"), "val") if rc == 0 else ([], [], False, 0)
    want_t = pack([e for k, e in enumerate(exs) if k not in held], "split", eos, 64)
    want_v = pack([e for k, e in enumerate(exs) if k in held], "split", eos, 64)
    fails.check(got_t[:2] == want_t[:2] and got_v[:2] == want_v[:2] and min(held) < 100 and max(held) >= 200,
                "300 documents, --val-fraction 0.1: the 30 whose index hashes lowest, from %d to %d, are the "
                "validation set (exit %d)" % (min(held), max(held), rc))
    # --system-prompt (with a newline, quotes and a backslash, which the template must carry
    # as a Jinja literal): a conversation whose first message is not the system's gets it
    # first, not learned; e2e_jsonl renders the template beside the shards with transformers
    with_system = [c if c[0]["role"] == "system" else [{"role": "system", "content": SYSTEM_PROMPT}] + c
                   for c in CONVERSATIONS]
    sys_path = os.path.join(work, "system.jsonl")
    with open(sys_path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS)
    for fmt, tk_name in (("llama3", "llama3"), ("chatml", "qwen2")):
        tk = toks[tk_name]
        eos = tid(tk, "<|eot_id|>" if fmt == "llama3" else "<|im_end|>")
        pad = tid(tk, "<|endoftext|>") if tk_name == "qwen2" else eos
        want = pack([example("messages", fmt, tk, {"messages": c}, eos) for c in with_system], "split", pad, 64)
        rc, out = run_prepare(args, work, ["--jsonl", sys_path, "--tokenizer", os.path.join(work, tk_name), "--seq-len",
                                           "64", "--messages-field", "messages", "--chat-format", fmt, "--system-prompt",
                                           SYSTEM_PROMPT, "--val-fraction", "0", "--out", "system_" + fmt])
        got = read_stream(os.path.join(work, "system_" + fmt), "train") if rc == 0 else ([], [], False, 0)
        fails.check(got[0] == want[0] and got[1] == want[1], "--system-prompt, %s: the conversations without a system "
                    "message get it first, not learned (%d tokens; exit %d%s)" % (fmt, len(want[0]), rc,
                                                                                  "" if rc == 0 else ": " + out[-200:]))

    # TRL's conversational prompt-completion: the completion's messages after the prompt's, only
    # the completion's assistant turns learned (the prompt's few-shot answers are not); found by
    # its keys without a field option too
    trl = [(c[:k], c[k:]) for c in CONVERSATIONS for k in [max(i for i, m in enumerate(c) if m["role"] == "assistant")]]
    trl_path = os.path.join(work, "trl.jsonl")
    with open(trl_path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in trl)
    tk, eos = toks["llama3"], tid(toks["llama3"], "<|eot_id|>")
    exs = []
    for p, c in trl:
        ids, mask = example("messages", "llama3", tk, {"messages": p + c}, eos)
        head, _ = example("messages", "llama3", tk, {"messages": p}, eos)
        assert ids[:len(head)] == head
        exs.append((ids, mask[:1] + [0] * (len(head) - 1) + mask[len(head):]))
    want = pack(exs, "split", eos, 64)
    for how, opt in (("--messages-field prompt,completion", ["--messages-field", "prompt,completion"]),
                     ("no field option", [])):
        rc, out = run_prepare(args, work, ["--jsonl", trl_path, "--tokenizer", os.path.join(work, "llama3"), "--seq-len",
                                           "64", "--chat-format", "llama3", "--val-fraction", "0", "--out", "trl"] + opt)
        got = read_stream(os.path.join(work, "trl"), "train") if rc == 0 else ([], [], False, 0)
        fails.check(got[0] == want[0] and got[1] == want[1] and (opt or "fields 'prompt' then 'completion'" in out),
                    "TRL's prompt/completion conversations (%s): the completion's assistant turns learned, the "
                    "prompt's not (%d tokens; exit %d%s)" % (how, len(want[0]), rc, "" if rc == 0 else ": " + out[-200:]))

    # no field option: the first example's keys say the layout, and the shards are those of
    # naming its fields; keys of no known layout are refused, exit 2, naming them
    prompt_path = os.path.join(work, "completion.jsonl")
    with open(prompt_path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"prompt": p, "completion": a["output"]}) + "\n" for p, a in zip(prompts, alpaca))
    layouts = [(os.path.join(work, "alpaca.jsonl"), ["--prompt-field", "instruction,input", "--response-field", "output"],
                "llama3", "Alpaca's instruction, input and output"),
               (prompt_path, ["--prompt-field", "prompt", "--response-field", "completion"], "llama3",
                "prompt/response in fields 'prompt' and 'completion'"),
               (os.path.join(work, "sharegpt.jsonl"), ["--messages-field", "conversations"], "qwen2",
                "a chat in field 'conversations'"),
               (os.path.join(work, "many.jsonl"), ["--text-field", "text"], "llama3", "a document in field 'text'")]
    for k, (path, named, tk_name, said) in enumerate(layouts):
        common = ["--jsonl", path, "--tokenizer", os.path.join(work, tk_name), "--seq-len", str(T), "--val-fraction", "0"]
        rc1, _ = run_prepare(args, work, common + named + ["--out", "layout_named%d" % k])
        rc2, out2 = run_prepare(args, work, common + ["--out", "layout_keys%d" % k])
        same = rc1 == 0 and rc2 == 0 and all(
            open(os.path.join(work, "layout_named%d" % k, f), "rb").read() ==
            open(os.path.join(work, "layout_keys%d" % k, f), "rb").read() for f in ("train_000000.bin", "tokenizer.json"))
        fails.check(same and ("layout: " + said) in out2, "%s without a field option: %s, the shards of naming %s "
                    "(exit %d, %d: %s)" % (os.path.basename(path), said, " ".join(named), rc1, rc2, out2.strip()[-120:]))
    odd = os.path.join(work, "odd.jsonl")
    with open(odd, "w") as f:
        f.write('\n{"question": "q", "answer": "a"}\n')
    rc, out = run_prepare(args, work, ["--jsonl", odd, "--tokenizer", tok_dir, "--seq-len", str(T), "--out", "odd"])
    fails.check(rc == 2 and odd + ":2: the first example's keys ('question', 'answer') are none of the layouts" in out,
                "keys of no known layout: exit 2, naming the line and its keys (exit %d: %s)" % (rc, out.strip()[-200:]))

    (s_bf, p_bf), (s_io, p_io) = sizes["best-fit"], sizes["in-order"]
    print("300 documents of %d tokens on average into sequences of %d: best fit %d sequences (%d tokens not learned), "
          "in order %d (%d)" % (sum(len(e[0]) for e in exs) // len(exs), T, s_bf, p_bf, s_io, p_io))
    fails.check(s_bf < s_io, "best fit packs 300 documents into fewer sequences than packing in order (%d vs %d)" % (
        s_bf, s_io))
    return fails.verdict("strata prepare --jsonl gives the reference's ids and masks")


if __name__ == "__main__":
    sys.exit(main())
