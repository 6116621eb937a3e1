#!/usr/bin/env bash
# Real learning on real text: configs/tinyshakespeare.yaml (a 0.8M-parameter byte-level
# GPT-2, 1000 steps on the CPU) must bring the validation loss below 2.0 nats per byte.
set -euo pipefail
S=${STRATA:?set by ctest}
corpus="$STRATA_SOURCE_DIR/../shared/data/tinyshakespeare.txt"
[ -f "$corpus" ] || { echo "no $corpus: skipping"; exit 77; }
W=$(mktemp -d /tmp/strata-e2e-shakespeare.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W"
"$S" prepare --text "$corpus" --out data/tinyshakespeare --val-fraction 0.1
OMP_NUM_THREADS=$(nproc --all) "$S" train "$STRATA_SOURCE_DIR/configs/tinyshakespeare.yaml" --set train.log_every=100
val=$(grep -o '"val_loss": [^,]*' runs/tinyshakespeare/metrics.jsonl | tail -1 | cut -d' ' -f2)
first=$(grep -o '"val_loss": [^,]*' runs/tinyshakespeare/metrics.jsonl | head -1 | cut -d' ' -f2)
python3 -c "import sys; v=float('$val'); sys.exit(0 if v < 2.0 else 1)" || { echo "FAIL: final val loss $val >= 2.0"; exit 1; }
echo "ok: val loss $first -> $val nats per byte (< 2.0)"
