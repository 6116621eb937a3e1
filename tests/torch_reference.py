#!/usr/bin/env python3
"""tests/torch_reference.py: Strata's GPT-2 against Hugging Face transformers' GPT2LMHeadModel.

Trains a tiny model with `strata train` (or, with --gpt2-124m-shape, takes one step of a
randomly initialised GPT-2 124M), exports it with `strata export --out DIR`, runs one
forward and backward with `strata dump-grads`, then loads DIR as it is with
GPT2LMHeadModel.from_pretrained (and, for the byte-level run, AutoTokenizer, which must
encode text to its UTF-8 bytes) and compares the logits, the loss and every parameter
gradient on the same batch.

The structure of both safetensors files, and the loss against the logits, are checked
first in plain Python; the comparison with PyTorch follows, and the script exits 77 (the
ctest skip code) when torch or transformers cannot be imported.

The small model's batch is dumped a third time from a 32-bit shard of the same tokens with a
loss mask (io/data.h) whose learned targets differ from row to row: the loss must be
PyTorch's mean over the learned targets alone (cross_entropy with ignore_index=-1), and
every gradient that mean's.

Errors are measured against PyTorch in float32 (as deployed) and in float64 (the more
exact oracle); both must be within tolerance:
  loss     |strata - torch| / |torch|                <= 1e-5
  logits   max |strata - torch| / max |torch|        <= 1e-5
  grad.*   ||strata - torch||_2 / ||torch||_2        <= 2e-5 (catches a GELU constant off by 2e-4)

With --device cuda the forward and backward run on the GPU in bf16 (fp32 accumulation and
master weights) and are held to bf16's precision: loss 1e-2, logits 5e-2, gradients 1e-1.

usage: torch_reference.py --strata BIN --workdir DIR [--gpt2-124m-shape] [--steps N] [--device cuda]
"""
import argparse
import array
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import time

from reference_common import Failures

SKIP = 77

HF_BLOCK_SUFFIXES = [
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
    "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
    "mlp.c_proj.weight", "mlp.c_proj.bias",
]


def hf_shapes(L, C, V, P):
    """The GPT2LMHeadModel parameters (lm_head tied, so absent), in Strata's order."""
    s = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [P, C]}
    per = {"ln_1.weight": [C], "ln_1.bias": [C], "attn.c_attn.weight": [C, 3 * C],
           "attn.c_attn.bias": [3 * C], "attn.c_proj.weight": [C, C], "attn.c_proj.bias": [C],
           "ln_2.weight": [C], "ln_2.bias": [C], "mlp.c_fc.weight": [C, 4 * C],
           "mlp.c_fc.bias": [4 * C], "mlp.c_proj.weight": [4 * C, C], "mlp.c_proj.bias": [C]}
    for l in range(L):
        for suffix in HF_BLOCK_SUFFIXES:
            s["transformer.h.%d.%s" % (l, suffix)] = per[suffix]
    s["transformer.ln_f.weight"] = [C]
    s["transformer.ln_f.bias"] = [C]
    return s


def run(cmd, cwd, what):
    t0 = time.time()
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.stdout.write(p.stdout)
        sys.exit("torch_reference: %s failed (exit %d): %s" % (what, p.returncode, " ".join(cmd)))
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    print("[%s] %.1f s: %s" % (what, time.time() - t0, last))
    return p.stdout


# ---- safetensors without dependencies ----

def read_safetensors_header(path, fails):
    """Parses and validates the layout; returns (header dict, metadata, data offset)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        raw = f.read(n)
    header = json.loads(raw.decode("utf-8"))
    meta = header.pop("__metadata__", {})
    fails.check((8 + n) % 8 == 0, "%s: data starts 8-byte aligned (header %d bytes)" % (os.path.basename(path), n))
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    pos, contiguous = 0, True
    for lo, hi, k in spans:
        v = header[k]
        numel = 1
        for d in v["shape"]:
            numel *= d
        if lo != pos or hi - lo != 4 * numel or v["dtype"] not in ("F32", "I32"):
            contiguous = False
            print("    bad entry %s: %s" % (k, v))
        pos = hi
    fails.check(contiguous and 8 + n + pos == size,
                "%s: %d tensors tile the data exactly (%d bytes)" % (os.path.basename(path), len(header), pos))
    fails.check(meta.get("format") == "pt", "%s: __metadata__ format is 'pt'" % os.path.basename(path))
    return header, meta, 8 + n


def read_tensor(path, header, base, name):
    v = header[name]
    lo, hi = v["data_offsets"]
    with open(path, "rb") as f:
        f.seek(base + lo)
        buf = f.read(hi - lo)
    a = array.array("f" if v["dtype"] == "F32" else "i")
    a.frombytes(buf)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def structural_checks(export_path, grads_path, fails):
    print("structure (plain Python):")
    wh, wmeta, _ = read_safetensors_header(export_path, fails)
    gh, gmeta, gbase = read_safetensors_header(grads_path, fails)
    L, C = int(wmeta["strata.n_layer"]), int(wmeta["strata.n_embd"])
    V, P = int(wmeta["strata.vocab_size"]), int(wmeta["strata.n_positions"])
    expect = hf_shapes(L, C, V, P)
    got = {k: v["shape"] for k, v in wh.items()}
    fails.check(got == expect, "export holds exactly the %d GPT-2 parameters with HF names and shapes "
                "(wte cut to %d rows, no lm_head)" % (len(expect), V))
    fails.check(all(v["dtype"] == "F32" for v in wh.values()), "export: every tensor is F32")
    fails.check("strata.config" in wmeta and "strata.step" in wmeta, "export: metadata carries config and step")
    B, T = int(gmeta["strata.batch"]), int(gmeta["strata.seq_len"])
    fails.check({k[5:]: v["shape"] for k, v in gh.items() if k.startswith("grad.")} == expect,
                "dump: one grad.<name> per parameter, same shapes")
    fails.check(gh["logits"]["shape"] == [B, T, V] and gh["inputs"]["shape"] == [B, T] and
                gh["inputs"]["dtype"] == "I32" and gh["targets"]["dtype"] == "I32" and gh["loss"]["shape"] == [1],
                "dump: loss [1], logits [%d,%d,%d], inputs/targets [%d,%d] I32" % (B, T, V, B, T))
    fails.check(float(gmeta["strata.wte_padding_grad_max_abs"]) == 0.0,
                "dump: gradient of wte's padding rows is exactly 0")
    if B * T * V <= 1 << 20:
        logits = read_tensor(grads_path, gh, gbase, "logits")
        targets = read_tensor(grads_path, gh, gbase, "targets")
        loss = read_tensor(grads_path, gh, gbase, "loss")[0]
        total = 0.0
        for r in range(B * T):
            row = logits[r * V:(r + 1) * V]
            m = max(row)
            total += m + math.log(sum(math.exp(x - m) for x in row)) - row[targets[r]]
        ce = total / (B * T)
        fails.check(abs(ce - loss) <= 1e-5 * abs(ce), "dump: loss %.7f = mean cross-entropy of its logits %.7f"
                    % (loss, ce))
    return wmeta, gmeta


# ---- data and configs ----

def make_text_corpus(path, n_words, seed):
    rng = random.Random(seed)
    words = ("the of and to in is was that for it with as his on be at by had he not are but from or "
             "have an they which one you were her all she there would their we him been has when who will "
             "more no if out so said what up its about into than them can only other new some could time "
             "these two may then do first any my now such like our over man me even most made after").split()
    out = []
    for i in range(n_words):
        w = rng.choice(words)
        out.append(w.capitalize() if i % 13 == 0 else w)
        if i % 17 == 16:
            out.append(".\n")
    with open(path, "w") as f:
        f.write(" ".join(out))


def write_token_shard(path, tokens):
    header = array.array("i", [0] * 256)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    body = array.array("H", tokens)
    if sys.byteorder != "little":
        header.byteswap()
        body.byteswap()
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(body.tobytes())


def write_masked_shard(path, tokens, mask):
    """Strata's 32-bit shard with a loss mask: version 2, header[3] bit 0, uint32 tokens, mask bytes."""
    header = array.array("i", [0] * 256)
    header[0], header[1], header[2], header[3] = 20240520, 2, len(tokens), 1
    body = array.array("I", tokens)
    if sys.byteorder != "little":
        header.byteswap()
        body.byteswap()
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(body.tobytes())
        f.write(bytes(mask))


def read_token_shard(path):
    with open(path, "rb") as f:
        raw = f.read()
    header = array.array("i", raw[:1024])
    body = array.array("H", raw[1024:1024 + 2 * header[2]])
    if sys.byteorder != "little":
        body.byteswap()
    return list(body)


def masked_copy(data_glob, work):
    """The first shard of data_glob again, 32-bit with a mask: runs of learned and masked
    targets of uneven lengths, so the rows of a batch learn different numbers of tokens."""
    src = sorted(__import__("glob").glob(data_glob))[0]
    tokens = read_token_shard(src)
    mask = [0 if (i * 7 // 13) % 3 == 0 or (i // 40) % 4 == 1 else 1 for i in range(len(tokens))]
    d = os.path.join(work, "mdata")
    os.makedirs(d, exist_ok=True)
    write_masked_shard(os.path.join(d, "train_000000.bin"), tokens, mask)
    return os.path.join(d, "train_*.bin")


def prepare(args, work):
    """Returns (config path, data glob, dump-grads batch, dump-grads seq)."""
    data = os.path.join(work, "data")
    cfg = os.path.join(work, "model.yaml")
    if args.gpt2_124m_shape:
        os.makedirs(data, exist_ok=True)
        rng = random.Random(1234)
        write_token_shard(os.path.join(data, "train_000000.bin"), [rng.randrange(50257) for _ in range(16384)])
        text = """device: cpu
model: {n_layer: 12, n_head: 12, n_embd: 768, seq_len: 1024, vocab_size: 50257}
data: {train: "%s/train_*.bin", val: "", shuffle: false}
train: {steps: %d, micro_batch: 1, seq_len: 64, log_every: 1, sample_tokens: 0, eval_every: 0}
optim: {lr: 6e-4, min_lr: 6e-5, warmup_steps: 0}
run: {dir: "%s/run", keep: 1}
""" % (data, args.steps, work)
        batch, seq = 2, 64
    else:
        corpus = os.path.join(work, "corpus.txt")
        make_text_corpus(corpus, 40000, 7)
        run([args.strata, "prepare", "--text", corpus, "--out", data, "--val-fraction", "0.05"], work, "prepare")
        # padded vocab 384 > 256 exercises the cut of wte's padding rows on export
        text = """device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 256, padded_vocab_size: 384}
data: {train: "%s/train_*.bin", val: "", shuffle: true}
train: {steps: %d, micro_batch: 8, log_every: 10, sample_tokens: 0, eval_every: 0}
optim: {lr: 1e-2, min_lr: 1e-3, warmup_steps: 2}
run: {dir: "%s/run", keep: 1}
""" % (data, args.steps, work)
        batch, seq = 4, 32
    with open(cfg, "w") as f:
        f.write(text)
    return cfg, os.path.join(data, "train_*.bin"), batch, seq


# ---- the comparison ----

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=os.environ.get("STRATA", "strata"), help="the strata binary")
    ap.add_argument("--workdir", required=True, help="scratch directory (emptied first)")
    ap.add_argument("--gpt2-124m-shape", action="store_true",
                    help="GPT-2 124M shape (12/12/768, vocab 50257), one step from random init")
    ap.add_argument("--steps", type=int, default=None, help="training steps before the comparison")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where strata dump-grads computes: cpu (fp32) or cuda (bf16)")
    args = ap.parse_args()
    if args.steps is None:
        args.steps = 1 if args.gpt2_124m_shape else 20
    args.strata = os.path.abspath(args.strata) if os.sep in args.strata else shutil.which(args.strata) or args.strata
    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    fails = Failures()

    cfg, data_glob, B, T = prepare(args, work)
    run([args.strata, "train", cfg], work, "train %d step%s" % (args.steps, "s" if args.steps > 1 else ""))
    hf_dir = os.path.join(work, "hf")
    export = os.path.join(hf_dir, "model.safetensors")
    grads = os.path.join(work, "grads.safetensors")
    run([args.strata, "export", "run", "--out", hf_dir], work, "export")
    dump_cmd = [args.strata, "dump-grads", "run", "--data", data_glob, "--batch", str(B), "--seq", str(T),
                "--device", args.device]
    run(dump_cmd + ["--out", grads], work, "dump-grads")
    dumps = [("plain", grads)]
    if not args.gpt2_124m_shape:
        # the same batch with block 0 recomputed in backward (activation checkpointing)
        grads_ckpt = os.path.join(work, "grads_recompute.safetensors")
        run(dump_cmd + ["--out", grads_ckpt, "--set", "train.activation_checkpointing=every:2"], work,
            "dump-grads, recompute")
        dumps.append(("recompute", grads_ckpt))
        # the same tokens with a loss mask: the mean over the learned targets alone
        grads_masked = os.path.join(work, "grads_masked.safetensors")
        mcmd = [args.strata, "dump-grads", "run", "--data", masked_copy(data_glob, work), "--batch", str(B), "--seq",
                str(T), "--device", args.device]
        run(mcmd + ["--out", grads_masked], work, "dump-grads, masked")
        dumps.append(("masked", grads_masked))
    wmeta, gmeta = structural_checks(export, grads, fails)

    try:
        import torch
        import torch.nn.functional as F
        from safetensors.torch import load_file
        from transformers import GPT2Config, GPT2LMHeadModel
    except Exception as e:  # ImportError, or a broken install
        print("SKIP: torch/transformers/safetensors not importable (%s); the structural checks above %s" %
              (e, "passed" if not fails.items else "FAILED"))
        return 1 if fails.items else SKIP

    import transformers
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    L, NH, C = int(wmeta["strata.n_layer"]), int(wmeta["strata.n_head"]), int(wmeta["strata.n_embd"])
    V, P = int(wmeta["strata.vocab_size"]), int(wmeta["strata.n_positions"])
    print("transformers: GPT2LMHeadModel n_layer %d n_head %d n_embd %d n_positions %d vocab %d "
          "(torch %s, transformers %s)" % (L, NH, C, P, V, torch.__version__, transformers.__version__))

    # 1. from_pretrained on the exported directory as it is: the way users will load it
    model, info = GPT2LMHeadModel.from_pretrained(hf_dir, output_loading_info=True, torch_dtype=torch.float32,
                                                  attn_implementation="eager")
    print("loading:")
    c = model.config
    fails.check((c.n_layer, c.n_head, c.n_embd, c.n_positions, c.vocab_size) == (L, NH, C, P, V) and
                c.activation_function == "gelu_new" and c.tie_word_embeddings,
                "from_pretrained(DIR): config.json gives the model's shape, gelu_new, tied embeddings")
    fails.check(not info["missing_keys"] and not info["unexpected_keys"] and not info.get("mismatched_keys"),
                "from_pretrained: no missing, unexpected or mismatched keys (%s)" %
                {k: list(v) for k, v in info.items() if v})
    fails.check(model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(),
                "from_pretrained: lm_head is tied to transformer.wte")
    hf_cfg = model.config
    if os.path.exists(os.path.join(hf_dir, "tokenizer.json")):
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(hf_dir)
        text = "Byte-level: h\u00e9llo, \u4f60\u597d \U0001F600\r\n  spaces\tand tabs"
        ids = tok(text)["input_ids"]
        fails.check(ids == list(text.encode("utf-8")) and tok.decode(ids) == text,
                    "AutoTokenizer.from_pretrained(DIR) (%s): the byte-level run's tokenizer encodes text to its UTF-8 "
                    "bytes and decodes them back" % type(tok).__name__)
    # 2. load_state_dict on a fresh model: only the tied lm_head may be reported missing
    sd = load_file(export)
    fresh = GPT2LMHeadModel(hf_cfg)
    res = fresh.load_state_dict(sd, strict=False)
    fails.check(set(res.missing_keys) <= {"lm_head.weight"} and not res.unexpected_keys,
                "load_state_dict(strict=False): missing %s, unexpected %s" %
                (list(res.missing_keys), list(res.unexpected_keys)))
    same = all(torch.equal(model.state_dict()[k], v) for k, v in sd.items())
    fails.check(same, "from_pretrained weights equal the file's bit for bit")

    def reference(dtype, inputs, targets):
        m = model.to(dtype)
        m.eval()  # dropout is 0 anyway; eval keeps it off for certain
        m.zero_grad(set_to_none=True)
        logits = m(input_ids=inputs).logits
        loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1)  # -1: masked
        loss.backward()
        named = dict(m.named_parameters())
        g = {k: named[k].grad.detach().clone() for k in sd}
        return loss.detach(), logits.detach(), g

    g0 = load_file(grads)
    inputs, targets = g0["inputs"].long(), g0["targets"].long()
    t0 = time.time()
    ref32 = reference(torch.float32, inputs, targets)
    ref64 = reference(torch.float64, inputs, targets)
    model.to(torch.float32)
    print("torch forward+backward, fp32 and fp64: %.1f s" % (time.time() - t0))

    tol = {"loss": 1e-5, "logits": 1e-5, "grad": 2e-5}
    if args.device == "cuda":  # bf16 has 8 bits of mantissa: about 4e-3 per rounding
        tol = {"loss": 1e-2, "logits": 5e-2, "grad": 1e-1}

    def rel_norm(a, b):
        b = b.double()
        return ((a.double() - b).norm() / b.norm().clamp_min(1e-300)).item()

    for label, path in dumps:
        d = load_file(path)
        if label != "masked":
            fails.check(torch.equal(d["inputs"], g0["inputs"]) and torch.equal(d["targets"], g0["targets"]),
                        "%s: same batch as the first dump" % label)
        else:
            t = d["targets"]
            learned = (t >= 0).sum(dim=1).tolist()
            fails.check(torch.equal(d["inputs"], g0["inputs"]) and torch.equal(t[t >= 0], g0["targets"][t >= 0]) and
                        0 < sum(learned) < t.numel() and len(set(learned)) > 1,
                        "masked: the same batch, %d of %d targets learned, per row %s" % (sum(learned), t.numel(),
                                                                                        learned))
            ref32 = reference(torch.float32, inputs, t.long())
            ref64 = reference(torch.float64, inputs, t.long())
            model.to(torch.float32)
        loss = d["loss"].double()[0]
        logits = d["logits"]
        rows = []
        # (name, shape, |ref64|, err vs torch fp32, err vs torch fp64, torch fp32 vs fp64, tolerance)
        l32, l64 = ref32[0].double(), ref64[0]
        rows.append(("loss", "[1]", l64.abs().item(), (abs(loss - l32) / abs(l32)).item(),
                     (abs(loss - l64) / abs(l64)).item(), (abs(l32 - l64) / abs(l64)).item(), tol["loss"]))
        scale = ref64[1].abs().max()
        rows.append(("logits (max abs / max|ref|)", str(list(logits.shape)), scale.item(),
                     ((logits.double() - ref32[1].double()).abs().max() / scale).item(),
                     ((logits.double() - ref64[1]).abs().max() / scale).item(),
                     ((ref32[1].double() - ref64[1]).abs().max() / scale).item(), tol["logits"]))
        for k in sd:
            s, r32, r64 = d["grad." + k], ref32[2][k], ref64[2][k]
            rows.append(("grad." + k, str(list(s.shape)), r64.double().norm().item(), rel_norm(s, r32),
                         rel_norm(s, r64), rel_norm(r32, r64), tol["grad"]))
        print("\n%s dump vs transformers (%d x %d tokens; errors relative: grads by L2 norm)" % (label, *inputs.shape))
        print("%-44s %-14s %11s %11s %11s %11s %8s  %s" % ("tensor", "shape", "|ref|", "vs torch32", "vs torch64",
                                                          "t32 vs t64", "tol", ""))
        worst = 0.0
        for name, shape, norm, e32, e64, e_t, tl in rows:
            ok = e32 <= tl and e64 <= tl and math.isfinite(e32) and math.isfinite(e64)
            worst = max(worst, e64 / tl)
            print("%-44s %-14s %11.4e %11.3e %11.3e %11.3e %8.0e  %s" % (name, shape, norm, e32, e64, e_t, tl,
                                                                        "ok" if ok else "FAIL"))
            if not ok:
                fails.items.append("%s: %s error %.3e / %.3e exceeds %.0e" % (label, name, e32, e64, tl))
        print("%s: strata loss %.7f, torch fp32 %.7f, fp64 %.7f; worst error / tolerance %.3f" %
              (label, loss.item(), l32.item(), l64.item(), worst))

    return fails.verdict("strata matches transformers' GPT2LMHeadModel")


if __name__ == "__main__":
    sys.exit(main())
