#!/usr/bin/env bash
# Added tokens against Hugging Face `tokenizers` (tests/added_tokens_reference.py): tokenizers
# made offline with added tokens that are normalized or not, single_word, lstrip, rstrip and
# special, overlapping one another, encode crafted and random strings with `strata prepare
# --tokenizer` to tokenizers' own ids. Needs only the `tokenizers` package: the Python is
# $STRATA_PYTHON, else launcher/python-env.sh's venv, else python3; exits 77 (skip), saying
# so, when none of them has it.
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
PY=$("$SRC/launcher/python-env.sh" --has tokenizers)
[ -n "$PY" ] || { echo "SKIP: no Python with tokenizers (set STRATA_PYTHON, or launcher/python-env.sh --install)"; exit 77; }
W=$(mktemp -d /tmp/strata-e2e-added.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
"$PY" "$SRC/tests/added_tokens_reference.py" --strata "$S" --workdir "$W"
