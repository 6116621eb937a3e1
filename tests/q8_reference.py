"""tests/q8_reference.py: 8-bit block-wise quantization and one 8-bit AdamW step in NumPy,
written from Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (2022), as the
reference Strata's CPU code must equal exactly (tests/e2e_q8_reference.sh).

    python3 q8_reference.py DIR      # DIR: what `test_quant --dump DIR` wrote

The paper's dynamic quantization: a value in [-1, 1] is sign x 10^-E x fraction, E the
number of leading zero bits after the sign (0..6), then an indicator bit, the remaining bits
a linear fraction in [0.1, 1] read at the midpoints of its intervals. With 7 bits after the
sign, exponent 10^(j-6) keeps j fraction bits: 2^j values of each sign. The map for the
second moment (never negative) spends the sign bit on the fraction: 2^(j+1) values. Both
add 0 and 1. Block-wise: each block of 2048 values is divided by its absmax before the
nearest map value is taken; the state is (code, absmax).

Strata's choices, which this file follows: the map built in float64 (b_k = 0.1 + 0.9 k / F,
midpoint (b_k + b_{k+1}) / 2, times the decimal 10^(j-6)), rounded once to float32, sorted;
"nearest" is decided by the float32 midpoints between neighbours, a value on a midpoint
taking the lower code (np.searchsorted side='left'), except that a positive value never
takes code 0 (the unsigned map's 0: a positive value below its first midpoint takes code
1, so a second moment once positive is never stored as 0); x / absmax is one float32 division, 0
when the absmax is 0; the AdamW step is core/kernels.h's, one float32 operation at a time.
Exits 0 when every array matches bit for bit, 1 otherwise."""
import os
import sys

import numpy as np

F32 = np.float32
BLOCK = 2048


def dynamic_map(signed):
    vals = []
    for j in range(7):
        scale = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0][j]  # decimal literals, as Strata's
        F = 2 ** j if signed else 2 ** (j + 1)
        k = np.arange(F, dtype=np.float64)
        lo = 0.1 + 0.9 * k / F
        hi = 0.1 + 0.9 * (k + 1) / F
        v = scale * ((lo + hi) / 2.0)
        vals.append(v)
        if signed:
            vals.append(-v)
    vals.append(np.array([0.0, 1.0]))
    m = np.sort(np.concatenate(vals).astype(F32))
    assert m.size == 256 and np.all(np.diff(m) > 0)
    return m


def midpoints(m):
    return ((m[:-1] + m[1:]) * F32(0.5)).astype(F32)


MAPS = {True: dynamic_map(True), False: dynamic_map(False)}
MIDS = {s: midpoints(m) for s, m in MAPS.items()}


def absmax(x):
    return F32(np.max(np.abs(x))) if x.size else F32(0)


def quantize(x, amax, signed):
    """codes of x (float32) with the block's absmax amax"""
    with np.errstate(all="ignore"):
        xn = (x / amax).astype(F32) if amax > 0 else np.zeros_like(x)
    code = np.searchsorted(MIDS[signed], xn, side="left")
    # a positive value never takes code 0 (only the unsigned map's 0 lies below it): a second
    # moment once positive is never stored as 0, or m / sqrt(v) would be m / eps
    code[(code == 0) & (xn > 0)] = 1
    return code.astype(np.uint8)


def dequantize(code, amax, signed):
    return (MAPS[signed][code] * F32(amax)).astype(F32)


def quantize_blocks(x, signed):
    n = x.size
    nb = (n + BLOCK - 1) // BLOCK
    amax = np.zeros(nb, F32)
    code = np.zeros(n, np.uint8)
    for b in range(nb):
        blk = x[b * BLOCK:(b + 1) * BLOCK]
        amax[b] = absmax(blk)
        code[b * BLOCK:(b + 1) * BLOCK] = quantize(blk, amax[b], signed)
    back = np.concatenate([dequantize(code[b * BLOCK:(b + 1) * BLOCK], amax[b], signed) for b in range(nb)])
    return amax, code, back


def adamw(p, m, v, g, a, wd):
    """core/kernels.h's order, float32 throughout"""
    lr, b1, b2, eps, _, bc1, bc2, gs = (F32(x) for x in a)
    one = F32(1)
    with np.errstate(all="ignore"):
        g = g * gs
        m = b1 * m + (one - b1) * g
        v = b2 * v + (one - b2) * g * g
        mhat = m / bc1
        vhat = v / bc2
        p = p - lr * (mhat / (np.sqrt(vhat) + eps) + F32(wd) * p)
    return p.astype(F32), m.astype(F32), v.astype(F32)


def adamw_q8(master, c1, c2, a1, a2, grad, args, segs):
    """one 8-bit AdamW step over a range: per block, the quantized elements of the segments
    dequantized with the old absmax, stepped in float32, the new absmax over them, codes"""
    master, c1, c2, a1, a2 = master.copy(), c1.copy(), c2.copy(), a1.copy(), a2.copy()
    n = master.size
    for b in range((n + BLOCK - 1) // BLOCK):
        b0, b1 = b * BLOCK, min((b + 1) * BLOCK, n)
        pieces = []
        for lo, cnt, decay, quant, _ in segs:
            s, e = max(lo, b0), min(lo + cnt, b1)
            if quant and s < e:
                pieces.append((s, e, decay))
        m_new, v_new = {}, {}
        for s, e, decay in pieces:
            m = dequantize(c1[s:e], a1[b], True)
            v = dequantize(c2[s:e], a2[b], False)
            wd = args[4] if decay else 0.0
            master[s:e], m_new[s], v_new[s] = adamw(master[s:e], m, v, grad[s:e], args, wd)
        n1 = max([absmax(m_new[s]) for s, _, _ in pieces], default=F32(0))
        n2 = max([absmax(v_new[s]) for s, _, _ in pieces], default=F32(0))
        a1[b], a2[b] = n1, n2
        for s, e, _ in pieces:
            c1[s:e] = quantize(m_new[s], n1, True)
            c2[s:e] = quantize(v_new[s], n2, False)
    return master, c1, c2, a1, a2


def load(path):
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    i = 0
    while i < len(data):
        ln = int.from_bytes(data[i:i + 4], "little")
        name = data[i + 4:i + 4 + ln].decode()
        i += 4 + ln
        kind = int.from_bytes(data[i:i + 4], "little")
        cnt = int.from_bytes(data[i + 4:i + 12], "little")
        i += 12
        dt = [np.float32, np.uint8, np.uint64][kind]
        nbytes = cnt * np.dtype(dt).itemsize
        out[name] = np.frombuffer(data[i:i + nbytes], dtype=dt).copy()
        i += nbytes
    return out


def same(a, b):
    """bit for bit (so -0 and 0, and every NaN payload, are told apart)"""
    if a.dtype == np.float32:
        return a.size == b.size and np.array_equal(a.view(np.uint32), b.astype(F32).view(np.uint32))
    return a.size == b.size and np.array_equal(a, b)


def main():
    d = sys.argv[1]
    bad = 0
    checked = 0
    for fn in sorted(os.listdir(d)):
        if not fn.endswith(".bin"):
            continue
        case = load(os.path.join(d, fn))
        name = fn[:-4]
        bad_before = bad
        if "x" in case:  # a block quantization case
            signed = bool(case["signed"][0])
            amax, code, back = quantize_blocks(case["x"], signed)
            for what, want, got in (("absmax", amax, case["absmax"]), ("codes", code, case["code"]),
                                    ("dequantized", back, case["back"])):
                checked += 1
                if not same(want, got):
                    bad += 1
                    diff = np.flatnonzero(want.view(np.uint32 if want.dtype == np.float32 else np.uint8) !=
                                          got.view(np.uint32 if got.dtype == np.float32 else np.uint8))
                    print(f"FAIL {name}: {what} differ at {diff.size} of {want.size} (first {diff[:5]})")
            if bad == bad_before:
                print(f"ok   {name}: {case['x'].size} values in {amax.size} blocks: absmax, codes and dequantized "
                      f"values equal the reference")
        else:  # 8-bit AdamW steps
            segs = [tuple(int(x) for x in case["segments"][5 * i:5 * i + 5]) for i in range(case["segments"].size // 5)]
            st = (case["master0"], case["code1_0"], case["code2_0"], case["absmax1_0"], case["absmax2_0"])
            t = 1
            while f"grad_{t}" in case:
                st = adamw_q8(*st, case[f"grad_{t}"], [float(x) for x in case[f"args_{t}"]], segs)
                for what, want in zip(("master", "code1", "code2", "absmax1", "absmax2"), st):
                    checked += 1
                    if not same(want, case[f"{what}_{t}"]):
                        bad += 1
                        print(f"FAIL {name} step {t}: {what} differs from the reference")
                t += 1
            if bad == bad_before:
                print(f"ok   {name}: {t - 1} steps of 8-bit AdamW: master, codes and absmax equal the reference bit "
                      f"for bit")
    print(f"{'FAIL' if bad else 'PASS'}: {checked} arrays compared, {bad} differ")
    return 1 if bad or not checked else 0


if __name__ == "__main__":
    sys.exit(main())
