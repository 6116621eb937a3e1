#!/usr/bin/env bash
# 8-bit optimizer state against tests/q8_reference.py, the NumPy reference written from the
# paper (Dettmers et al., 8-bit Optimizers via Block-wise Quantization): test_quant --dump
# writes random and adversarial blocks (all zeros, one huge outlier, denormals, FLT_MAX and
# FLT_MIN, values exactly on the midpoints) with Strata's absmax, codes and dequantized
# values, and three 8-bit AdamW steps of the CPU oracle over a range of quantized and fp32
# segments; every array must equal the reference bit for bit. Skips (77) without NumPy.
set -euo pipefail
SRC=${STRATA_SOURCE_DIR:?set by ctest}
B=${STRATA_BUILD_DIR:?set by ctest}
PY=$("$SRC/launcher/python-env.sh")
PY=${PY:-python3}
"$PY" -c "import numpy" 2> /dev/null || { echo "SKIP: no NumPy ($PY)"; exit 77; }
W=$(mktemp -d /tmp/strata-e2e-q8.XXXXXX)
trap 'rm -rf "$W"' EXIT
"$B/tests/test_quant" --dump "$W" > "$W/test.log" || { cat "$W/test.log"; echo "FAIL: test_quant"; exit 1; }
"$PY" "$SRC/tests/q8_reference.py" "$W"
