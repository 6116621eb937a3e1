"""transformers' LlamaForCausalLM on the CPU, the comparison row of bench/bench_cpu_llama.sh.

The model a user would run in PyTorch: LlamaForCausalLM with attn_implementation="sdpa"
(torch's fused scaled_dot_product_attention), fp32, untied head, grouped-query attention;
AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices only, fused) after a global
gradient-norm clip at 1.0, as Strata's step does. Tokens come from an llm.c-format shard.
Prints one line: `ms_per_step <median> threads <n> loss <last>`.
  python bench/torch_cpu_llama.py --layers 8 --channels 512 --heads 8 --kv-heads 2 \\
      --intermediate 1536 --seq 256 --batch 4 --vocab 256 [--steps 10] [--threads 2] [--data shard.bin]
"""
import argparse
import math
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def batches(path, B, T, V):
    """(inputs, targets) of B rows of T tokens, consecutive windows of the shard."""
    import numpy as np
    toks = torch.from_numpy(np.fromfile(path, dtype=np.uint16, offset=1024).astype(np.int64) % V)
    pos = 0
    while True:
        if pos + B * T + 1 > len(toks):
            pos = 0
        chunk = toks[pos:pos + B * T + 1]
        pos += B * T
        yield chunk[:-1].view(B, T), chunk[1:].view(B, T)


def main():
    ap = argparse.ArgumentParser()
    for k in ("layers", "channels", "heads", "kv-heads", "intermediate", "seq", "batch", "vocab"):
        ap.add_argument("--" + k, type=int, required=True)
    ap.add_argument("--steps", type=int, default=10, help="steps timed after 2 warm-up steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", required=True)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.channels, intermediate_size=a.intermediate,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      max_position_embeddings=a.seq, tie_word_embeddings=False, attention_dropout=0.0)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    data = batches(a.data, a.batch, a.seq, a.vocab)
    times = []
    for step in range(a.steps + 2):
        t0 = time.perf_counter()
        x, y = next(data)
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        if step >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
    if not math.isfinite(lv):
        raise SystemExit(f"non-finite loss {lv}")
    print(f"ms_per_step {statistics.median(times):.1f} threads {torch.get_num_threads()} loss {lv:.4f}")


if __name__ == "__main__":
    main()
