/* io/nfc.h: Unicode Normalization Form C (canonical decomposition, canonical ordering,
 * canonical composition, Hangul by its algorithm), what Hugging Face `tokenizers`' NFC
 * normalizer does to a text before Qwen's tokenizer splits it. The data are
 * io/nfc_tables.h, made from Python's unicodedata by tests/gen_nfc_tables.py (the Unicode
 * version is STRATA_NFC_UNICODE_VERSION there). */
#ifndef STRATA_NFC_H
#define STRATA_NFC_H

#include <stddef.h>

/* The NFC of valid UTF-8 s[0, n), NUL-terminated, to free; its length in *out_len. NULL
 * when s is NFC already by the quick test (no code point at or above U+0300: every such
 * text is its own NFC), which is most text. */
char *strata_nfc(const char *s, size_t n, size_t *out_len);
/* The Unicode version of the tables, e.g. "14.0.0". */
const char *strata_nfc_unicode_version(void);

#endif
