/* tests/fuzz/make_seeds.c: writes the seed corpus of the fuzz targets, tests/fuzz/seeds/,
 * from Strata's own writers where it has one (checkpoints, token shards, the byte-level
 * tokenizer.json) and from real files (the YAML files of configs/); the rest (safetensors files,
 * config.json, an llm.c tokenizer) are small valid files written here, byte by byte.
 *
 *   fuzz_make_seeds SOURCE_DIR OUT_DIR     (OUT_DIR/<target>/ per target)
 *
 * Run it again when a format changes: the fuzz programs refuse to start when a seed
 * named valid-* is no longer accepted. Files already in OUT_DIR that it does not write
 * (reproducers of past findings) are left alone. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "io/bpe.h"
#include "io/checkpoint.h"
#include "io/data.h"

static const char *out_root;

static _Noreturn void die(const char *what) {
    fprintf(stderr, "fuzz_make_seeds: %s%s%s\n", what, strata_error()[0] ? ": " : "", strata_error());
    exit(1);
}

typedef struct buf {
    char *data;
    size_t len, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->data = realloc(b->data, b->cap);
        if (!b->data) die("out of memory");
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}
static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }
static void put_nul(buf *b) { put(b, "", 1); }

static void read_into(buf *b, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        strata_fail("%s: %s", path, strerror(errno));
        die("cannot read");
    }
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) put(b, chunk, n);
    fclose(f);
}

static void seed(const char *target, const char *name, const void *data, size_t len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", out_root, target);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", out_root, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        strata_fail("%s: %s", path, strerror(errno));
        die("cannot write");
    }
}

/* ---- config: real configs, one with its base, one with overrides ---- */

static void config_seeds(const char *src) {
    static const char *const plain[] = {"quickstart.yaml", "tinyshakespeare.yaml", "gpt2-124m.yaml"};
    char path[1024], name[256];
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++) {
        buf b = {0};
        snprintf(path, sizeof path, "%s/configs/%s", src, plain[i]);
        read_into(&b, path);
        snprintf(name, sizeof name, "valid-%s", plain[i]);
        seed("config", name, b.data, b.len);
        free(b.data);
    }
    /* gpt2-124m-zero3.yaml builds on gpt2-124m.yaml, which the target names base.yaml */
    buf z = {0}, b = {0};
    snprintf(path, sizeof path, "%s/configs/gpt2-124m-zero3.yaml", src);
    read_into(&z, path);
    put_nul(&z);
    char *at = memmem(z.data, z.len, "base: gpt2-124m.yaml", 20);
    if (!at) die("configs/gpt2-124m-zero3.yaml no longer says base: gpt2-124m.yaml");
    memcpy(at, "base: base.yaml     ", 20);
    snprintf(path, sizeof path, "%s/configs/gpt2-124m.yaml", src);
    read_into(&b, path);
    put(&z, b.data, b.len);
    seed("config", "valid-gpt2-124m-zero3-with-base.yaml", z.data, z.len);
    free(z.data);
    free(b.data);
    /* the built-in quickstart.yaml as a base, and --set lines (the third part) */
    static const char with_sets[] = "base: quickstart.yaml\nzero:\n  stage: 3\noffload:\n  optimizer: cpu\n  params: cpu\n"
                                    "\0\0model.n_layer=2\ntrain.steps=10\noptim.schedule=linear\ntrain.activation_checkpointing=every:2\n"
                                    "comm.timeout_s=30.5\nmemory.auto=true\n";
    seed("config", "valid-quickstart-base-and-sets.yaml", with_sets, sizeof with_sets - 1);
}

/* ---- checkpoint: Strata's own writer, world 1 and world 2 ---- */

/* fp32 values none of whose bytes is 0, so the rank files hold no NUL (fuzz_checkpoint.c) */
static float nonzero_bytes_value(int i) {
    for (float f = 1.1f + 0.37f * (float)i;; f = f * 1.0001f + 0.01f) {
        unsigned char b[4];
        memcpy(b, &f, 4);
        if (b[0] && b[1] && b[2] && b[3]) return f;
    }
}

static void checkpoint_seed(int world, const char *name) {
    /* unit 0: wte-like (3, 2) and a bias (5); unit 1: one (7) tensor; padded to 4 */
    static const strata_param_tensor tensors[] = {
        {.name = "transformer.wte.weight", .unit = 0, .offset = 0, .numel = 6, .ndim = 2, .shape = {3, 2}},
        {.name = "transformer.h.0.ln_1.bias", .unit = 0, .offset = 6, .numel = 5, .ndim = 1, .shape = {5}},
        {.name = "transformer.ln_f.weight", .unit = 1, .offset = 0, .numel = 7, .ndim = 1, .shape = {7}},
    };
    static const size_t numel[] = {11, 7}, padded[] = {12, 8};
    strata_param_layout L = {2, numel, padded, 3, tensors};
    float data[2][STRATA_CKPT_KINDS][12];
    for (int u = 0; u < 2; u++)
        for (int k = 0; k < STRATA_CKPT_KINDS; k++)
            for (int i = 0; i < 12; i++) data[u][k][i] = nonzero_bytes_value(u * 100 + k * 20 + i);

    char run[] = "/tmp/strata-seeds-XXXXXX", tmp[1024], final[1024];
    if (!mkdtemp(run)) die("cannot make a temporary folder");
    if (strata_ckpt_tmp_dir(tmp, sizeof tmp, run, 7)) die("checkpoint tmp dir");
    for (int r = 0; r < world; r++) {
        const float *shards[2][STRATA_CKPT_KINDS];
        for (int u = 0; u < 2; u++)
            for (int k = 0; k < STRATA_CKPT_KINDS; k++) shards[u][k] = data[u][k] + (size_t)r * (padded[u] / (size_t)world);
        if (strata_ckpt_write_rank(tmp, &L, r, world, (const float *const (*)[STRATA_CKPT_KINDS])shards))
            die("strata_ckpt_write_rank");
    }
    strata_ckpt_meta meta = {.step = 7, .world = world, .stage = world > 1 ? 2 : 0, .seed = 1234,
                             .rng_state = 0x0123456789abcdefull, .tokens_seen = 57344, .last_loss = 3.25,
                             .config_yaml = "model:\n  n_layer: 1\n  n_head: 1\n  n_embd: 2\n"};
    if (strata_ckpt_commit(run, tmp, &L, &meta, 0, 0, final, sizeof final)) die("strata_ckpt_commit");
    buf b = {0};
    char path[1100];
    snprintf(path, sizeof path, "%s/manifest.yaml", final);
    read_into(&b, path);
    for (int r = 0; r < world; r++) {
        put_nul(&b);
        snprintf(path, sizeof path, "%s/rank%05d.yaml", final, r);
        read_into(&b, path);
        put_nul(&b);
        size_t before = b.len;
        snprintf(path, sizeof path, "%s/rank%05d.bin", final, r);
        read_into(&b, path);
        if (memchr(b.data + before, 0, b.len - before)) die("a rank file holds a NUL byte");
    }
    seed("checkpoint", name, b.data, b.len);
    free(b.data);
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", run);
    if (system(cmd) != 0) die("cannot remove the temporary folder");
}

/* ---- safetensors: written here (the layout of io/safetensors.h) ---- */

static void safetensors_seed(const char *name, const char *const *specs, int n, const char *meta) {
    /* specs: "name", "dtype", "shape JSON", byte count, in triples + size */
    buf h = {0};
    puts_(&h, "{");
    if (meta) {
        puts_(&h, "\"__metadata__\":");
        puts_(&h, meta);
    }
    unsigned long long at = 0;
    for (int i = 0; i < n; i++) {
        const char *const *s = specs + 4 * i;
        unsigned long long bytes = strtoull(s[3], NULL, 10);
        char entry[512];
        snprintf(entry, sizeof entry, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}",
                 meta || i ? "," : "", s[0], s[1], s[2], at, at + bytes);
        puts_(&h, entry);
        at += bytes;
    }
    puts_(&h, "}");
    while (h.len % 8) puts_(&h, " "); /* as Hugging Face pads it */
    buf f = {0};
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((unsigned long long)h.len >> (8 * i));
    put(&f, len8, 8);
    put(&f, h.data, h.len);
    for (unsigned long long i = 0; i < at; i++) {
        unsigned char v = (unsigned char)(0x3c + i * 7);
        put(&f, &v, 1);
    }
    seed("safetensors", name, f.data, f.len);
    free(h.data);
    free(f.data);
}

static void safetensors_seeds(void) {
    static const char *const gpt2[] = {
        "wte.weight", "F32", "[4,2]", "32", "h.0.ln_1.bias", "F16", "[2]", "4", "h.0.attn.c_attn.weight", "BF16",
        "[2,3]", "12", "ln_f.weight", "F64", "[2]", "16",
    };
    safetensors_seed("valid-gpt2-like.safetensors", gpt2, 4, "{\"format\":\"pt\",\"strata.n_head\":\"1\"}");
    static const char *const odd[] = {
        "scalar", "F32", "[]", "4", "empty", "F32", "[0,3]", "0", "ids", "I64", "[2]", "16", "mask", "BOOL", "[3]", "3",
        "u\\u00e9", "U16", "[1,1,1]", "2",
    };
    safetensors_seed("valid-dtypes.safetensors", odd, 5, NULL);
}

/* ---- shards: Strata's own writer; an llm.c tokenizer file ---- */

/* One shard made by Strata's writer: uint16 tokens, or (tokens32) the 32-bit format,
 * with a loss mask when mask is not NULL. */
static void shard_seed_of(const char *name, const uint16_t *tokens, const uint32_t *tokens32, const uint8_t *mask,
                          size_t n) {
    char dir[] = "/tmp/strata-seeds-XXXXXX", path[1100];
    if (!mkdtemp(dir)) die("cannot make a temporary folder");
    snprintf(path, sizeof path, "%s/shard.bin", dir);
    if (tokens32 ? strata_shard_write32(path, tokens32, mask, n, 0, 0) : strata_shard_write(path, tokens, n))
        die("strata_shard_write");
    buf b = {0};
    read_into(&b, path);
    seed("shard", name, b.data, b.len);
    free(b.data);
    unlink(path);
    rmdir(dir);
}

static void shard_seed(const char *name, const uint16_t *tokens, size_t n) {
    shard_seed_of(name, tokens, NULL, NULL, n);
}

static void shard_seeds(void) {
    /* 32-bit shards: ids past 65536 without a mask, small ids with a loss mask (a masked
     * prompt, learned response), and a masked shard whose mask learns nothing */
    uint32_t big[60], small[60];
    uint8_t mask[60], none[60] = {0};
    for (int i = 0; i < 60; i++) {
        big[i] = (uint32_t)(65536 + i * 1001);
        small[i] = (uint32_t)(i * 13 % 200);
        mask[i] = (uint8_t)(i % 12 >= 5);
    }
    shard_seed_of("valid-32bit-ids.bin", NULL, big, NULL, 60);
    shard_seed_of("valid-32bit-masked.bin", NULL, small, mask, 60);
    shard_seed_of("valid-32bit-all-masked.bin", NULL, small, none, 24);
    uint16_t tokens[200];
    for (int i = 0; i < 200; i++) tokens[i] = (uint16_t)(i * 37 % 256);
    shard_seed("valid-bytes.bin", tokens, 200);
    uint16_t wide[40];
    for (int i = 0; i < 40; i++) wide[i] = (uint16_t)(50000 + i * 7);
    shard_seed("valid-gpt2-ids.bin", wide, 40);
    shard_seed("valid-two-tokens.bin", tokens, 2);
    /* llm.c's tokenizer: 256 uint32 (magic 20240328, version 2, vocab 4, eot 3), then
     * each token as a length byte and its bytes */
    buf b = {0};
    uint32_t h[256] = {20240328, 2, 4, 3};
    put(&b, h, sizeof h);
    static const char *const pieces[] = {"a", "b", " the", "<|endoftext|>"};
    for (int i = 0; i < 4; i++) {
        unsigned char len = (unsigned char)strlen(pieces[i]);
        put(&b, &len, 1);
        put(&b, pieces[i], len);
    }
    seed("shard", "valid-llmc-tokenizer.bin", b.data, b.len);
    free(b.data);
}

/* ---- JSON: Hugging Face files and plain documents ---- */

static void json_seeds(void) {
    static const char config[] =
        "{\n  \"activation_function\": \"gelu_new\",\n  \"architectures\": [\"GPT2LMHeadModel\"],\n"
        "  \"attn_pdrop\": 0.1,\n  \"bos_token_id\": 50256,\n  \"embd_pdrop\": 0.1,\n  \"eos_token_id\": 50256,\n"
        "  \"initializer_range\": 0.02,\n  \"layer_norm_epsilon\": 1e-05,\n  \"model_type\": \"gpt2\",\n"
        "  \"n_ctx\": 1024,\n  \"n_embd\": 768,\n  \"n_head\": 12,\n  \"n_inner\": null,\n  \"n_layer\": 12,\n"
        "  \"n_positions\": 1024,\n  \"resid_pdrop\": 0.1,\n  \"scale_attn_weights\": true,\n"
        "  \"summary_activation\": null,\n  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\",\n"
        "  \"transformers_version\": \"4.40.0\",\n  \"use_cache\": true,\n  \"vocab_size\": 50257\n}\n";
    seed("json", "valid-config.json", config, sizeof config - 1);
    static const char tokenizer[] =
        "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
        "\"added_tokens\":[{\"id\":9,\"content\":\"<|endoftext|>\",\"single_word\":false,\"lstrip\":false,"
        "\"rstrip\":false,\"normalized\":false,\"special\":true}],\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
        "\"post_processor\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"vocab\":{\"a\":0,\"b\":1,\"c\":2,"
        "\"\xc4\xa0\":3,\"\xc4\x8a\":4,\"ab\":5,\"bc\":6,\"\xc4\xa0" "a\":7,\"aa\":8,\"<|endoftext|>\":9,\"d\":10},"
        "\"merges\":[\"a b\",[\"b\",\"c\"],\"\xc4\xa0 a\",\"a a\"]}}";
    seed("json", "valid-tokenizer.json", tokenizer, sizeof tokenizer - 1);
    /* Llama 3's layout: NFC (as Qwen's), a Split pattern, then ByteLevel without its regex,
     * ignore_merges, a template putting a BOS first */
    static const char split[] =
        "{\"added_tokens\":[{\"id\":128000,\"content\":\"<|begin_of_text|>\",\"special\":true,\"normalized\":false}],"
        "\"normalizer\":{\"type\":\"NFC\"},\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
        "\"pattern\":{\"Regex\":\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}|\\\\s+(?!\\\\S)|\\\\s+\"},"
        "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|begin_of_text|>\"}},"
        "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<|begin_of_text|>\":{\"ids\":[128000]}}},"
        "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"a\":0,\"b\":1,"
        "\"\xc4\xa0\":2,\"ab\":3,\"\xc4\xa0" "a\":4},\"merges\":[\"a b\",\"\xc4\xa0 a\"]}}";
    seed("json", "valid-tokenizer-split.json", split, sizeof split - 1);
    /* Llama 2's layout: a vocabulary of text, Prepend + Replace, byte fallback, <unk>, the
     * Replace/ByteFallback/Fuse/Strip decoder; and Mistral's Metaspace */
    static const char spm[] =
        "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalized\":false},{\"id\":1,"
        "\"content\":\"<s>\",\"special\":true,\"normalized\":false}],\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":["
        "{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
        "\"content\":\"\xe2\x96\x81\"}]},\"pre_tokenizer\":null,\"post_processor\":{\"type\":\"TemplateProcessing\","
        "\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":"
        "{\"ids\":[1]}}},\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":"
        "\"\xe2\x96\x81\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\","
        "\"content\":\" \",\"start\":1,\"stop\":0}]},\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
        "\"byte_fallback\":true,\"vocab\":{\"<unk>\":0,\"<s>\":1,\"<0x48>\":2,\"<0xC3>\":3,\"<0xA9>\":4,\"\xe2\x96\x81\":5,"
        "\"H\":6,\"i\":7,\"\xe2\x96\x81H\":8},\"merges\":[\"\xe2\x96\x81 H\"]}}";
    seed("json", "valid-tokenizer-sentencepiece.json", spm, sizeof spm - 1);
    static const char meta[] =
        "{\"added_tokens\":[],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":"
        "\"\xe2\x96\x81\",\"prepend_scheme\":\"first\",\"split\":true},\"post_processor\":null,\"decoder\":{\"type\":"
        "\"Metaspace\",\"replacement\":\"\xe2\x96\x81\",\"prepend_scheme\":\"first\"},\"model\":{\"type\":\"BPE\","
        "\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"\xe2\x96\x81\":1,\"H\":2,\"\xe2\x96\x81H\":3},\"merges\":"
        "[\"\xe2\x96\x81 H\"]}}";
    seed("json", "valid-tokenizer-metaspace.json", meta, sizeof meta - 1);
    /* the byte-level tokenizer.json Strata writes beside prepared data */
    char dir[] = "/tmp/strata-seeds-XXXXXX", path[1100];
    if (!mkdtemp(dir)) die("cannot make a temporary folder");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    strata_bpe *bytes = strata_bpe_bytes();
    if (!bytes || strata_bpe_save(bytes, path)) die("strata_bpe_save");
    strata_bpe_free(bytes);
    buf b = {0};
    read_into(&b, path);
    seed("json", "valid-byte-level-tokenizer.json", b.data, b.len);
    free(b.data);
    unlink(path);
    rmdir(dir);
    static const char deepspeed[] =
        "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2,\n"
        " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4, \"betas\": [0.9, 0.95], \"eps\": 1e-8,"
        " \"weight_decay\": 0.1}},\n \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\","
        " \"pin_memory\": true}, \"reduce_bucket_size\": 5e8},\n \"bf16\": {\"enabled\": true}, \"gradient_clipping\": 1.0}\n";
    seed("json", "valid-deepspeed.json", deepspeed, sizeof deepspeed - 1);
    static const char odd[] = "[-0, 0.5e-3, 1E+2, 9223372036854775807, -9223372036854775808, 18446744073709551616,"
                              " \"\\u00e9\\ud83d\\ude00\\n\\t\\\"\\\\\\/\", \"caf\xc3\xa9 \xf0\x9f\x98\x80\", true, false,"
                              " null, {}, [], {\"a\": {\"b\": [[[]]]}}]";
    seed("json", "valid-values.json", odd, sizeof odd - 1);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fuzz_make_seeds SOURCE_DIR OUT_DIR\n");
        return 2;
    }
    out_root = argv[2];
    mkdir(out_root, 0755);
    config_seeds(argv[1]);
    checkpoint_seed(1, "valid-world1");
    checkpoint_seed(2, "valid-world2");
    safetensors_seeds();
    shard_seeds();
    json_seeds();
    printf("seeds written to %s\n", out_root);
    return 0;
}
