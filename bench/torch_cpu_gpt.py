"""A nanoGPT-style GPT-2 in PyTorch on the CPU, the comparison row of bench/bench_cpu.sh.

The same architecture and step as Strata's CPU backend: learned position embeddings,
pre-LayerNorm blocks (eps 1e-5), causal attention with biases, a 4x MLP with tanh GELU,
a final LayerNorm and an LM head tied to the token embedding; fp32; AdamW (betas 0.9/0.95,
eps 1e-8, weight decay 0.1 on matrices only) after a global gradient-norm clip at 1.0.
Attention is torch's fused scaled_dot_product_attention, as in nanoGPT. Like nanoGPT the
embedding has the padded vocabulary's rows (Vp) and the loss runs over all Vp logits
(Strata's over the first V of them: the same matrix products, 0.1% more softmax here).

Tokens come from an llm.c-format shard (the one Strata reads) or are random.
Prints one line: `ms_per_step <median> threads <n> adamw <impl>`.
  python bench/torch_cpu_gpt.py --layers 4 --channels 128 --heads 4 --seq 64 --batch 12 \\
      --vocab 256 [--padded-vocab N] [--steps 12] [--threads 2] [--data shard.bin]
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.nh = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, NH, T, Vp):
        super().__init__()
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the tied head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def batches(path, B, T, V):
    """(inputs, targets) of B rows of T tokens, consecutive windows of the shard."""
    if path:
        import numpy as np
        toks = np.fromfile(path, dtype=np.uint16, offset=1024).astype(np.int64) % V
        toks = torch.from_numpy(toks)
    else:
        toks = torch.randint(0, V, (1 << 20,))
    pos = 0
    while True:
        if pos + B * T + 1 > len(toks):
            pos = 0
        chunk = toks[pos:pos + B * T + 1]
        pos += B * T
        yield chunk[:-1].view(B, T), chunk[1:].view(B, T)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--channels", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--padded-vocab", type=int, default=0, help="0: vocab rounded up to 128")
    ap.add_argument("--steps", type=int, default=12, help="steps timed after 2 warm-up steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--adamw", choices=("fused", "foreach"), default="fused")
    ap.add_argument("--data", default="")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    Vp = a.padded_vocab or (a.vocab + 127) // 128 * 128
    model = GPT(a.layers, a.channels, a.heads, a.seq, Vp)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                            **{a.adamw: True})
    data = batches(a.data, a.batch, a.seq, a.vocab)
    times = []
    for step in range(a.steps + 2):
        t0 = time.perf_counter()
        x, y = next(data)
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        if step >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    if not math.isfinite(lv):
        raise SystemExit(f"non-finite loss {lv}")
    print(f"ms_per_step {statistics.median(times):.1f} threads {torch.get_num_threads()} "
          f"adamw {a.adamw} loss {lv:.4f}")


if __name__ == "__main__":
    main()
