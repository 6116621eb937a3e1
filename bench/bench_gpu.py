"""The rows and the table of bench/bench_gpu.sh: GPT-2 training speed, Strata against PyTorch.

Three subcommands, each row one JSON line (appended to --out, or printed):
  torch   one PyTorch row: --impl nanogpt (bench/torch_cpu_gpt.py's model: fused
          scaled_dot_product_attention, a tied head) or hf (transformers' GPT2LMHeadModel,
          attn_implementation="sdpa"); eager, or --compile (torch.compile); bf16 autocast,
          fused AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), random tokens.
          --device cpu --tiny runs a 2-layer model on the CPU (a smoke test of this file).
  strata  a Strata row from a run's metrics.jsonl (the median of the steps after --skip).
  render  the markdown table of rows.jsonl: per size, tokens/s, ms/step, model TFLOP/s and
          MFU against --peak TFLOP/s, peak memory, and the ratio to torch.compile's tokens/s
          (the nanoGPT compile row of the same size).
Model FLOPs per token are Strata's count for every row (core/model.c): 6 N + 12 L C T with
N = 12 L C^2 + V C, so every row's TFLOP/s is its tokens/s times the same number.

  python bench/bench_gpu.py torch --impl nanogpt --compile --size 124m --batch 16 --out rows.jsonl
  python bench/bench_gpu.py strata --name "Strata stage 0" --size 124m --batch 16 --metrics runs/b/metrics.jsonl --out rows.jsonl
  python bench/bench_gpu.py render --rows rows.jsonl --peak 989
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

SIZES = {  # layers, channels, heads
    "124m": (12, 768, 12),
    "350m": (24, 1024, 16),
    "774m": (36, 1280, 20),
    "1.5b": (48, 1600, 25),
}
VOCAB, SEQ = 50257, 1024
TINY = {"layers": 2, "channels": 64, "heads": 2, "vocab": 256, "seq": 64}


def flops_per_token(L, C, V, T):
    """Strata's strata_model_flops_per_token: training FLOPs of one token."""
    return 6.0 * (12.0 * L * C * C + V * C) + 12.0 * L * C * T


def emit(row, out):
    line = json.dumps(row)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")
    print(line)


def shape_of(a):
    if a.tiny:
        return dict(TINY, size="tiny")
    L, C, H = SIZES[a.size]
    return {"layers": L, "channels": C, "heads": H, "vocab": VOCAB, "seq": SEQ, "size": a.size}


# ---- torch ----

def build_model(impl, s, device):
    import torch
    if impl == "nanogpt":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from torch_cpu_gpt import GPT
        Vp = (s["vocab"] + 127) // 128 * 128
        m = GPT(s["layers"], s["channels"], s["heads"], s["seq"], Vp).to(device)
        return m, lambda model, x: model(x, x)
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=s["layers"], n_head=s["heads"], n_embd=s["channels"], n_positions=s["seq"],
                     vocab_size=s["vocab"], bos_token_id=s["vocab"] - 1, eos_token_id=s["vocab"] - 1,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    m = GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa").to(device)
    if m.config._attn_implementation != "sdpa":
        raise SystemExit(f"transformers gave attention {m.config._attn_implementation!r}, not sdpa")
    return m, lambda model, x: model(x, labels=x).loss


def run_torch(a):
    import torch
    s = shape_of(a)
    dev = a.device
    torch.manual_seed(1337)
    model, loss_of = build_model(a.impl, s, dev)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_model = torch.compile(model) if a.compile else model
    x = torch.randint(0, s["vocab"], (a.batch, s["seq"]), device=dev)
    cuda = dev.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, loss = [], float("nan")
    for i in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16):
            l = loss_of(step_model, x)
        l.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
        loss = l.item()
    if not math.isfinite(loss):
        raise SystemExit(f"non-finite loss {loss}")
    sec = statistics.median(times)
    row = dict(s, run=f"PyTorch {'nanoGPT' if a.impl == 'nanogpt' else 'HF GPT2LMHeadModel sdpa'} "
                      f"{'torch.compile' if a.compile else 'eager'}",
               impl=a.impl, compile=bool(a.compile), batch=a.batch, device=dev, steps=len(times),
               tok_s=a.batch * s["seq"] / sec, ms_step=sec * 1e3, loss=loss, torch=torch.__version__)
    if cuda:
        free, total = torch.cuda.mem_get_info()
        row.update(peak_alloc_bytes=torch.cuda.max_memory_allocated(), peak_reserved_bytes=torch.cuda.max_memory_reserved(),
                   device_used_bytes=total - free, gpu=torch.cuda.get_device_name())
    return row


# ---- strata ----

def run_strata(a):
    rows = [json.loads(l) for l in open(a.metrics) if l.strip()]
    steps = [r for r in rows if "step_ms" in r][a.skip:]
    if not steps:
        raise SystemExit(f"{a.metrics}: no step after the first {a.skip}")
    s = shape_of(a)
    ms = statistics.median(r["step_ms"] for r in steps)
    row = dict(s, run=a.name, batch=a.batch, steps=len(steps), tok_s=statistics.median(r["tokens_per_s"] for r in steps),
               ms_step=ms, loss=steps[-1]["loss"], peak_alloc_bytes=max(r["peak_mem_bytes"] for r in steps))
    used = max(r.get("device_used_peak_bytes", 0) for r in steps)
    if used:
        row["device_used_bytes"] = used
    return row


# ---- render ----

def gib(b):
    return "-" if not b else f"{b / 2**30:.2f}" if b >= 2**30 else f"{b / 2**30:.3g}"


def num(x):
    """1 decimal for the sizes that matter, 3 significant digits for a smoke test's."""
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def render(rows, peak):
    by_size = {}
    for r in rows:
        by_size.setdefault(r.get("size", "?"), []).append(r)
    order = [k for k in SIZES if k in by_size] + [k for k in by_size if k not in SIZES]
    out = []
    for size in order:
        rs = by_size[size]
        ok = [r for r in rs if "tok_s" in r]
        ref = next((r for r in ok if r.get("impl") == "nanogpt" and r.get("compile")), None)
        head = ok[0] if ok else rs[0]
        torch_versions = sorted({r["torch"] for r in ok if r.get("torch")})
        out.append(f"GPT-2 {size}: {head.get('layers', '?')} layers, {head.get('channels', '?')} channels, "
                   f"B={head.get('batch', '?')}, T={head.get('seq', '?')}, bf16; MFU against {peak:g} TFLOP/s"
                   + "".join(f"; PyTorch {v}" for v in torch_versions))
        out.append("")
        out.append("| run | tokens/s | ms/step | model TFLOP/s | MFU | peak memory GiB (allocator / device in use) | x torch.compile |")
        out.append("|---|---|---|---|---|---|---|")
        for r in rs:
            if "tok_s" not in r:
                out.append(f"| {r['run']} | failed: {r.get('error', '?')} | | | | | |")
                continue
            tf = r["tok_s"] * flops_per_token(r["layers"], r["channels"], r["vocab"], r["seq"]) / 1e12
            alloc = r.get("peak_reserved_bytes") or r.get("peak_alloc_bytes", 0)
            ratio = f"{r['tok_s'] / ref['tok_s']:.2f}x" if ref else "-"
            out.append(f"| {r['run']} | {r['tok_s']:,.0f} | {r['ms_step']:.1f} | {num(tf)} | {num(100 * tf / peak)}% | "
                       f"{gib(alloc)} / {gib(r.get('device_used_bytes', 0))} | {ratio} |")
        out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("torch")
    t.add_argument("--impl", choices=("nanogpt", "hf"), required=True)
    t.add_argument("--compile", action="store_true")
    t.add_argument("--size", choices=tuple(SIZES), default="124m")
    t.add_argument("--batch", type=int, required=True)
    t.add_argument("--steps", type=int, default=10, help="timed steps (the median is reported)")
    t.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation, autotuning)")
    t.add_argument("--device", default="cuda")
    t.add_argument("--tiny", action="store_true", help="a 2-layer, 64-channel model (smoke test)")
    t.add_argument("--out", default="")
    s = sub.add_parser("strata")
    s.add_argument("--name", required=True)
    s.add_argument("--size", choices=tuple(SIZES), default="124m")
    s.add_argument("--batch", type=int, required=True)
    s.add_argument("--metrics", required=True)
    s.add_argument("--skip", type=int, default=3, help="steps left out first (warm-up)")
    s.add_argument("--tiny", action="store_true")
    s.add_argument("--out", default="")
    f = sub.add_parser("fail", help="a row that did not finish, with why")
    f.add_argument("--name", required=True)
    f.add_argument("--size", choices=tuple(SIZES) + ("tiny",), default="124m")
    f.add_argument("--error", required=True)
    f.add_argument("--out", default="")
    r = sub.add_parser("render")
    r.add_argument("--rows", required=True)
    r.add_argument("--peak", type=float, default=float(os.environ.get("PEAK_TFLOPS", 989)))
    a = ap.parse_args()
    if a.cmd == "torch":
        emit(run_torch(a), a.out)
    elif a.cmd == "strata":
        emit(run_strata(a), a.out)
    elif a.cmd == "fail":
        emit({"run": a.name, "size": a.size, "error": a.error}, a.out)
    else:
        print(render([json.loads(l) for l in open(a.rows) if l.strip()], a.peak))


if __name__ == "__main__":
    main()
