#!/usr/bin/env python3
"""bench/fsdp2_offload.py: the PyTorch baseline for Strata's optimizer offload.

GPT-2 1.5B (transformers GPT2LMHeadModel), one GPU, FSDP2 (fully_shard per block and at
the root) with CPUOffloadPolicy: parameters, gradients and AdamW state live in CPU memory
and the optimizer step runs on the CPU. bf16 compute with fp32 reduction, activation
checkpointing per block only with --checkpointing, B=8, T=1024 by default.

Prints one markdown table row: seconds per step (median of the steps after warm-up),
tokens/s and peak GPU memory (torch.cuda.max_memory_allocated, and the device's used
memory as nvidia-smi reports it, which includes the CUDA context).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--embd", type=int, default=1600)
    ap.add_argument("--heads", type=int, default=25)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--checkpointing", action="store_true", help="recompute each block in backward")
    args = ap.parse_args()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=args.layers, n_head=args.heads, n_embd=args.embd, n_positions=args.seq,
                     vocab_size=50257, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    model = GPT2LMHeadModel(cfg)
    if args.checkpointing:
        model.gradient_checkpointing_enable()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    off = CPUOffloadPolicy()
    for block in model.transformer.h:
        fully_shard(block, mp_policy=mp, offload_policy=off)
    fully_shard(model, mp_policy=mp, offload_policy=off)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.1)
    x = torch.randint(0, 50257, (args.batch, args.seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        t = time.time()
        loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.time() - t)
    s = statistics.median(times[args.warmup:])
    free, total = torch.cuda.mem_get_info()
    n = sum(p.numel() for p in model.parameters())
    ck = ", activation checkpointing" if args.checkpointing else ""
    # model FLOPs a token, counted as Strata counts them: 6 (12 L C^2 + V C) + 12 L C T
    L, C, T = args.layers, args.embd, args.seq
    flops = 6 * (12 * L * C * C + 50257 * C) + 12 * L * C * T
    tps = args.batch * args.seq / s
    print(f"| PyTorch {torch.__version__} FSDP2 + CPUOffloadPolicy ({n / 1e9:.2f} B params{ck}) | {s:.3f} | "
          f"{tps:,.0f} | {tps * flops / 1e12:.1f} | {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB allocated, "
          f"{(total - free) / 2**30:.2f} GiB device used | | |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
