#!/usr/bin/env bash
# The Python the reference tests compare against (torch, transformers, tokenizers,
# safetensors; tensorboard, whose reader checks Strata's event files): prints its path, or
# nothing when there is none (the tests then skip, saying why). Tried in order:
# $STRATA_PYTHON, .dev/venv/bin/python, python3. With --install, a .dev/venv is created and
# filled from PyPI when none of them has the packages (about a minute and 5.6 GB, once),
# and a .dev/venv made before tensorboard was needed gets it; when PyPI cannot be reached
# it says so and prints nothing (or the venv without tensorboard: that test skips).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV="$ROOT/.dev/venv"
has() { [ -n "$1" ] && command -v "$1" > /dev/null 2>&1 &&
        "$1" -c "import torch, transformers, tokenizers, safetensors" > /dev/null 2>&1; }
for py in "${STRATA_PYTHON:-}" "$VENV/bin/python" python3; do
  if has "$py"; then
    if [ "${1:-}" = "--install" ] && [ "$py" = "$VENV/bin/python" ] && ! "$py" -c "import tensorboard" > /dev/null 2>&1; then
      echo "[python] installing tensorboard into $VENV from PyPI (once)" >&2
      "$VENV/bin/pip" install --quiet --disable-pip-version-check --timeout 60 tensorboard > "$ROOT/.dev/pip.log" 2>&1 ||
        echo "[python] pip could not install tensorboard (see .dev/pip.log): the TensorBoard test will skip" >&2
    fi
    command -v "$py"
    exit 0
  fi
done
[ "${1:-}" = "--install" ] || exit 0
echo "[python] installing torch, transformers, tokenizers, tensorboard into $VENV from PyPI (once; about a minute)" >&2
if ! { [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV" > /dev/null 2>&1; }; then
  echo "[python] cannot create $VENV (is python3-venv installed?): the reference tests will skip" >&2
  exit 0
fi
if ! "$VENV/bin/pip" install --quiet --disable-pip-version-check --timeout 60 \
       torch transformers tokenizers safetensors tensorboard > "$ROOT/.dev/pip.log" 2>&1; then
  echo "[python] pip could not install from PyPI (see .dev/pip.log: $(tail -1 "$ROOT/.dev/pip.log")):" \
       "the reference tests will skip" >&2
  exit 0
fi
has "$VENV/bin/python" && echo "$VENV/bin/python"
exit 0
