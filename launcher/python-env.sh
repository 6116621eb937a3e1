#!/usr/bin/env bash
# The Python the reference tests compare against (torch, transformers, tokenizers,
# safetensors; tensorboard, whose reader checks Strata's event files; sentencepiece, which
# trains tests/tokenizers_reference.py's Mistral-style fixture): prints its path, or
# nothing when there is none (the tests then skip, saying why). Tried in order:
# $STRATA_PYTHON, .dev/venv/bin/python, python3. With --install, a .dev/venv is created and
# filled from PyPI when none of them has the packages (about a minute and 5.6 GB, once),
# and a .dev/venv made before tensorboard or sentencepiece was needed gets them; when PyPI
# cannot be reached it says so and prints nothing (or the venv without them: the tests or
# fixtures that need them skip).
# With --has MODULE[,MODULE...], prints the first of the same three that imports just those
# modules (a test that needs only tokenizers runs where torch is missing), or nothing.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV="$ROOT/.dev/venv"
MODULES="torch, transformers, tokenizers, safetensors"
[ "${1:-}" = "--has" ] && MODULES=${2:?--has names modules}
has() { [ -n "$1" ] && command -v "$1" > /dev/null 2>&1 && "$1" -c "import $MODULES" > /dev/null 2>&1; }
for py in "${STRATA_PYTHON:-}" "$VENV/bin/python" python3; do
  if has "$py"; then
    for pkg in tensorboard sentencepiece; do
      if [ "${1:-}" = "--install" ] && [ "$py" = "$VENV/bin/python" ] && ! "$py" -c "import $pkg" > /dev/null 2>&1; then
        echo "[python] installing $pkg into $VENV from PyPI (once)" >&2
        "$VENV/bin/pip" install --quiet --disable-pip-version-check --timeout 60 $pkg > "$ROOT/.dev/pip.log" 2>&1 ||
          echo "[python] pip could not install $pkg (see .dev/pip.log): what needs it will skip" >&2
      fi
    done
    command -v "$py"
    exit 0
  fi
done
[ "${1:-}" = "--install" ] || exit 0
echo "[python] installing torch, transformers, tokenizers, tensorboard, sentencepiece into $VENV from PyPI (once; about a minute)" >&2
if ! { [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV" > /dev/null 2>&1; }; then
  echo "[python] cannot create $VENV (is python3-venv installed?): the reference tests will skip" >&2
  exit 0
fi
if ! "$VENV/bin/pip" install --quiet --disable-pip-version-check --timeout 60 \
       torch transformers tokenizers safetensors tensorboard sentencepiece > "$ROOT/.dev/pip.log" 2>&1; then
  echo "[python] pip could not install from PyPI (see .dev/pip.log: $(tail -1 "$ROOT/.dev/pip.log")):" \
       "the reference tests will skip" >&2
  exit 0
fi
has "$VENV/bin/python" && echo "$VENV/bin/python"
exit 0
