"""PyTorch's CPU AdamW on the same problem as bench/bench_cpu_adam.c (one flat fp32
parameter of n elements), for the offload comparison: the default (foreach) and the
single-tensor implementation. Prints markdown rows."""
import sys
import time

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 24
torch.manual_seed(0)
for name, kw in (("foreach", {"foreach": True}), ("single-tensor", {"foreach": False})):
    p = torch.nn.Parameter(torch.randn(n) * 0.01)
    p.grad = torch.randn(n) * 0.01
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kw)
    opt.step()
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t)
    ms = best * 1e3
    print(f"| PyTorch {torch.__version__} AdamW ({name}) | {torch.get_num_threads()} | {ms:.1f} | "
          f"{n / ms / 1e6:.2f} | {28 * n / ms / 1e6:.1f} |")
