"""Writes a GPT-2 124M checkpoint with random weights in llm.c's format (header of 256
int32: magic 20240326, version 3, maxT, V, L, NH, C, Vp; then fp32 parameters in its
order), so llm.c's CPU trainer can be timed without downloading weights."""
import struct
import sys

import numpy as np

maxT, V, L, NH, C, Vp = 1024, 50257, 12, 12, 768, 50304
sizes = [Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C,
         L * 4 * C * C, L * 4 * C, L * 4 * C * C, L * C, C, C]
header = np.zeros(256, dtype=np.int32)
header[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
rng = np.random.default_rng(0)
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    for n in sizes:
        f.write((rng.standard_normal(n, dtype=np.float32) * 0.02).tobytes())
