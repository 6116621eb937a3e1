#!/usr/bin/env bash
# The tokenizers of today's models against Hugging Face `tokenizers`
# (tests/tokenizers_reference.py): fixtures built offline from the components of Llama 3's,
# Qwen2's, Llama 2's and Mistral's tokenizer.json (the last from a model `sentencepiece`
# trains), trained on tiny shakespeare, encode it and a Unicode-heavy text with `strata
# prepare --tokenizer` to tokenizers' ids (Llama 3's 128256 tokens into 32-bit shards) and
# decode them to tokenizers' text; an NFC fixture holds io/nfc.c to tokenizers' NFC on every
# decomposable character. Also: io/nfc_tables.h is what tests/gen_nfc_tables.py writes.
# Needs the `tokenizers` package (sentencepiece and transformers for the Mistral fixture,
# which is skipped without them, saying so): the Python is $STRATA_PYTHON, else
# launcher/python-env.sh's venv, else python3; exits 77 (skip), saying why, without it or
# without the corpus.
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
BUILD=${STRATA_BUILD_DIR:?set by ctest}
corpus="$SRC/../shared/data/tinyshakespeare.txt"
[ -f "$corpus" ] || { echo "SKIP: no $corpus (tiny shakespeare)"; exit 77; }
PY=$("$SRC/launcher/python-env.sh" --has tokenizers)
[ -n "$PY" ] || { echo "SKIP: no Python with tokenizers (set STRATA_PYTHON, or launcher/python-env.sh --install)"; exit 77; }
W=$(mktemp -d /tmp/strata-e2e-tokenizers.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
if command -v perl > /dev/null; then
  set +e
  "$PY" "$SRC/tests/gen_nfc_tables.py" --check
  rc=$?
  set -e
  [ $rc = 0 ] || [ $rc = 77 ] || { echo "FAIL: io/nfc_tables.h is not what tests/gen_nfc_tables.py writes"; exit 1; }
fi
"$PY" "$SRC/tests/tokenizers_reference.py" --strata "$S" --test-bpe "$BUILD/tests/test_bpe" --workdir "$W" --corpus "$corpus"
