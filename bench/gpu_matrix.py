#!/usr/bin/env python3
"""bench/gpu_matrix.py: the GPU verification matrix, run part by part, rendered as one table.

Every combination Strata claims to support on a GPU is trained for 20 steps and checked
against its references:
  - world 1, every ZeRO stage, comm backend, offload tier, activation checkpointing and
    accumulation: bit for bit the losses (and, through the final checkpoint's CRC-32C per
    tensor segment, the weights and Adam moments) of the stage-0, no-offload run of the
    same shape: same kernels in the same order, so any difference is a bug;
  - several ranks sharing the GPU over MPI with staged device buffers: within bf16
    tolerance of world 1 (the reduction order and, with bf16 reduction, its rounding differ);
  - every GPU run: within the kernels' tolerance of the CPU backend's fp32 run of the same
    shape (tests/test_cuda.c holds each kernel to 2e-2 of the CPU oracle);
  - world 1: measured peak device memory (what nvidia-smi counts) within 5% of the plan.
A row passes only if its run exits 0 within its time limit, completes every step and meets
each check. A run that outlives its limit is a hang: every thread's stack of it and of its
children goes to hangs.txt, then it is killed, and the row fails; a failed row's log (its
last 64 KiB) is kept in DIR/logs. With --deadline (a Unix time: the end of the device call
this runs in) no row starts that could not finish before it, and no run outlives it: the
rows left are "not run", so a part cut short still returns every result it has.

Usage (bench/gpu-check.sh runs these, under the deadline of its one device call):
  gpu_matrix.py run --strata build-gpu/strata --part world1 --results DIR [--deadline UNIXTIME]
  gpu_matrix.py render --results DIR --out docs/gpu-matrix.md
`--device cpu` runs the same rows on the CPU backend (rows that need a GPU are reported as
not applicable); `--quick` shrinks the model and the step count (tests/e2e_matrix.sh uses
both to keep this script honest in CI).
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time

STEPS = 20
# Relative loss tolerances. BITWISE: same kernels, same order. RANKS: several ranks reduce
# in another order (and in bf16 with grad_reduce_dtype bf16), or stages 2-3 accumulate
# micro-steps in another order (below); over 20 steps at the rows' lr
# of 6e-4 the CPU backend's world-2 reduction moves the "small" shape's loss by 0 (fp32) and
# 3.5e-5 (bf16), so 1e-2 is loose enough for bf16 compute yet catches a wrong shard or a
# missed reduction (those move it by >1e-1). CPU: the GPU computes in bf16 against the
# CPU's fp32. The lr is what makes such bounds mean anything: at 2e-3 these runs have loss
# spikes (3.5 to 4.2 and back within a step or two) that amplify any difference, so the
# same world-2 runs moved the loss by 2e-3 (fp32) and 3.9e-2 (bf16), and on the H200
# (2026-11-27) GPU runs that were bit-identical up to a spike ended 0.1-1.4 apart.
TOL_BITWISE, TOL_RANKS, TOL_CPU, TOL_MEMORY_PCT = 0.0, 1e-2, 2e-2, 5.0

# Model shapes (byte-level vocabulary unless named). Head size = n_embd / n_head.
SHAPES = {
    "small": dict(n_layer=4, n_head=4, n_embd=256, seq_len=256, vocab_size=256, micro_batch=8),
    "h64-t1024": dict(n_layer=2, n_head=4, n_embd=256, seq_len=1024, vocab_size=256, micro_batch=4),
    "h128-t1024": dict(n_layer=2, n_head=2, n_embd=256, seq_len=1024, vocab_size=256, micro_batch=4),
    "124m": dict(n_layer=12, n_head=12, n_embd=768, seq_len=1024, vocab_size=50257, micro_batch=16),
    # the Llama family: grouped-query attention (8 query heads over 2, head size 64, so the
    # tensor-core attention takes it), SwiGLU, RMSNorm, RoPE, an untied head ...
    "llama": dict(arch="llama", n_layer=4, n_head=8, n_kv_head=2, n_embd=512, intermediate_size=1024, seq_len=256,
                  vocab_size=256, tie_embeddings="false", micro_batch=8),
    # ... with an 8192-token vocabulary: a micro-batch's logits take 32 MiB in bf16, so the
    # head in 8 MiB chunks (train.logits_chunk_mb) runs four of them (and its gate|up, 8
    # MiB, in 2 MiB chunks: train.mlp_chunk_mb)
    "llama-v8k": dict(arch="llama", n_layer=2, n_head=8, n_kv_head=2, n_embd=512, intermediate_size=1024, seq_len=256,
                      vocab_size=8192, tie_embeddings="false", micro_batch=8),
    # ... and its variations at once: one key/value head of 128 apart from n_embd / n_head,
    # Qwen2's q/k/v biases, Qwen3's q/k norms, llama3 RoPE scaling, a tied head
    "llama-x": dict(arch="llama", n_layer=2, n_head=4, n_kv_head=1, head_dim=128, n_embd=256, intermediate_size=512,
                    seq_len=256, vocab_size=256, qkv_bias="true", qk_norm="true", tie_embeddings="true",
                    rope_scaling="llama3", rope_original_context=64, micro_batch=8),
}
QUICK_SHAPE = dict(n_layer=2, n_head=2, n_embd=32, seq_len=32, vocab_size=256, micro_batch=4)
QUICK_LLAMA = dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=64, seq_len=32,
                   vocab_size=256, micro_batch=4)
QUICK_STEPS = 4


# A row's time limit: 20 steps of the small shapes take seconds on a GPU (CUDA start-up
# included), so a run still going after a minute (two with several ranks) has hung.
# data "docs": the same tokens with packed documents marked (each attends within itself:
# data.document_mask), MatrixRun.prepare_data.
def row(name, shape="small", sets=(), env=None, world=1, ref=None, tol=TOL_BITWISE, cpu=True,
        needs_gpu=False, limit_s=60, data="text"):
    return dict(name=name, shape=shape, sets=list(sets), env=env or {}, world=world, ref=ref, tol=tol,
                cpu=cpu, needs_gpu=needs_gpu, limit_s=limit_s, data=data)


def late_stages_last(rows):
    """Stages 0-1 before stages 2-3, otherwise in order: the one GPU run of stages 2-3 so far
    hung, and rows that hang spend their whole limit, so under a device call's deadline the
    rows most likely to pass report first (a reference is a stage-0 row, or a stage-2 row,
    which the stable sort keeps before the stage-3 rows that compare with it)."""
    return sorted(rows, key=lambda r: any(s in r["sets"] for s in ("zero.stage=2", "zero.stage=3")))


def parts():
    """Rows by part, in run order: a row's reference comes before it in its own part."""
    p = {}
    base = "stage 0"
    w1 = [row(base)]
    for st in (1, 2, 3):
        w1.append(row(f"stage {st}", sets=[f"zero.stage={st}"], ref=base))
    for st in (0, 1, 2, 3):
        w1.append(row(f"stage {st}, comm nccl", sets=[f"zero.stage={st}", "comm.backend=nccl"], ref=base,
                      needs_gpu=True))
    for st in (0, 1, 2, 3):
        for tier in ("cpu", "nvme"):
            w1.append(row(f"stage {st}, optimizer {tier}", sets=[f"zero.stage={st}", f"offload.optimizer={tier}"],
                          ref=base))
    for tier in ("cpu", "nvme"):
        w1.append(row(f"stage 3, optimizer and params {tier}",
                      sets=["zero.stage=3", f"offload.optimizer={tier}", f"offload.params={tier}"], ref=base))
    # the offload pipeline in its smallest chunks (4096 elements): every unit's gradient and
    # parameters cross PCIe a piece at a time, at offsets into the device buffers
    for st, tier in ((1, "cpu"), (3, "nvme")):
        sets = [f"zero.stage={st}", f"offload.optimizer={tier}", "offload.chunk_kb=16"]
        sets += ["offload.params=nvme"] if st == 3 else []
        w1.append(row(f"stage {st}, optimizer{' and params' if st == 3 else ''} {tier}, 4096-element chunks",
                      sets=sets, ref=base))
    for st in (0, 3):
        for ac in ("blocks", "every:2"):
            w1.append(row(f"stage {st}, checkpointing {ac}",
                          sets=[f"zero.stage={st}", f"train.activation_checkpointing={ac}"], ref=base))
    # With accumulation too, bit for bit: at world 1 stages 2-3 accumulate the whole
    # gradient in place as stages 0-1 do (several ranks sum each micro-step in a bucket
    # first, another order: the ranks part holds them to world 1 within TOL_RANKS).
    acc = "stage 0, grad_accum 2"
    half = ["train.grad_accum=2", "train.micro_batch=HALF"]
    w1.append(row(acc, sets=half))
    for st in (1, 2, 3):
        w1.append(row(f"stage {st}, grad_accum 2", sets=half + [f"zero.stage={st}"], ref=acc))
    w1.append(row("stage 3, grad_accum 2, optimizer and params cpu, checkpointing blocks",
                  sets=half + ["zero.stage=3", "offload.optimizer=cpu", "offload.params=cpu",
                               "train.activation_checkpointing=blocks"], ref=acc))
    # gradients in pinned memory (offload.gradients: cpu): each unit's copied out after its
    # backward and, with accumulation, back in before the next: the same sums, bit for bit
    w1.append(row("stage 0, grad_accum 2, optimizer cpu, gradients cpu",
                  sets=half + ["offload.optimizer=cpu", "offload.gradients=cpu"], ref=acc))
    w1.append(row("stage 3, grad_accum 2, optimizer and params nvme, gradients cpu",
                  sets=half + ["zero.stage=3", "offload.optimizer=nvme", "offload.params=nvme",
                               "offload.gradients=cpu"], ref=acc))
    # the residual streams in pinned memory (offload.activations: cpu; 3 of the 5 kept on the
    # device): copied out after the forward writes them, back in ahead of the backward
    w1.append(row("stage 0, checkpointing blocks, activations cpu",
                  sets=["train.activation_checkpointing=blocks", "offload.activations=cpu"], ref=base))
    w1.append(row("stage 3, grad_accum 2, optimizer, params, gradients and activations cpu, checkpointing blocks",
                  sets=half + ["zero.stage=3", "offload.optimizer=cpu", "offload.params=cpu", "offload.gradients=cpu",
                               "offload.activations=cpu", "train.activation_checkpointing=blocks"], ref=acc))
    # bf16 and 8-bit Adam moments (optim.state): the device's kernels against the CPU run of
    # the same state type, stage 1 and the CPU optimizer's update bit for bit against stage 0
    for state in ("bf16", "int8"):
        sb = f"stage 0, state {state}"
        w1.append(row(sb, sets=[f"optim.state={state}"]))
        w1.append(row(f"stage 1, state {state}", sets=["zero.stage=1", f"optim.state={state}"], ref=sb))
        w1.append(row(f"stage 0, state {state}, optimizer cpu", sets=[f"optim.state={state}", "offload.optimizer=cpu"],
                      ref=sb))
    w1.append(row("stage 3, state int8, optimizer and params nvme",
                  sets=["zero.stage=3", "optim.state=int8", "offload.optimizer=nvme", "offload.params=nvme"],
                  ref="stage 0, state int8"))
    p["world1"] = late_stages_last(w1)

    # Stage 3 reduces as stage 2 does and only adds gathers, which copy: at the same world
    # it matches stage 2 bit for bit. (On the H200, 2026-11-27, 4 ranks at stage 3 parted
    # from stage 2 by step 1-3 and 2 ranks did not: a race, which a tolerance would hide.)
    # The prefetch-0 row tells a race in the gathers ahead of use from one elsewhere.
    ranks = [row(base)]
    for n in (2, 4):
        for st in (0, 1, 2, 3):
            for dt in ("fp32", "bf16"):
                ref, tol = (f"{n} ranks, stage 2, reduce {dt}", TOL_BITWISE) if st == 3 else (base, TOL_RANKS)
                ranks.append(row(f"{n} ranks, stage {st}, reduce {dt}", world=n, ref=ref, tol=tol,
                                 sets=[f"zero.stage={st}", "comm.backend=mpi", f"train.grad_reduce_dtype={dt}",
                                       f"train.micro_batch=DIV{n}"], limit_s=120))
    ranks.append(row("4 ranks, stage 3, reduce fp32, prefetch 0", world=4, ref="4 ranks, stage 2, reduce fp32",
                     sets=["zero.stage=3", "zero.prefetch_units=0", "comm.backend=mpi", "train.grad_reduce_dtype=fp32",
                           "train.micro_batch=DIV4"], limit_s=120))
    p["ranks"] = late_stages_last(ranks)

    att = []
    for shape in ("h64-t1024", "h128-t1024"):
        simt = f"{shape}, attention simt"
        att.append(row(simt, shape=shape, env={"STRATA_ATTENTION": "simt"}))
        att.append(row(f"{shape}, attention tc", shape=shape, env={"STRATA_ATTENTION": "tc"}, ref=simt,
                       tol=TOL_CPU, needs_gpu=True))
        att.append(row(f"{shape}, attention tc, stage 3", shape=shape, env={"STRATA_ATTENTION": "tc"},
                       sets=["zero.stage=3"], ref=f"{shape}, attention tc", needs_gpu=True))
    # GPT-2 124M (B=16, T=1024): the CPU run of it takes minutes, so its oracle is the
    # world-1 stage-0 GPU run; stage 3 with CPU offload must match it bit for bit.
    # packed documents (GPT-2's learned positions by position in the document, its dwpe
    # gathered by position): each kernel against the CPU's fp32, tensor cores against CUDA cores
    for shape in ("h64-t1024", "h128-t1024"):
        ds = f"{shape}, packed documents, attention simt"
        att.append(row(ds, shape=shape, env={"STRATA_ATTENTION": "simt"}, data="docs"))
        att.append(row(f"{shape}, packed documents, attention tc", shape=shape, env={"STRATA_ATTENTION": "tc"},
                       ref=ds, tol=TOL_CPU, needs_gpu=True, data="docs"))
    att.append(row("124m, stage 0", shape="124m", cpu=False, needs_gpu=True, limit_s=240))
    att.append(row("124m, stage 3, optimizer and params cpu", shape="124m", cpu=False, needs_gpu=True,
                   sets=["zero.stage=3", "offload.optimizer=cpu", "offload.params=cpu"], ref="124m, stage 0",
                   limit_s=240))
    p["attention"] = late_stages_last(att)

    # The Llama family (its CUDA kernels were first built without a GPU): every stage and the
    # CPU optimizer against stage 0 bit for bit, each against the CPU's fp32 within TOL_CPU,
    # and the tensor-core attention against the CUDA-core one.
    lb = "llama, stage 0"
    ll = [row(lb, shape="llama")]
    for st in (1, 2, 3):
        ll.append(row(f"llama, stage {st}", shape="llama", sets=[f"zero.stage={st}"], ref=lb))
    for st in (0, 3):
        ll.append(row(f"llama, stage {st}, optimizer cpu", shape="llama", sets=[f"zero.stage={st}", "offload.optimizer=cpu"],
                      ref=lb))
    ll.append(row("llama, checkpointing blocks", shape="llama", sets=["train.activation_checkpointing=blocks"], ref=lb))
    ll.append(row("llama, checkpointing blocks, activations cpu", shape="llama",
                  sets=["train.activation_checkpointing=blocks", "offload.activations=cpu"], ref="llama, checkpointing blocks"))
    ll.append(row("llama, attention tc", shape="llama", env={"STRATA_ATTENTION": "tc"}, ref=lb, tol=TOL_CPU,
                  needs_gpu=True))
    # packed documents (RoPE at each token's position in its document): against the CPU's
    # fp32; stage 3 with every block recomputed bit for bit; the tensor cores within TOL_CPU
    db = "llama, packed documents"
    ll.append(row(db, shape="llama", data="docs"))
    ll.append(row("llama, packed documents, stage 3, checkpointing blocks", shape="llama", data="docs", ref=db,
                  sets=["zero.stage=3", "train.activation_checkpointing=blocks"]))
    ll.append(row("llama, packed documents, attention tc", shape="llama", env={"STRATA_ATTENTION": "tc"}, ref=db,
                  tol=TOL_CPU, needs_gpu=True, data="docs"))
    xb = "llama-x, stage 0"
    ll.append(row(xb, shape="llama-x"))
    ll.append(row("llama-x, stage 3, optimizer cpu", shape="llama-x", sets=["zero.stage=3", "offload.optimizer=cpu"],
                  ref=xb))
    # the head a chunk of rows at a time: the classifier's weight gradient sums its rows in
    # four pieces (another rounding than one product: within TOL_RANKS of the whole head);
    # stage 3 with everything offloaded runs the same kernels as stage 0, bit for bit
    vb = "llama-v8k, stage 0"
    ll.append(row(vb, shape="llama-v8k"))
    ll.append(row("llama-v8k, logits in 8 MiB chunks", shape="llama-v8k", sets=["train.logits_chunk_mb=8"], ref=vb,
                  tol=TOL_RANKS))
    ll.append(row("llama-v8k, logits in 8 MiB chunks, stage 3, optimizer, params and gradients cpu", shape="llama-v8k",
                  sets=["train.logits_chunk_mb=8", "zero.stage=3", "offload.optimizer=cpu", "offload.params=cpu",
                        "offload.gradients=cpu"], ref="llama-v8k, logits in 8 MiB chunks"))
    # the MLPs a chunk of rows at a time (gate|up: 8 MiB in bf16, in four 2 MiB chunks) with
    # every block recomputed, so a chunk's gate|up is all a block keeps of it: within
    # TOL_RANKS of the whole MLP (its weight gradients sum their rows in four pieces), and
    # stage 3 with everything offloaded bit for bit the chunked stage 0
    cb = "llama-v8k, checkpointing blocks"
    ll.append(row(cb, shape="llama-v8k", sets=["train.activation_checkpointing=blocks"], ref=vb))
    ll.append(row("llama-v8k, checkpointing blocks, MLP in 2 MiB chunks", shape="llama-v8k",
                  sets=["train.activation_checkpointing=blocks", "train.mlp_chunk_mb=2"], ref=cb, tol=TOL_RANKS))
    ll.append(row("llama-v8k, checkpointing blocks, MLP in 2 MiB chunks, stage 3, optimizer, params and gradients cpu",
                  shape="llama-v8k", sets=["train.activation_checkpointing=blocks", "train.mlp_chunk_mb=2", "zero.stage=3",
                                           "offload.optimizer=cpu", "offload.params=cpu", "offload.gradients=cpu"],
                  ref="llama-v8k, checkpointing blocks, MLP in 2 MiB chunks"))
    p["llama"] = late_stages_last(ll)
    return p


def splitmix64(x):
    """A 64-bit mix of x (SplitMix64's finalizer): independent-looking bits for each x."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


# ---- running one row --------------------------------------------------------------------------

def descendants(pid):
    kids = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            kids.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
        except (OSError, IndexError, ValueError):
            pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def dump_stacks(pid, name, hangs_path, debugger_s=60):
    """Every thread's stack of pid and its descendants (gdb, or cuda-gdb where gdb is missing)."""
    dbg = shutil.which("gdb") or shutil.which("cuda-gdb")
    with open(hangs_path, "a") as out:
        out.write(f"== {name}: HUNG; stacks of every process and thread ==\n")
        for p in descendants(pid):
            try:
                cmd = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:200]
            except OSError:
                continue
            out.write(f"-- pid {p}: {cmd}\n")
            if not dbg:
                out.write("   (no gdb or cuda-gdb: no stacks)\n")
                continue
            try:
                bt = subprocess.run([dbg, "-p", str(p), "-batch", "-ex", "thread apply all bt 20"],
                                    capture_output=True, text=True, timeout=debugger_s).stdout
            except subprocess.TimeoutExpired:
                bt = "   (debugger timed out)\n"
            out.write("".join(l + "\n" for l in bt.splitlines() if l.startswith(("Thread", "#"))))
        out.flush()


# With a deadline, the seconds kept back after a run's limit for the stack dump of a hang, and
# the least a row needs to be worth starting (tests/e2e_matrix.sh shrinks both).
STACKS_S = float(os.environ.get("STRATA_MATRIX_STACKS_S", 30))
MIN_ROW_S = float(os.environ.get("STRATA_MATRIX_MIN_ROW_S", 15))


def run_cmd(argv, env, log_path, limit_s, name, hangs_path, debugger_s=60):
    """Runs argv in its own session; returns (exit code, seconds, hung)."""
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit_s)
            return rc, time.time() - t0, False
        except subprocess.TimeoutExpired:
            dump_stacks(proc.pid, name, hangs_path, debugger_s)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            return 124, time.time() - t0, True


def metrics(run_dir):
    rows = []
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return [r for r in rows if "loss" in r]


def checkpoint_crcs(run_dir):
    """(kind, tensor, lo, hi, crc32c) of every segment of the final checkpoint (world 1)."""
    try:
        latest = open(os.path.join(run_dir, "ckpt", "latest")).read().strip()
        text = open(os.path.join(run_dir, "ckpt", latest, "rank00000.yaml")).read()
    except OSError:
        return None
    seg = re.compile(r'kind: (\w+), tensor: "([^"]+)", unit: \d+, lo: (\d+), hi: (\d+),.*crc32c: (0x[0-9a-f]+)')
    return sorted(m.groups() for m in seg.finditer(text))


def worst_rel(a, b):
    if not a or not b:
        return None
    return max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b))


class Runner:
    def __init__(self, args):
        self.a = args
        self.work = os.path.abspath(args.workdir)
        os.makedirs(self.work, exist_ok=True)
        self.hangs = os.path.join(os.path.abspath(args.results), "hangs.txt")
        self.done = {}  # row name -> result (with its losses) for references
        self.crcs = {}  # row name -> its final checkpoint's segment CRCs (world 1)
        self.cpu_refs = {}
        self.mpirun = shutil.which("mpirun")
        self.prepare_data()

    def prepare_data(self):
        data = os.path.join(self.work, "data")
        if glob.glob(os.path.join(data, "train_*.bin")):
            return
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        corpus = os.path.join(self.work, "corpus.txt")
        # the project's hand-written sources; not the generated Unicode tables (io/nfc_tables.h),
        # whose rows of hex made batches of loss 9.3 at step 8 on the H200 (2026-11-27) on both
        # backends, after which the GPU's bf16 and the CPU's fp32 runs went apart by 0.8
        with open(corpus, "wb") as out:
            for path in sorted(glob.glob(os.path.join(root, "*", "*.[ch]")) + glob.glob(os.path.join(root, "*", "*.cu"))):
                if not path.endswith("_tables.h"):
                    out.write(open(path, "rb").read())
        subprocess.run([self.a.strata, "prepare", "--text", corpus, "--out", data], check=True,
                       stdout=subprocess.DEVNULL)
        self.prepare_docs(data)

    def prepare_docs(self, data):
        """docs/: the text shards' tokens as Strata's 32-bit shards (io/data.h) with every token
        learned and documents marked at pseudo-random points, 128 tokens apart on average (a
        geometric spread: some of one token, some across sequences), so a 256-token sequence
        holds two or three and the kernels' tiles meet starts everywhere."""
        docs = os.path.join(self.work, "docs")
        os.makedirs(docs, exist_ok=True)
        for path in sorted(glob.glob(os.path.join(data, "*_*.bin"))):
            raw = open(path, "rb").read()
            head = struct.unpack("<256i", raw[:1024])
            toks = list(struct.unpack("<%dH" % head[2], raw[1024:1024 + 2 * head[2]]))
            mask = bytearray([1]) * len(toks)
            for i in range(1, len(toks)):
                if splitmix64(i) % 128 == 0:
                    mask[i] |= 2
            hdr = [20240520, 2, len(toks), 3, 0] + [0] * 251  # flags: a mask, marking document starts
            with open(os.path.join(docs, os.path.basename(path)), "wb") as f:
                f.write(struct.pack("<256i", *hdr) + struct.pack("<%dI" % len(toks), *toks) + bytes(mask))

    def shape(self, r):
        if self.a.quick:
            return dict(QUICK_LLAMA if SHAPES[r["shape"]].get("arch") == "llama" else QUICK_SHAPE)
        return dict(SHAPES[r["shape"]])

    def config(self, r, device, run_dir):
        s = self.shape(r)
        mb = s.pop("micro_batch")
        sets = []
        for kv in r["sets"]:
            k, v = kv.split("=", 1)
            if v == "HALF":
                v = str(mb // 2)
            elif v.startswith("DIV"):
                v = str(mb // int(v[3:]))
            sets.append(f"{k}={v}")
        steps = QUICK_STEPS if self.a.quick else STEPS
        path = os.path.join(self.work, "m.yaml")
        with open(path, "w") as f:
            f.write("model: {%s}\n" % ", ".join(f"{k}: {v}" for k, v in s.items()))
            data = "docs" if r["data"] == "docs" else "data"
            f.write('data: {train: "%s/%s/train_*.bin", val: ""}\n' % (self.work, data))
            f.write(f"train: {{steps: {steps}, micro_batch: {mb}, eval_every: 0, log_every: 5, sample_tokens: 0}}\n")
            f.write("optim: {lr: 6.0e-4, warmup_steps: 5}\n")  # stable: see the tolerances
            f.write(f"offload: {{nvme_path: \"{self.work}/nvme\", block_kb: 64}}\n")
        os.makedirs(os.path.join(self.work, "nvme"), exist_ok=True)
        return path, [f"device={device}", f"run.dir={run_dir}", "run.checkpoint_every=0"] + sets

    def launch(self, r, device, tag):
        run_dir = os.path.join(self.work, "runs", tag)
        shutil.rmtree(run_dir, ignore_errors=True)
        cfg, sets = self.config(r, device, run_dir)
        argv = [self.a.strata, "train", cfg] + [x for s in sets for x in ("--set", s)]
        env = dict(os.environ, **r["env"])
        env.setdefault("STRATA_CUDA_UNVERIFIED", "1")  # while the refusal exists, this matrix is its test
        # a row's run takes seconds: a wait of 10 s is a hang in the making, and says what it waits for
        env.setdefault("STRATA_WAIT_REPORT_S", "10")
        if r["world"] > 1:
            argv = [self.mpirun, "-np", str(r["world"]), "--oversubscribe", "--bind-to", "none"] + \
                   (["--allow-run-as-root"] if os.geteuid() == 0 else []) + \
                   ["-x", "OMP_NUM_THREADS=%d" % max(1, (os.cpu_count() or 2) // r["world"])] + \
                   [x for k in sorted(r["env"]) + ["STRATA_CUDA_UNVERIFIED", "STRATA_WAIT_REPORT_S"] for x in ("-x", k)] + argv
        log = os.path.join(self.work, f"{tag}.log")
        limit, debugger_s = r["limit_s"], 60
        if self.a.deadline:
            limit = min(limit, self.a.deadline - time.time() - STACKS_S)
            debugger_s = STACKS_S / max(1, r["world"] + 1)
        rc, secs, hung = run_cmd(argv, env, log, max(limit, 1), tag, self.hangs, debugger_s)
        return run_dir, log, rc, secs, hung

    def cpu_reference(self, r):
        # the world-1 run of the same global batch and optimizer state type: accumulation kept,
        # per-rank splits and the reduction dtype (meaningless at world 1) dropped
        keep = [s for s in r["sets"] if (s.startswith("train.") or s.startswith("optim.")) and "=DIV" not in s
                and "grad_reduce" not in s]
        key = (r["shape"], r["data"], tuple(keep))
        if key not in self.cpu_refs:
            ref = dict(r, sets=keep, env={}, world=1, limit_s=600)
            what = (r["shape"],) + (("docs",) if r["data"] == "docs" else ()) + key[2]
            tag = "cpu-" + re.sub(r"[^a-z0-9]+", "-", " ".join(what).lower()).strip("-")
            run_dir, log, rc, _, _ = self.launch(ref, "cpu", tag)
            self.cpu_refs[key] = [m["loss"] for m in metrics(run_dir)] if rc == 0 else None
        return self.cpu_refs[key]

    def left(self):
        return self.a.deadline - time.time() if self.a.deadline else float("inf")

    def keep_log(self, tag, log):
        """A failed row's log, its last 64 KiB, into the results (bench/gpu-check.sh packs them)."""
        try:
            with open(log, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 65536))
                tail = f.read()
            os.makedirs(os.path.join(self.a.results, "logs"), exist_ok=True)
            with open(os.path.join(self.a.results, "logs", tag + ".log"), "wb") as out:
                out.write(tail)
        except OSError:
            pass

    def run_row(self, part, r):
        res = dict(part=part, name=r["name"], world=r["world"], ref=r["ref"], tol=r["tol"], shape=r["shape"],
                   sets=r["sets"], env=r["env"], device=self.a.device, reasons=[])
        if self.left() < STACKS_S + MIN_ROW_S:
            res["status"] = "not run"
            res["reasons"].append("the call's deadline came first")
            return res
        if r["needs_gpu"] and self.a.device != "cuda":
            res["status"] = "n/a"
            res["reasons"].append("needs a GPU")
            return res
        if r["world"] > 1 and not self.mpirun:
            res["status"] = "fail"
            res["reasons"].append("mpirun not found (carry Open MPI: bench/gpu-check.sh)")
            return res
        tag = re.sub(r"[^a-z0-9]+", "-", f"{part} {r['name']}".lower()).strip("-")
        run_dir, log, rc, secs, hung = self.launch(r, self.a.device, tag)
        m = metrics(run_dir)
        steps = QUICK_STEPS if self.a.quick else STEPS
        losses = [x["loss"] for x in m]
        res.update(exit=rc, seconds=round(secs, 1), steps=len(m), losses=losses)
        if hung and secs < r["limit_s"] - 1:  # stopped by the deadline, not by its own limit
            res["status"] = "not run"
            res["reasons"].append(f"cut short by the call's deadline after {secs:.0f} s, {len(m)} steps done "
                                  "(stacks in hangs.txt)")
            self.keep_log(tag, log)
            return res
        if hung:
            res["reasons"].append(f"HUNG after {r['limit_s']} s (stacks in hangs.txt)")
        elif rc != 0:
            # Strata's own "error: ..." line first (under mpirun, Open MPI's abort noise comes after it)
            lines = [l.strip() for l in open(log, errors="replace")]
            ours = [l for l in lines if re.match(r"^(\[[^]]*\] )?error: ", l)]
            why = ours[:1] or [l for l in lines if "error" in l.lower()][-1:] or ["(see log)"]
            res["reasons"].append(f"exit {rc}: {why[0][:160]}")
        if len(m) != steps:
            res["reasons"].append(f"{len(m)} of {steps} steps")
        if m:
            timed = [x["step_ms"] for x in m[5:]] or [x["step_ms"] for x in m]
            res["ms_per_step"] = statistics.median(timed)
            last = m[-1]
            res["plan_device_bytes"] = last.get("plan_device_total_bytes")
            res["used_device_bytes"] = last.get("device_used_peak_bytes")
            res["memory_pct"] = last.get("device_used_vs_plan_pct")
            if r["world"] == 1 and res["memory_pct"] is not None and abs(res["memory_pct"]) > TOL_MEMORY_PCT:
                res["reasons"].append(f"device memory {res['memory_pct']:+.1f}% off the plan")
        crcs = checkpoint_crcs(run_dir) if r["world"] == 1 and rc == 0 else None
        if r["ref"]:
            ref = self.done.get(r["ref"])
            if not ref or not ref.get("losses"):
                res["reasons"].append(f"reference '{r['ref']}' did not run")
            else:
                d = worst_rel(losses, ref["losses"])
                res["ref_diff"] = d
                if d is None or d > r["tol"] or len(losses) != len(ref["losses"]):
                    res["reasons"].append(f"losses differ from '{r['ref']}' by {d:.3g}" if d is not None
                                          else "no losses to compare")
                ref_crcs = self.crcs.get(r["ref"])
                if r["tol"] == TOL_BITWISE and rc == 0 and not crcs and r["world"] == 1:  # world 1's checkpoint only
                    res["reasons"].append("no final checkpoint to compare weights with")
                if r["tol"] == TOL_BITWISE and crcs and ref_crcs and crcs != ref_crcs:
                    n = sum(1 for a, b in zip(crcs, ref_crcs) if a != b)
                    res["reasons"].append(f"final weights/moments differ from '{r['ref']}' in {n} segments")
        if r["cpu"] and self.a.device != "cpu" and losses:
            cpu = self.cpu_reference(r)
            if cpu is None:
                res["reasons"].append("the CPU fp32 reference run failed")
            else:
                res["cpu_diff"] = worst_rel(losses, cpu)
                if res["cpu_diff"] > TOL_CPU:
                    res["reasons"].append(f"losses differ from the CPU fp32 run by {res['cpu_diff']:.3g}")
        res["status"] = "fail" if res["reasons"] else "pass"
        if res["status"] == "fail":
            self.keep_log(tag, log)
        self.done[r["name"]] = res
        self.crcs[r["name"]] = crcs
        return res


def cmd_run(a):
    os.makedirs(a.results, exist_ok=True)
    rows = parts()[a.part]
    if a.only:
        keep = set(a.only.split(";"))
        rows = [r for r in rows if r["name"] in keep]
    if a.limit_s:
        rows = [dict(r, limit_s=a.limit_s) for r in rows]
    runner = Runner(a)
    out = []
    t0 = time.time()
    for r in rows:
        res = runner.run_row(a.part, r)
        out.append(res)
        print(f"[matrix] {a.part}: {r['name']}: {res['status'].upper()}"
              + (f" ({'; '.join(res['reasons'])})" if res["reasons"] else ""), flush=True)
        meta = dict(part=a.part, device=a.device, quick=a.quick, seconds=round(time.time() - t0, 1),
                    machine=machine(a.device), commit=commit(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    command=" ".join(sys.argv))
        with open(os.path.join(a.results, f"matrix-{a.part}.json"), "w") as f:
            json.dump(dict(meta=meta, rows=out), f, indent=1)
    count = {k: sum(1 for x in out if x["status"] == k) for k in ("pass", "fail", "n/a", "not run")}
    print(f"[matrix] {a.part}: {count['pass']} pass, {count['fail']} fail, {count['n/a']} n/a, "
          f"{count['not run']} not run, of {len(out)} rows in {time.time() - t0:.0f} s")
    return 1 if count["fail"] or count["not run"] else 0


def machine(device):
    if device == "cuda" and shutil.which("nvidia-smi"):
        try:
            return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return f"{os.cpu_count()} CPU cores ({device} backend)"


def commit():
    # GPU_CHECK_COMMIT: the device tool's copy of the tree can carry an older .git than its files
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "?"
    except OSError:
        return "?"


def fmt_bytes(b):
    return "-" if b is None else f"{b / 2**20:,.0f} MiB"


def cmd_render(a):
    files = sorted(glob.glob(os.path.join(a.results, "matrix-*.json")))
    order = list(parts())
    done = {}
    for path in files:
        d = json.load(open(path))
        done[d["meta"]["part"]] = d
    lines = ["# GPU matrix", "",
             "Written by `bench/gpu_matrix.py render` from the results of `bench/gpu-check.sh`'s matrix parts;",
             "no row is edited by hand. Each row trains 20 steps and passes only if it exits by itself,",
             "completes every step and meets each check (see the header of bench/gpu_matrix.py):",
             "bit for bit the losses and final checkpoint of its reference at world 1, within "
             f"{TOL_RANKS:g} (relative) of world 1 with several ranks, within {TOL_CPU:g} of the CPU fp32 run, "
             f"and at world 1 measured peak device memory within {TOL_MEMORY_PCT:g}% of the plan.", ""]
    total = {"pass": 0, "fail": 0, "n/a": 0, "not run": 0}
    for part in order:
        if part not in done:
            lines += [f"## {part}", "", "not run", ""]
            continue
        d = done[part]
        m = d["meta"]
        lines += [f"## {part}", "",
                  f"{m['machine']}; commit {m['commit']}; {m['date']}; {m['seconds']:.0f} s"
                  + ("; QUICK (shrunk model, 4 steps)" if m.get("quick") else ""), "",
                  f"`{m['command']}`", "",
                  "| combination | ranks | result | vs reference | vs CPU fp32 | device memory: plan / used | ms/step |",
                  "|---|---|---|---|---|---|---|"]
        for r in d["rows"]:
            total[r["status"]] = total.get(r["status"], 0) + 1
            refcol = "-" if not r.get("ref") or r["status"] == "n/a" else (
                f"{r['ref_diff']:.2e} vs {r['ref']}" if r.get("ref_diff") is not None else f"? vs {r['ref']}")
            if r.get("ref") and r.get("ref_diff") == 0:
                refcol = f"bitwise = {r['ref']}"
            cpu = "-" if r.get("cpu_diff") is None else f"{r['cpu_diff']:.2e}"
            mem = "-" if r.get("plan_device_bytes") is None else \
                f"{fmt_bytes(r['plan_device_bytes'])} / {fmt_bytes(r['used_device_bytes'])} ({r['memory_pct']:+.1f}%)"
            ms = "-" if r.get("ms_per_step") is None else f"{r['ms_per_step']:.1f}"
            result = r["status"].upper() + (": " + "; ".join(r["reasons"]) if r["reasons"] else "")
            lines.append(f"| {r['name']} | {r['world']} | {result} | {refcol} | {cpu} | {mem} | {ms} |")
        lines.append("")
    lines.insert(2, f"Rows: {total['pass']} pass, {total['fail']} fail, {total['n/a']} not applicable"
                    + (f", {total['not run']} not run (the device call's deadline came first)" if total["not run"] else "")
                    + (f"; parts not run: {', '.join(p for p in order if p not in done)}" if len(done) < len(order) else "")
                    + ".\n")
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print(f"[matrix] wrote {a.out}: {total['pass']} pass, {total['fail']} fail, {total['n/a']} n/a, "
          f"{total['not run']} not run")
    return 1 if total["fail"] or total["not run"] or len(done) < len(order) else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--strata", required=True)
    r.add_argument("--part", required=True, choices=list(parts()))
    r.add_argument("--results", required=True)
    r.add_argument("--workdir", default="/tmp/strata-matrix")
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--quick", action="store_true")
    r.add_argument("--only", help="row names separated by ';' (their references must be among them)")
    r.add_argument("--limit-s", type=float, help="every row's time limit (tests plant a hang with it)")
    r.add_argument("--deadline", type=float, help="Unix time by which the part must have ended")
    g = sub.add_parser("render")
    g.add_argument("--results", required=True)
    g.add_argument("--out", required=True)
    a = ap.parse_args()
    return cmd_run(a) if a.cmd == "run" else cmd_render(a)


if __name__ == "__main__":
    sys.exit(main())
