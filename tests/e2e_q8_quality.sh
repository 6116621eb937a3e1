#!/usr/bin/env bash
# 8-bit optimizer state trains as well as fp32 state (issue 30): configs/quickstart.yaml on
# its corpus (Debian's fortunes, as launcher/quickstart.sh prepares it) to the end of its
# learning-rate schedule, once with optim.state fp32 and once with int8; the final
# validation loss of the int8 run must be within 1% of the fp32 run's. To fit CI's two
# cores the schedule is shortened (STEPS, default 400, at half the quickstart's micro-batch:
# the warmup and the cosine decay to min_lr are the config's, over fewer steps); the full
# 1500 steps and a longer tiny-shakespeare run are in docs/benchmarks.md
# (bench/bench_optim_state.sh QUALITY=1).
set -euo pipefail
S=${STRATA:?set by ctest}
STEPS=${STEPS:-400}
fortunes=()
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat|*.u8) continue ;; esac
  [ -f "$f" ] && fortunes+=("$f")
done
[ ${#fortunes[@]} -gt 0 ] || { echo "no /usr/share/games/fortunes (launcher/install-deps.sh installs it): skipping"; exit 77; }
W=$(mktemp -d /tmp/strata-e2e-q8-quality.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
"$S" prepare --text "${fortunes[@]}" --out data/quickstart --val-fraction 0.05 > /dev/null
val=()
# every core (nproc alone answers ctest's OMP_NUM_THREADS=1)
for st in fp32 int8; do
  OMP_NUM_THREADS=$(nproc --all) "$S" train "$STRATA_SOURCE_DIR/configs/quickstart.yaml" --set optim.state=$st \
    --set run.dir=runs/$st --set train.steps="$STEPS" --set train.micro_batch=8 --set train.eval_every="$STEPS" \
    --set train.eval_batches=32 --set train.log_every=100 --set train.sample_tokens=0 --set run.checkpoint_every=0 \
    --set run.checkpoint_at_end=false > $st.log 2>&1 || { tail -5 $st.log; echo "FAIL: $st run"; exit 1; }
  val+=("$(grep -o '"val_loss": [^,]*' runs/$st/metrics.jsonl | tail -1 | cut -d' ' -f2)")
done
python3 - "${val[0]}" "${val[1]}" <<'PY' || exit 1
import sys
f32, q8 = float(sys.argv[1]), float(sys.argv[2])
rel = (q8 - f32) / f32
ok = abs(rel) < 0.01
print(f"{'ok' if ok else 'FAIL'}: validation loss after the quickstart schedule: fp32 state {f32:.4f}, int8 state "
      f"{q8:.4f} ({100 * rel:+.2f}%, within 1%: {'yes' if ok else 'no'})")
sys.exit(0 if ok else 1)
PY
