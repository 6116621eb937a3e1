#!/usr/bin/env bash
# Strata against Hugging Face transformers and tokenizers (tests/hf_reference.py): a
# GPT2LMHeadModel saved by transformers (fp32, fp16, bf16 sharded, GPT2Model names) loads
# with model.init_from at transformers' loss; a byte-level BPE trained by tokenizers on tiny
# shakespeare encodes the corpus and a Unicode-heavy file to tokenizers' ids; an exported
# run loads with from_pretrained and AutoTokenizer as it is. The Python is
# launcher/python-env.sh's (launcher/test.sh installs it from PyPI); exits 77 (skip) when
# there is none, or without the corpus.
set -euo pipefail
S=${STRATA:?set by ctest}
SRC=${STRATA_SOURCE_DIR:?set by ctest}
corpus="$SRC/../shared/data/tinyshakespeare.txt"
[ -f "$corpus" ] || { echo "SKIP: no $corpus (tiny shakespeare)"; exit 77; }
PY=$("$SRC/launcher/python-env.sh")
[ -n "$PY" ] || { echo "SKIP: no Python with torch, transformers, tokenizers (launcher/python-env.sh --install)"; exit 77; }
W=$(mktemp -d /tmp/strata-e2e-transformers.XXXXXX)
trap 'rm -rf "$W"' EXIT
"$PY" "$SRC/tests/hf_reference.py" --strata "$S" --workdir "$W/work" --corpus "$corpus"
