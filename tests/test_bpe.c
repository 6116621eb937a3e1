/* tests/test_bpe.c: BPE on hand-made tokenizers whose ids are worked out by hand: GPT-2's
 * byte characters, merges by rank (lowest first, leftmost among equals), the
 * pre-tokeniser's split, added tokens, add_prefix_space, unknown bytes, invalid UTF-8,
 * decoding, the byte-level identity, writing and reading back (tokenizer.json and
 * vocab.json + merges.txt); a Split pattern before ByteLevel (Llama 3's layout) with
 * ignore_merges and a template's BOS; a vocabulary of text (Llama 2's and Mistral's
 * layouts: Prepend + Replace or Metaspace, byte fallback, the unknown token, their
 * decoders); NFC against hand-worked compositions; tokenizer_config.json; and the
 * refusals. tests/e2e_transformers.sh, tests/e2e_added_tokens.sh and
 * tests/e2e_tokenizers.sh check real tokenizers against Hugging Face `tokenizers`. */
#include "core/common.h"
#include "io/bpe.h"
#include "io/nfc.h"
#include "tests/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static void write_file(const char *name, const char *text) {
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    fputs(text, f);
    fclose(f);
}

typedef struct ids {
    int32_t v[256];
    size_t n;
} ids;

static int sink(void *ctx, const int32_t *v, size_t n) {
    ids *o = ctx;
    for (size_t i = 0; i < n && o->n < 256; i++) o->v[o->n++] = v[i];
    return 0;
}

/* Encodes text; the ids as "5 2", or "error: <message>". */
static const char *enc(strata_bpe *t, const char *text, size_t len) {
    static char out[1024];
    ids o = {{0}, 0};
    if (strata_bpe_encode(t, text, len, "text", sink, &o)) {
        snprintf(out, sizeof out, "error: %s", strata_error());
        return out;
    }
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < o.n; i++) k += (size_t)snprintf(out + k, sizeof out - k, i ? " %d" : "%d", o.v[i]);
    return out;
}
#define ENC(t, s) enc(t, s, sizeof(s) - 1)

/* "Ġ" is the space's character (U+0120), "Ċ" the newline's (U+010A). */
#define VOCAB "{\"a\":0,\"b\":1,\"c\":2,\"\xc4\xa0\":3,\"\xc4\x8a\":4,\"ab\":5,\"bc\":6,\"\xc4\xa0" "a\":7,\"aa\":8," \
              "\"<|endoftext|>\":9,\"d\":10}"

static const char *tokenizer_json(char *buf, size_t n, const char *merges, const char *extra_pre, const char *model_extra) {
    snprintf(buf, n,
             "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
             "\"added_tokens\":[{\"id\":9,\"content\":\"<|endoftext|>\",\"single_word\":false,\"lstrip\":false,"
             "\"rstrip\":false,\"normalized\":false,\"special\":true}],\"normalizer\":null,"
             "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":%s,\"trim_offsets\":true,\"use_regex\":true},"
             "\"post_processor\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"},"
             "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,%s\"vocab\":" VOCAB ",\"merges\":%s}}",
             extra_pre, model_extra, merges);
    return buf;
}

static strata_bpe *load_text(const char *name, const char *json) {
    write_file(name, json);
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return strata_bpe_load(p);
}

static void test_encode(void) {
    char j[4096];
    strata_bpe *t = load_text("t.json", tokenizer_json(j, sizeof j, "[\"a b\",[\"b\",\"c\"],\"\xc4\xa0 a\",\"a a\"]", "false", ""));
    CHECK(t != NULL, "load a tokenizer.json with string and pair merges (%s)", t ? "" : strata_error());
    if (!t) return;
    CHECK(strata_bpe_vocab_size(t) == 11 && strata_bpe_special_id(t, "<|endoftext|>") == 9, "11 ids; <|endoftext|> is 9");
    CHECK(!strcmp(ENC(t, "abc"), "5 2"), "abc: (a,b) has the lower rank, so ab c -> %s", ENC(t, "abc"));
    CHECK(!strcmp(ENC(t, "aaa"), "8 0"), "aaa: the leftmost (a,a) merges first -> %s", ENC(t, "aaa"));
    CHECK(!strcmp(ENC(t, " a"), "7"), "' a': the space's character merges with a -> %s", ENC(t, " a"));
    CHECK(!strcmp(ENC(t, "a b"), "0 3 1"), "'a b': pieces 'a' and ' b' -> %s", ENC(t, "a b"));
    CHECK(!strcmp(ENC(t, "ab\n"), "5 4"), "'ab\\n': the newline is its own piece -> %s", ENC(t, "ab\n"));
    CHECK(!strcmp(ENC(t, "a<|endoftext|>b<|endoftext|>"), "0 9 1 9"), "added tokens are cut out -> %s",
          ENC(t, "a<|endoftext|>b<|endoftext|>"));
    /* one letter piece "aéb": é's two bytes have no characters in this vocabulary and drop
     * out before the merges, so a and b meet and merge, as in tokenizers */
    CHECK(!strcmp(ENC(t, "a\xc3\xa9" "b"), "5"), "bytes without a token are dropped before merging -> %s",
          ENC(t, "a\xc3\xa9" "b"));
    CHECK(strstr(ENC(t, "a\xff" "b"), "error: text: byte 1 is not valid UTF-8") != NULL, "invalid UTF-8 is refused: %s",
          ENC(t, "a\xff" "b"));
    CHECK(!strcmp(enc(t, "", 0), ""), "empty text, no ids");
    size_t len = 0;
    const unsigned char *b = strata_bpe_token_bytes(t, 3, &len);
    CHECK(b && len == 1 && b[0] == ' ', "token 3 decodes to a space");
    b = strata_bpe_token_bytes(t, 7, &len);
    CHECK(b && len == 2 && !memcmp(b, " a", 2), "token 7 decodes to ' a'");
    b = strata_bpe_token_bytes(t, 9, &len);
    CHECK(b && len == 13 && !memcmp(b, "<|endoftext|>", 13), "an added token decodes to its text");
    CHECK(!strata_bpe_token_bytes(t, 11, &len) && !strata_bpe_token_bytes(t, -1, &len), "ids outside the vocabulary");

    /* written back and read again: the same file, the same ids */
    char p[128];
    snprintf(p, sizeof p, "%s/saved.json", dir);
    CHECK(strata_bpe_save(t, p) == 0, "save");
    strata_bpe *t2 = strata_bpe_load(p);
    CHECK(t2 && !strcmp(ENC(t2, "abc aaa a<|endoftext|>"), ENC(t, "abc aaa a<|endoftext|>")), "the saved tokenizer encodes alike");
    strata_bpe_free(t2);
    /* GPT-2's original pair of files */
    snprintf(p, sizeof p, "%s/gpt2", dir);
    mkdir(p, 0755);
    CHECK(strata_bpe_save_vocab_merges(t, p) == 0, "save vocab.json + merges.txt");
    t2 = strata_bpe_load(p);
    CHECK(t2 && !strcmp(ENC(t2, "abc aaa a<|endoftext|>"), ENC(t, "abc aaa a<|endoftext|>")) &&
              strata_bpe_special_id(t2, "<|endoftext|>") == 9,
          "a directory with vocab.json + merges.txt encodes alike, <|endoftext|> special");
    /* and the tokenizer.json generated from those */
    snprintf(p, sizeof p, "%s/gen.json", dir);
    strata_bpe *t3 = t2 && strata_bpe_save(t2, p) == 0 ? strata_bpe_load(p) : NULL;
    CHECK(t3 && !strcmp(ENC(t3, "abc aaa a<|endoftext|>"), ENC(t, "abc aaa a<|endoftext|>")),
          "the tokenizer.json written for vocab.json + merges.txt encodes alike");
    strata_bpe_free(t3);
    strata_bpe_free(t2);
    strata_bpe_free(t);

    /* the merge order decides */
    t = load_text("t2.json", tokenizer_json(j, sizeof j, "[\"b c\",\"a b\"]", "false", ""));
    CHECK(t && !strcmp(ENC(t, "abc"), "0 6"), "with (b,c) ranked first: a bc -> %s", t ? ENC(t, "abc") : "");
    strata_bpe_free(t);
    t = load_text("t3.json", tokenizer_json(j, sizeof j, "[\"\xc4\xa0 a\"]", "true", ""));
    CHECK(t && !strcmp(ENC(t, "a"), "7") && !strcmp(ENC(t, " a"), "7"), "add_prefix_space: 'a' encodes as ' a'");
    strata_bpe_free(t);
    t = load_text("t4.json", tokenizer_json(j, sizeof j, "[\"a b\",\"b c\"]", "false", "\"ignore_merges\":true,"));
    CHECK(t && !strcmp(ENC(t, "bc"), "6") && !strcmp(ENC(t, "abc"), "5 2"), "ignore_merges: a whole piece in the vocabulary wins");
    strata_bpe_free(t);
}

static void test_bytes(void) {
    strata_bpe *t = strata_bpe_bytes();
    CHECK(strata_bpe_is_bytes(t) && strata_bpe_vocab_size(t) == 256, "the byte-level tokenizer: 256 ids");
    CHECK(!strcmp(ENC(t, "h\xc3\xa9 \n"), "104 195 169 32 10"), "ids are the UTF-8 bytes -> %s", ENC(t, "h\xc3\xa9 \n"));
    char p[128];
    snprintf(p, sizeof p, "%s/bytes.json", dir);
    strata_bpe *t2 = strata_bpe_save(t, p) == 0 ? strata_bpe_load(p) : NULL;
    CHECK(t2 && strata_bpe_is_bytes(t2) && !strcmp(ENC(t2, "h\xc3\xa9 \n"), "104 195 169 32 10"),
          "its tokenizer.json reads back as the byte-level identity");
    size_t len;
    const unsigned char *b = t2 ? strata_bpe_token_bytes(t2, 0xC3, &len) : NULL;
    CHECK(b && len == 1 && b[0] == 0xC3, "token 195 decodes to byte 0xc3");
    const int32_t ok_ids[] = {104, 195, 169}, bad_ids[] = {195, 104, 300, 169};
    char *text = strata_bpe_decode(t, ok_ids, 3, &len);
    CHECK(len == 3 && !strcmp(text, "h\xc3\xa9"), "decode: bytes that form UTF-8 pass through");
    free(text);
    text = strata_bpe_decode(t, bad_ids, 4, &len);
    CHECK(len == 7 && !strcmp(text, "\xef\xbf\xbdh\xef\xbf\xbd"), "decode: stray bytes become U+FFFD, unknown ids nothing");
    free(text);
    strata_bpe_free(t2);
    strata_bpe_free(t);
}

/* The test tokenizer (merges (a,b), (b,c), (Ġ,a), (a,a)) with `added` as its added_tokens. */
static strata_bpe *with_added(const char *name, const char *added) {
    char j[4096], k[4096];
    tokenizer_json(j, sizeof j, "[\"a b\",[\"b\",\"c\"],\"\xc4\xa0 a\",\"a a\"]", "false", "");
    const char *from = strstr(j, "\"added_tokens\":["), *to = strstr(j, "],\"normalizer\"");
    snprintf(k, sizeof k, "%.*s\"added_tokens\":[%s%s", (int)(from - j), j, added, to);
    strata_bpe *t = load_text(name, k);
    if (!t) printf("    %s: %s\n", name, strata_error());
    return t;
}
#define ADDED(id, content, flags) "{\"id\":" #id ",\"content\":\"" content "\"," flags "}"

/* Added tokens as tokenizers' AddedVocabulary splits text: tokens with normalized false
 * first, in the text itself; normalized ones in what those leave; single_word, lstrip and
 * rstrip. tests/e2e_added_tokens.sh checks many more strings against tokenizers itself. */
static void test_added_tokens(void) {
    strata_bpe *plain = with_added("plain.json", "");
    strata_bpe *t = with_added("norm.json", ADDED(1, "b", "\"normalized\":false") "," ADDED(11, "abc", "\"normalized\":true"));
    CHECK(t && !strcmp(ENC(t, "abc"), "0 1 2"),
          "'abc' with added 'b' (normalized false) and 'abc' (normalized true): b is cut out first -> %s",
          t ? ENC(t, "abc") : "");
    strata_bpe_free(t);
    t = with_added("norm2.json", ADDED(1, "b", "\"normalized\":true") "," ADDED(11, "abc", "\"normalized\":false"));
    CHECK(t && !strcmp(ENC(t, "abc b"), "11 3 1"), "with the flags the other way round 'abc' is one token -> %s",
          t ? ENC(t, "abc b") : "");
    strata_bpe_free(t);
    t = with_added("norm3.json", ADDED(1, "b", "\"special\":true") "," ADDED(11, "abc", "\"special\":false"));
    CHECK(t && !strcmp(ENC(t, "abc"), "0 1 2"), "without the key, a special token is not normalized, another is -> %s",
          t ? ENC(t, "abc") : "");
    strata_bpe_free(t);

    t = with_added("word.json", ADDED(11, "ca", "\"single_word\":true,\"normalized\":false") "," ADDED(0, "a", "\"normalized\":false"));
    CHECK(t && !strcmp(ENC(t, "b ca b"), "1 3 11 3 1") && !strcmp(ENC(t, "ca\n"), "11 4"),
          "single_word: 'ca' between spaces, or before a newline, is the token -> %s, %s", t ? ENC(t, "b ca b") : "",
          t ? ENC(t, "ca\n") : "");
    /* inside a word it is not, and the search goes on after it: the 'a' inside is hidden */
    CHECK(t && plain && !strcmp(ENC(t, "bcab"), "6 5") && !strcmp(ENC(t, "_ca"), ENC(plain, "_ca")),
          "single_word: 'ca' inside 'bcab' (and after '_', a word character) is text, and hides its 'a' -> %s",
          t ? ENC(t, "bcab") : "");
    strata_bpe_free(t);

    t = with_added("strip.json", ADDED(11, "ca", "\"lstrip\":true,\"rstrip\":true,\"normalized\":false") ","
                                 ADDED(12, " b", "\"normalized\":false"));
    CHECK(t && !strcmp(ENC(t, "a  ca  a"), "0 11 0") && !strcmp(ENC(t, "a\t\xe3\x80\x80" "ca\xe2\x80\x80" "a"), "0 11 0"),
          "lstrip and rstrip take the whitespace around the token along (spaces, tab, U+3000, U+2000) -> %s",
          t ? ENC(t, "a  ca  a") : "");
    CHECK(t && !strcmp(ENC(t, "ca ca"), "11 11"), "lstrip takes nothing of an earlier token's rstrip -> %s",
          t ? ENC(t, "ca ca") : "");
    CHECK(t && !strcmp(ENC(t, "ca ba"), "11 12 0"),
          "a token may start inside whitespace rstrip took: both ids, then the text after it -> %s", t ? ENC(t, "ca ba") : "");
    strata_bpe_free(t);
    strata_bpe_free(plain);
}

static int refused(const char *json, const char *what) {
    strata_bpe *t = load_text("bad.json", json);
    if (t) {
        strata_bpe_free(t);
        return 0;
    }
    int ok = strstr(strata_error(), "bad.json") && strstr(strata_error(), what);
    if (!ok) printf("    message: %s\n", strata_error());
    return ok;
}

/* j with its first `from` replaced by `to`, into k */
static const char *edit(char *k, size_t n, const char *j, const char *from, const char *to) {
    const char *at = strstr(j, from);
    snprintf(k, n, "%.*s%s%s", (int)(at - j), j, to, at + strlen(from));
    return k;
}

static void test_refusals(void) {
    char j[4096], k[4096];
    tokenizer_json(j, sizeof j, "[\"a b\"]", "false", "");
#define EDIT(from, to) edit(k, sizeof k, j, from, to)
    CHECK(refused(EDIT("\"normalizer\":null", "\"normalizer\":{\"type\":\"NFKC\"}"), "normalizer is NFKC"),
          "a normalizer other than NFC, Prepend, Replace");
    CHECK(refused(EDIT("\"normalizer\":null", "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\" +\"},"
                       "\"content\":\" \"}"), "its pattern is a Regex"), "a Replace normalizer with a Regex");
    CHECK(refused(EDIT("\"pre_tokenizer\":{\"type\":\"ByteLevel\"", "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":"
                       "{\"Regex\":\"a\"},\"behavior\":\"Removed\",\"invert\":false,\"x\":\"ByteLevel\""),
                  "Split with behavior Removed"), "a Split that is not Isolated");
    CHECK(refused(EDIT("\"decoder\":{\"type\":\"ByteLevel\"}", "\"decoder\":{\"type\":\"WordPiece\"}"),
                  "decoder is WordPiece"), "another decoder");
    CHECK(refused(EDIT("\"post_processor\":{\"type\":\"ByteLevel\"}", "\"post_processor\":{\"type\":\"RobertaProcessing\"}"),
                  "post_processor is RobertaProcessing"), "another post-processor");
    CHECK(refused(EDIT("\"type\":\"ByteLevel\",\"add_prefix_space\"", "\"type\":\"Whitespace\",\"add_prefix_space\""),
                  "pre_tokenizer is of type Whitespace"), "another pre-tokenizer");
    CHECK(refused(EDIT("\"dropout\":null", "\"dropout\":0.1"), "dropout"), "BPE dropout");
    CHECK(refused(EDIT("\"lstrip\":false", "\"lstrip\":1"), "added_tokens[0]: \"lstrip\" must be true or false"),
          "an added token's flag that is not a boolean");
    CHECK(refused(EDIT("\"post_processor\":{\"type\":\"ByteLevel\"}",
                       "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
                       "{\"Sequence\":{\"id\":\"A\"}}]}"),
                  "special token \"<s>\" has no ids"), "a template naming a token it gives no ids");
    CHECK(refused(EDIT("\"post_processor\":{\"type\":\"ByteLevel\"}",
                       "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
                       "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"ids\":[99]}}}"),
                  "names id 99, which is no token"), "a template id outside the vocabulary");
    strata_bpe *ok = load_text("ok.json", EDIT("\"post_processor\":{\"type\":\"ByteLevel\"}",
                                               "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":"
                                               "[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]}"));
    CHECK(ok != NULL, "a template of the text alone (what transformers writes for GPT-2) is accepted");
    strata_bpe_free(ok);
    CHECK(refused(EDIT("\"type\":\"BPE\"", "\"type\":\"WordPiece\""), "type is WordPiece"), "a WordPiece model");
    CHECK(refused(EDIT("[\"a b\"]", "[\"a d\"]"), "merge 0 (\"a\" \"d\"): \"ad\" is not in the vocabulary"),
          "a merge whose result is not in the vocabulary");
    CHECK(refused(EDIT("[\"a b\"]", "[\"a b c\"]"), "two tokens separated by one space"), "a merge of three tokens");
    CHECK(refused(EDIT("\"d\":10", "\"d\":9"), "id 9 is given to both"), "two tokens with one id");
    CHECK(refused(EDIT("\"dropout\":null", "\"dropout\":null,\"byte_fallback\":true"), "byte-level BPE never needs it"),
          "byte fallback in a byte-level vocabulary");
    CHECK(refused("{\"model\":", "byte 9"), "truncated JSON, with its byte offset");
#undef EDIT
    char p[128];
    snprintf(p, sizeof p, "%s/empty", dir);
    mkdir(p, 0755);
    CHECK(strata_bpe_load(p) == NULL && strstr(strata_error(), "neither tokenizer.json nor vocab.json + merges.txt"),
          "a directory without tokenizer files");
    write_file("gpt2/merges.txt", "#version: 0.2\na b\nb\n");
    snprintf(p, sizeof p, "%s/gpt2", dir);
    CHECK(strata_bpe_load(p) == NULL && strstr(strata_error(), "merges.txt:3:"), "a bad merges.txt line, by line number");
}

/* The ids of a document (with the template's tokens), as enc() writes them. */
static const char *enc_doc(strata_bpe *t, const char *text) {
    static char out[1024];
    ids o = {{0}, 0};
    if (strata_bpe_encode_doc(t, text, strlen(text), "text", sink, &o)) {
        snprintf(out, sizeof out, "error: %s", strata_error());
        return out;
    }
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < o.n; i++) k += (size_t)snprintf(out + k, sizeof out - k, i ? " %d" : "%d", o.v[i]);
    return out;
}

/* Llama 3's layout: a Split pattern (here: runs of letters, single digits), then ByteLevel
 * without its regex, ignore_merges, a template putting <|begin_of_text|> first, an id far
 * past the vocabulary. */
static void test_split_layout(void) {
    const char *json =
        "{\"added_tokens\":[{\"id\":128000,\"content\":\"<|begin_of_text|>\",\"special\":true,\"normalized\":false},"
        "{\"id\":128009,\"content\":\"<|eot_id|>\",\"special\":true,\"normalized\":false}],\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\" ?\\\\p{L}+|\\\\p{N}\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":"
        "false,\"trim_offsets\":true,\"use_regex\":false}]},\"post_processor\":{\"type\":\"Sequence\",\"processors\":["
        "{\"type\":\"ByteLevel\",\"trim_offsets\":false},{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
        "{\"id\":\"<|begin_of_text|>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],"
        "\"special_tokens\":{\"<|begin_of_text|>\":{\"id\":\"<|begin_of_text|>\",\"ids\":[128000],\"tokens\":"
        "[\"<|begin_of_text|>\"]}}}]},\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,"
        "\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"\xc4\xa0\":3,\"1\":4,\"2\":5,\"ab\":6,\"abc\":7,\"bc\":8,\"\xc4\xa0" "a\":9},"
        "\"merges\":[\"b c\",\"a b\",\"\xc4\xa0 a\"]}}";
    strata_bpe *t = load_text("llama3.json", json);
    CHECK(t != NULL, "a Split + ByteLevel tokenizer with a template loads (%s)", t ? "" : strata_error());
    if (!t) return;
    CHECK(strata_bpe_vocab_size(t) == 128010, "vocabulary size is the highest id + 1: %d", strata_bpe_vocab_size(t));
    CHECK(!strcmp(ENC(t, "abc"), "7"), "ignore_merges: 'abc' is a token, not ab+c or a+bc -> %s", ENC(t, "abc"));
    CHECK(!strcmp(ENC(t, "abcb"), "0 8 1"), "'abcb' is no token: merges by rank, (b,c) before (a,b) -> %s",
          ENC(t, "abcb"));
    CHECK(!strcmp(ENC(t, "12 ab"), "4 5 3 6"), "the Split pattern: digits one by one, ' ab' a piece (Ġ ab) -> %s",
          ENC(t, "12 ab"));
    CHECK(!strcmp(enc_doc(t, "ab<|eot_id|>"), "128000 6 128009"), "a document starts with the template's BOS -> %s",
          enc_doc(t, "ab<|eot_id|>"));
    CHECK(strata_bpe_bos_id(t) == 128000 && strata_bpe_eos_id(t) == -1, "BOS from the template, no EOS known");
    size_t len;
    const int32_t doc[] = {128000, 9, 128009};
    char *text = strata_bpe_decode(t, doc, 3, &len);
    CHECK(!strcmp(text, "<|begin_of_text|> a<|eot_id|>"), "decode keeps special tokens as their text: %s", text);
    free(text);
    strata_bpe_free(t);
}

/* strata_bpe_line_cuts: which tokenizers a text may be cut for (after a '\n' that follows
 * a visible ASCII character, before an ASCII letter), and that the parts' ids joined are
 * the whole's there. tests/tokenizers_reference.py and hf_reference.py hold prepare's cuts
 * to tokenizers' ids on the real layouts. */
static void test_line_cuts(void) {
    char j[4096], k[4096];
    tokenizer_json(j, sizeof j, "[\"a b\",[\"b\",\"c\"],\"\xc4\xa0 a\",\"a a\"]", "false", "");
    strata_bpe *t = load_text("cuts.json", j);
    CHECK(t && strata_bpe_line_cuts(t), "GPT-2's layout (ByteLevel with its pattern) may be cut");
    /* each text cut at its one allowed cut: the parts' ids joined are the whole's */
    static const char *const texts[][2] = {{"ab c\n", "abc\n\nb a"}, {"a\n", "b  c\n"}, {"b  bc\n", "c ab  "}};
    for (int i = 0; t && i < 3; i++) {
        char whole[256], joined[1100];
        snprintf(whole, sizeof whole, "%s%s", texts[i][0], texts[i][1]);
        snprintf(joined, sizeof joined, "%s", enc(t, texts[i][0], strlen(texts[i][0])));
        const char *second = enc(t, texts[i][1], strlen(texts[i][1]));
        snprintf(joined + strlen(joined), sizeof joined - strlen(joined), " %s", second);
        const char *all = enc(t, whole, strlen(whole));
        CHECK(!strcmp(all, joined), "cut after a newline before a letter: the parts' ids joined are the whole's (%s)",
              all);
    }
    strata_bpe_free(t);
#define EDIT(from, to) edit(k, sizeof k, j, from, to)
    t = load_text("cuts_nfc.json", EDIT("\"normalizer\":null", "\"normalizer\":{\"type\":\"NFC\"}"));
    CHECK(t && strata_bpe_line_cuts(t), "NFC before it: may be cut (nothing composes with a newline)");
    strata_bpe_free(t);
    t = load_text("cuts_prepend.json", EDIT("\"normalizer\":null", "\"normalizer\":{\"type\":\"Prepend\",\"prepend\":\"x\"}"));
    CHECK(t && !strata_bpe_line_cuts(t), "Prepend before it: may not (each part would gain the prefix)");
    strata_bpe_free(t);
    t = load_text("cuts_space.json", EDIT("\"add_prefix_space\":false", "\"add_prefix_space\":true"));
    CHECK(t && !strata_bpe_line_cuts(t), "ByteLevel with add_prefix_space: may not (each part would gain a space)");
    strata_bpe_free(t);
    t = load_text("cuts_noregex.json", EDIT("\"use_regex\":true", "\"use_regex\":false"));
    CHECK(t && !strata_bpe_line_cuts(t), "ByteLevel without its pattern: may not (the whole text is one piece)");
    strata_bpe_free(t);
    /* Split: Llama 3's pattern may be cut, another may not */
    const char *llama3 = "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
                         "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}"
                         "\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\","
                         "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}";
    char pre[1024];
    snprintf(pre, sizeof pre, "\"pre_tokenizer\":%s", llama3);
    const char *from = strstr(j, "\"pre_tokenizer\":"), *to = strstr(j, ",\"post_processor\"");
    snprintf(k, sizeof k, "%.*s%s%s", (int)(from - j), j, pre, to);
    t = load_text("cuts_llama3.json", k);
    CHECK(t && strata_bpe_line_cuts(t), "Llama 3's Split, then ByteLevel: may be cut (%s)", t ? "" : strata_error());
    strata_bpe_free(t);
    char *p = strstr(k, "\\\\p{N}{1,3}");
    if (p) memcpy(p, "\\\\p{N}{1,4}", 11);
    t = load_text("cuts_other.json", k);
    CHECK(p && t && !strata_bpe_line_cuts(t), "another Split pattern: may not (its pieces are not known to end there)");
    strata_bpe_free(t);
#undef EDIT
    t = with_added("cuts_lstrip.json", ADDED(11, "ca", "\"lstrip\":true,\"normalized\":false"));
    CHECK(t && !strata_bpe_line_cuts(t), "an added token with lstrip: may not (it takes the newline along)");
    strata_bpe_free(t);
    t = with_added("cuts_newline.json", ADDED(11, "\\nc", "\"normalized\":false"));
    CHECK(t && !strata_bpe_line_cuts(t), "an added token holding a newline: may not (it spans the cut)");
    strata_bpe_free(t);
    t = with_added("cuts_plain.json", ADDED(11, "ca", "\"rstrip\":true,\"normalized\":false"));
    CHECK(t && strata_bpe_line_cuts(t), "an added token with rstrip only: may be cut");
    strata_bpe_free(t);
}

/* Llama 2's layout: a vocabulary of text, Prepend + Replace, byte fallback, the unknown
 * token, a template of <s>, and the Replace/ByteFallback/Fuse/Strip decoder; then the same
 * vocabulary with Metaspace (prepend_scheme first) as newer files write it. */
static void test_sentencepiece_layout(void) {
    char vocab[16384];
    size_t k = (size_t)snprintf(vocab, sizeof vocab, "\"<unk>\":0,\"<s>\":1,\"</s>\":2");
    for (int b = 0; b < 256; b++) k += (size_t)snprintf(vocab + k, sizeof vocab - k, ",\"<0x%02X>\":%d", b, 3 + b);
    /* 259 "▁", 260 "H", 261 "i", 262 "▁H", 263 "▁Hi", 264 "é" */
    snprintf(vocab + k, sizeof vocab - k, ",\"\xe2\x96\x81\":259,\"H\":260,\"i\":261,\"\xe2\x96\x81H\":262,\"\xe2\x96\x81Hi\":263,"
                                          "\"\xc3\xa9\":264");
    const char *added = "[{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalized\":false},{\"id\":1,\"content\":\"<s>\","
                        "\"special\":true,\"normalized\":false},{\"id\":2,\"content\":\"</s>\",\"special\":true,\"normalized\":false}]";
    const char *tail = "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
                       "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1]}}},"
                       "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xe2\x96\x81\"},"
                       "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \","
                       "\"start\":1,\"stop\":0}]},\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
                       "\"byte_fallback\":%s,\"vocab\":{%s},\"merges\":[\"\xe2\x96\x81 H\",\"\xe2\x96\x81H i\"]}}";
    char json[32768], fmt[4096];
    snprintf(fmt, sizeof fmt, "{\"added_tokens\":%s,\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":"
                              "\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
                              "\"content\":\"\xe2\x96\x81\"}]},\"pre_tokenizer\":null,%s", added, tail);
    snprintf(json, sizeof json, fmt, "true", vocab);
    strata_bpe *t = load_text("llama2.json", json);
    CHECK(t != NULL, "a Prepend + Replace tokenizer with byte fallback loads (%s)", t ? "" : strata_error());
    if (t) {
        CHECK(!strcmp(ENC(t, "Hi"), "263"), "'Hi': the prepended \u2581 merges into \u2581Hi -> %s", ENC(t, "Hi"));
        CHECK(!strcmp(ENC(t, "Hi Hi"), "263 263"), "'Hi Hi': the space becomes \u2581 -> %s", ENC(t, "Hi Hi"));
        CHECK(!strcmp(ENC(t, "Hi\xc3\xa9\xe4\xb8\xad"), "263 264 231 187 176"),
              "a character with a token is it, one without is its bytes' <0xNN> -> %s", ENC(t, "Hi\xc3\xa9\xe4\xb8\xad"));
        CHECK(!strcmp(ENC(t, "Hi</s>Hi"), "263 2 263"), "each stretch between added tokens gets its own \u2581 -> %s",
              ENC(t, "Hi</s>Hi"));
        CHECK(!strcmp(enc_doc(t, "Hi"), "1 263"), "a document starts with <s> -> %s", enc_doc(t, "Hi"));
        size_t len;
        const int32_t ids1[] = {1, 263, 262, 264, 231, 187, 176, 263, 231};
        char *text = strata_bpe_decode(t, ids1, 9, &len);
        CHECK(!strcmp(text, "<s> Hi H\xc3\xa9\xe4\xb8\xad Hi\xef\xbf\xbd"),
              "decode: \u2581 to space, a byte run to its text (a stray byte U+FFFD), Strip takes no '<': '%s'", text);
        free(text);
        const int32_t ids3[] = {264, 231, 187, 176, 231};
        text = strata_bpe_decode(t, ids3, 5, &len);
        CHECK(!strcmp(text, "\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"),
              "decode: a byte run that is no UTF-8 as a whole is one U+FFFD a byte, as tokenizers' ByteFallback: '%s'", text);
        free(text);
        const int32_t ids2[] = {263, 262};
        text = strata_bpe_decode(t, ids2, 2, &len);
        CHECK(!strcmp(text, "Hi H"), "decode strips the one leading space: '%s'", text);
        free(text);
        uint32_t ch;
        const unsigned char *b = strata_bpe_token_bytes(t, 263, &len);
        CHECK(b && len == 3 && !memcmp(b, " Hi", 3) && (b = strata_bpe_token_bytes(t, 3 + 0xE4, &len)) && len == 1 &&
                  b[0] == 0xE4 && strata_bpe_strip_start(t, &ch) == 1 && ch == ' ',
              "token by token: ' Hi', <0xE4> one byte, one leading space stripped at the start");
        strata_bpe_free(t);
    }
    /* without byte fallback the unknown characters become one fused <unk> */
    snprintf(json, sizeof json, fmt, "false", vocab);
    t = load_text("llama2u.json", json);
    CHECK(t && !strcmp(ENC(t, "Hi\xe4\xb8\xad\xe6\x96\x87Hi"), "263 0 260 261"),
          "no byte fallback: two unknown characters become one <unk> (fuse_unk) -> %s",
          t ? ENC(t, "Hi\xe4\xb8\xad\xe6\x96\x87Hi") : "");
    strata_bpe_free(t);
    /* Metaspace, prepend_scheme first: only the text's first piece gets the \u2581 */
    snprintf(fmt, sizeof fmt, "{\"added_tokens\":%s,\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\","
                              "\"replacement\":\"\xe2\x96\x81\",\"prepend_scheme\":\"first\",\"split\":false},%s", added, tail);
    snprintf(json, sizeof json, fmt, "true", vocab);
    t = load_text("mistral.json", json);
    CHECK(t != NULL, "a Metaspace tokenizer loads (%s)", t ? "" : strata_error());
    if (t) {
        CHECK(!strcmp(ENC(t, "Hi Hi"), "263 263") && !strcmp(ENC(t, "Hi</s>Hi"), "263 2 260 261"),
              "Metaspace first: after an added token no \u2581 is prepended -> %s", ENC(t, "Hi</s>Hi"));
        strata_bpe_free(t);
    }
}

/* NFC against compositions worked out from the Unicode tables, and through a tokenizer. */
static void test_nfc(void) {
    static const struct { const char *in, *want, *what; } cases[] = {
        {"A\xcc\x8a", "\xc3\x85", "A + ring above composes to U+00C5"},
        {"\xe2\x84\xab", "\xc3\x85", "U+212B ANGSTROM SIGN (a singleton) becomes U+00C5"},
        {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81", "Hangul L + V + T compose to U+AC01"},
        {"a\xcc\x81\xcc\xa8", "\xc4\x85\xcc\x81", "a + acute (230) + ogonek (202): reordered, a+ogonek composes, acute stays"},
        {"\xe0\xa4\x95\xe0\xa4\xbc", "\xe0\xa4\x95\xe0\xa4\xbc", "U+0915 + nukta stays apart (U+0958 is excluded)"},
        {"e\xcc\x81\xcc\x81", "\xc3\xa9\xcc\x81", "the second acute is blocked by the first (same class)"},
        {"\xcc\x81" "e", "\xcc\x81" "e", "a leading mark composes with nothing"},
        {"\xe1\xb8\x8b\xcc\xa3", "\xe1\xb8\x8d\xcc\x87", "d-dot-above + dot-below: decomposed, reordered, recomposed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = 0;
        char *out = strata_nfc(cases[i].in, strlen(cases[i].in), &n);
        int ok = out && n == strlen(cases[i].want) && !memcmp(out, cases[i].want, n);
        CHECK(ok, "NFC: %s", cases[i].what);
        free(out);
    }
    size_t n = 0;
    CHECK(strata_nfc("plain caf\xc3\xa9", 10, &n) == NULL, "text below U+0300 is NFC already (quick test)");
    /* through a tokenizer whose normalizer is NFC: decomposed text finds the composed token */
    char j[4096], k[4096];
    tokenizer_json(j, sizeof j, "[\"a b\"]", "false", "");
    strata_bpe *t = load_text("nfc.json", edit(k, sizeof k, j, "\"normalizer\":null", "\"normalizer\":{\"type\":\"NFC\"}"));
    CHECK(t && !strcmp(ENC(t, "abA\xcc\x8a"), ENC(t, "ab\xc3\x85")), "an NFC tokenizer encodes A + ring as U+00C5 -> %s",
          t ? ENC(t, "abA\xcc\x8a") : "");
    strata_bpe_free(t);
}

/* tokenizer_config.json beside tokenizer.json: BOS and EOS by name, the chat template, a
 * Llama class's add_eos_token; written back. */
static void test_config(void) {
    char j[4096], p[128];
    snprintf(p, sizeof p, "%s/cfgdir", dir);
    mkdir(p, 0755);
    tokenizer_json(j, sizeof j, "[\"a b\"]", "false", "");
    write_file("cfgdir/tokenizer.json", j);
    write_file("cfgdir/tokenizer_config.json", "{\"tokenizer_class\":\"LlamaTokenizerFast\",\"bos_token\":\"a\","
                                               "\"eos_token\":{\"content\":\"<|endoftext|>\"},\"add_eos_token\":true,"
                                               "\"chat_template\":\"{{ messages }}\",\"added_tokens_decoder\":{}}");
    strata_bpe *t = strata_bpe_load(p);
    CHECK(t && strata_bpe_has_config(t) && strata_bpe_bos_id(t) == 0 && strata_bpe_eos_id(t) == 9 &&
              !strcmp(strata_bpe_chat_template(t), "{{ messages }}"),
          "tokenizer_config.json: bos 'a', eos <|endoftext|>, the chat template");
    CHECK(t && !strcmp(enc_doc(t, "b"), "0 1 9"), "a Llama class's add_bos_token (default) and add_eos_token put both "
          "around a document -> %s", t ? enc_doc(t, "b") : "");
    snprintf(p, sizeof p, "%s/cfgdir/saved_config.json", dir);
    CHECK(t && strata_bpe_save_config(t, p, 128) == 0, "written back");
    FILE *f = fopen(p, "rb");
    char text[2048] = "";
    if (f) {
        size_t r = fread(text, 1, sizeof text - 1, f);
        text[r] = 0;
        fclose(f);
    }
    CHECK(strstr(text, "\"eos_token\": \"<|endoftext|>\"") && strstr(text, "\"add_eos_token\": true") &&
              strstr(text, "\"model_max_length\": 128") && strstr(text, "\"chat_template\": \"{{ messages }}\""),
          "the written config keeps eos, add_eos_token, the template, and says model_max_length");
    strata_bpe_free(t);
}

/* `test_bpe --decode TOKENIZER IDS OUT`: decodes the ids in file IDS (decimal, whitespace
 * between) with TOKENIZER into file OUT, for tests/tokenizers_reference.py to hold against
 * tokenizers' decode. */
static int decode_file(const char *tok_path, const char *ids_path, const char *out_path) {
    strata_bpe *t = strata_bpe_load(tok_path);
    FILE *f = t ? fopen(ids_path, "rb") : NULL;
    if (!f) {
        printf("decode: %s\n", t ? ids_path : strata_error());
        strata_bpe_free(t);
        return 1;
    }
    size_t n = 0, cap = 1024;
    int32_t *v = malloc(cap * sizeof *v);
    long x;
    while (fscanf(f, "%ld", &x) == 1) {
        if (n == cap) v = realloc(v, (cap *= 2) * sizeof *v);
        v[n++] = (int32_t)x;
    }
    fclose(f);
    size_t len = 0;
    char *text = strata_bpe_decode(t, v, n, &len);
    FILE *o = fopen(out_path, "wb");
    int ok = o && fwrite(text, 1, len, o) == len;
    if (o) ok &= fclose(o) == 0;
    free(text);
    free(v);
    strata_bpe_free(t);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--decode")) return decode_file(argv[2], argv[3], argv[4]);
    snprintf(dir, sizeof dir, "/tmp/strata-test-bpe-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_encode();
    test_bytes();
    test_added_tokens();
    test_refusals();
    test_split_layout();
    test_line_cuts();
    test_sentencepiece_layout();
    test_nfc();
    test_config();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) return 1;
    return check_report();
}
