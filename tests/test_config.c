/* tests/test_config.c: the YAML config reader. A catalogue of bad configs, each with the
 * exact message a user sees, then the good paths: defaults, overrides, the write/parse
 * round trip, the built-in config against configs/quickstart.yaml, and every shipped
 * config loading cleanly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "core/model.h"
#include "io/config.h"
#include "tests/check.h"



/* A valid model and data section: lines 1-8 of every catalogue entry that uses it. */
#define HEAD                                                                             \
    "model:\n  n_layer: 2\n  n_head: 2\n  n_embd: 8\n  seq_len: 16\n  vocab_size: 256\n" \
    "data:\n  train: \"t_*.bin\"\n"
#define TRAIN "train:\n  steps: 10\n" /* lines 9-10 after HEAD */
/* A Llama-family model section, open for more keys */
#define LLAMA "model:\n  arch: llama\n  n_layer: 2\n  n_head: 4\n  n_embd: 16\n  seq_len: 16\n  vocab_size: 256\n"
#define DATA_TRAIN "data: {train: x}\ntrain: {steps: 1}\n"
/* HEAD's model section alone, open for more keys */
#define GPT2 "model:\n  n_layer: 2\n  n_head: 2\n  n_embd: 8\n  seq_len: 16\n  vocab_size: 256\n"

typedef struct bad_case {
    const char *what;
    const char *yaml;
    const char *set; /* one --set, or NULL */
    const char *expect;
} bad_case;

static const bad_case bad_cases[] = {
    {"unknown key, did you mean", HEAD TRAIN "  micro_bach: 4\n", NULL,
     "bad.yaml:11: unknown key 'train.micro_bach' (did you mean 'train.micro_batch'?)"},
    {"key in the wrong section", HEAD TRAIN "  lr: 0.1\n", NULL,
     "bad.yaml:11: unknown key 'train.lr' (did you mean 'optim.lr'?)"},
    {"unknown key, nothing close", HEAD TRAIN "  banana: 1\n", NULL, "bad.yaml:11: unknown key 'train.banana'"},
    {"unknown section, did you mean", HEAD "trian:\n  steps: 10\n", NULL,
     "bad.yaml:9: unknown section 'trian' (did you mean 'train'?)"},
    {"section key at top level", HEAD "steps: 10\n", NULL,
     "bad.yaml:9: unknown section 'steps' (did you mean 'train.steps'?)"},
    {"integer: letters", HEAD TRAIN "  micro_batch: abc\n", NULL,
     "bad.yaml:11: key 'train.micro_batch': expected an integer, got 'abc'"},
    {"integer: fraction", HEAD TRAIN "  micro_batch: 2.5\n", NULL,
     "bad.yaml:11: key 'train.micro_batch': expected an integer, got '2.5'"},
    {"integer: empty value", HEAD TRAIN "  micro_batch:\n", NULL,
     "bad.yaml:11: key 'train.micro_batch': expected an integer, got ''"},
    {"integer: below range", HEAD TRAIN "  micro_batch: 0\n", NULL,
     "bad.yaml:11: key 'train.micro_batch': must be between 1 and 65536, got 0"},
    {"int64: overflow", HEAD "train:\n  steps: 99999999999999999999\n", NULL,
     "bad.yaml:10: key 'train.steps': must be between 0 and 1000000000000, got 99999999999999999999"},
    {"uint64: negative seed", HEAD TRAIN "  seed: -1\n", NULL,
     "bad.yaml:11: key 'train.seed': must be between 0 and 18446744073709551615, got -1"},
    {"vocab above the bound", "model:\n  n_layer: 2\n  n_head: 2\n  n_embd: 8\n  seq_len: 16\n  vocab_size: 2000000\n",
     NULL, "bad.yaml:6: key 'model.vocab_size': must be between 1 and 1048576, got 2000000"},
    {"double: not a number", HEAD TRAIN "optim:\n  lr: fast\n", NULL,
     "bad.yaml:12: key 'optim.lr': expected a number, got 'fast'"},
    {"double: nan", HEAD TRAIN "optim:\n  eps: nan\n", NULL, "bad.yaml:12: key 'optim.eps': expected a number, got 'nan'"},
    {"double: exclusive upper bound", HEAD TRAIN "optim:\n  beta2: 1\n", NULL,
     "bad.yaml:12: key 'optim.beta2': must be at least 0 and less than 1, got 1"},
    /* issue 31 item 5: the optimizer's numbers are checked as the floats its kernels use */
    {"beta2 that is 1 as a float", HEAD TRAIN "optim:\n  beta2: 0.99999999\n", NULL,
     "bad.yaml:12: key 'optim.beta2': 0.99999999 becomes 1 as the float (32-bit) the kernels compute with, which "
     "must be at least 0 and less than 1"},
    {"--set: beta1 that is 1 as a float", HEAD TRAIN, "optim.beta1=0.999999999",
     "--set: key 'optim.beta1': 0.999999999 becomes 1 as the float (32-bit) the kernels compute with, which must be "
     "at least 0 and less than 1"},
    {"eps that is 0 as a float", HEAD TRAIN "optim:\n  eps: 1e-50\n", NULL,
     "bad.yaml:12: key 'optim.eps': 1e-50 becomes 0 as the float (32-bit) the kernels compute with, which must be "
     "greater than 0 and at most 1"},
    {"eps 0", HEAD TRAIN "optim:\n  eps: 0\n", NULL,
     "bad.yaml:12: key 'optim.eps': must be greater than 0 and at most 1, got 0"},
    {"lr that is 0 as a float", HEAD TRAIN, "optim.lr=1e-46",
     "--set: key 'optim.lr': 1e-46 becomes 0 as the float (32-bit) the kernels compute with, which must be between 0 "
     "and 10 and not 0"},
    {"min_lr that is 0 as a float", HEAD TRAIN "optim:\n  min_lr: 1e-60\n", NULL,
     "bad.yaml:12: key 'optim.min_lr': 1e-60 becomes 0 as the float (32-bit) the kernels compute with, which must "
     "be between 0 and 10 and not 0"},
    {"weight decay that is 0 as a float", HEAD TRAIN, "optim.weight_decay=2e-300",
     "--set: key 'optim.weight_decay': 2e-300 becomes 0 as the float (32-bit) the kernels compute with, which must "
     "be between 0 and 10 and not 0"},
    {"grad clip that is 0 as a float", HEAD TRAIN, "optim.grad_clip=1e-50",
     "--set: key 'optim.grad_clip': 1e-50 becomes 0 as the float (32-bit) the kernels compute with, which must be "
     "between 0 and 1000000 and not 0"},
    {"double: exclusive lower bound", HEAD TRAIN "comm:\n  timeout_s: 0\n", NULL,
     "bad.yaml:12: key 'comm.timeout_s': must be greater than 0 and at most 604800, got 0"},
    {"bool: yes is not a boolean", HEAD TRAIN "zero:\n  overlap_comm: yes\n", NULL,
     "bad.yaml:12: key 'zero.overlap_comm': expected true or false, got 'yes'"},
    {"enum: bad value", HEAD TRAIN "optim:\n  schedule: cosin\n", NULL,
     "bad.yaml:12: key 'optim.schedule': expected one of cosine, linear, constant; got 'cosin'"},
    {"enum: top-level device", "device: gpu\n" HEAD TRAIN, NULL,
     "bad.yaml:1: key 'device': expected one of auto, cpu, cuda; got 'gpu'"},
    {"activation checkpointing every:0", HEAD TRAIN "  activation_checkpointing: every:0\n", NULL,
     "bad.yaml:11: key 'train.activation_checkpointing': expected none, blocks or every:K with K between 1 and "
     "1024, got 'every:0'"},
    {"empty required string", "model:\n  n_layer: 2\n  n_head: 2\n  n_embd: 8\n  seq_len: 16\n  vocab_size: 256\n"
                              "data:\n  train: \"\"\n" TRAIN,
     NULL, "bad.yaml:8: key 'data.train': must not be empty"},
    {"missing required key", "model:\n  n_layer: 2\n  n_head: 2\n  n_embd: 8\n  seq_len: 16\n  vocab_size: 256\n" TRAIN,
     NULL, "bad.yaml: missing required key 'data.train'"},
    {"neither steps nor epochs", HEAD "train:\n  micro_batch: 4\n", NULL,
     "bad.yaml: missing required key 'train.steps' (optimizer steps), or train.epochs (passes over data.train)"},
    {"negative epochs", HEAD "train:\n  epochs: -1\n", NULL,
     "bad.yaml:10: key 'train.epochs': must be between 0 and 1000000, got -1"},
    {"duplicate key", HEAD TRAIN "  steps: 20\n", NULL, "bad.yaml:11: duplicate key 'train.steps' (first at line 10)"},
    {"duplicate section", HEAD TRAIN "train:\n  micro_batch: 4\n", NULL,
     "bad.yaml:11: duplicate section 'train' (first at line 9)"},
    {"malformed YAML: bad indentation", HEAD TRAIN "   micro_batch: 4\n", NULL,
     "bad.yaml:11:15: invalid YAML: mapping values are not allowed in this context"},
    {"malformed YAML: tab", HEAD "train:\n\tsteps: 10\n", NULL,
     "bad.yaml:10:1: invalid YAML: found character that cannot start any token (while scanning for the next token)"},
    {"malformed YAML: open flow sequence", HEAD "train: [1, 2\n", NULL,
     "bad.yaml:10:1: invalid YAML: did not find expected ',' or ']' (while parsing a flow sequence)"},
    {"section is a scalar", HEAD "train: 5\n", NULL, "bad.yaml:9: section 'train' must be a mapping of keys, got a scalar"},
    {"section is a sequence", HEAD "train:\n  - steps\n", NULL,
     "bad.yaml:9: section 'train' must be a mapping of keys, got a sequence"},
    {"mapping where a scalar is expected", HEAD "train:\n  steps:\n    value: 10\n", NULL,
     "bad.yaml:10: key 'train.steps': expected a scalar value, got a mapping"},
    {"top level is a scalar", "just some text\n", NULL,
     "bad.yaml:1: expected a mapping of sections at the top level, got a scalar"},
    {"top level is a sequence", "- model\n- data\n", NULL,
     "bad.yaml:1: expected a mapping of sections at the top level, got a sequence"},
    {"empty file", "", NULL, "bad.yaml: empty config; expected a mapping of sections (model, data, train, ...)"},
    {"only comments", "# nothing here\n\n", NULL,
     "bad.yaml: empty config; expected a mapping of sections (model, data, train, ...)"},
    {"two documents", HEAD TRAIN "---\ntrain:\n  steps: 5\n", NULL,
     "bad.yaml:11: a second YAML document starts here; a config is one document"},
    {"sequence as a key", HEAD "? [a, b]\n: 1\n", NULL, "bad.yaml:9: keys must be scalars, got a sequence"},
    {"n_embd not divisible by n_head",
     "model:\n  n_layer: 2\n  n_head: 3\n  n_embd: 8\n  seq_len: 16\n  vocab_size: 256\ndata:\n  train: t\n" TRAIN,
     NULL, "bad.yaml: model.n_embd (8) must be divisible by model.n_head (3)"},
    {"train.seq_len above model.seq_len", HEAD TRAIN "  seq_len: 32\n", NULL,
     "bad.yaml: train.seq_len (32) must not exceed model.seq_len (16)"},
    {"padded vocab below vocab",
     "model:\n  n_layer: 2\n  n_head: 2\n  n_embd: 8\n  seq_len: 16\n  vocab_size: 256\n  padded_vocab_size: 200\n"
     "data:\n  train: t\n" TRAIN,
     NULL, "bad.yaml: model.padded_vocab_size (200) must be 0 or at least model.vocab_size (256)"},
    {"min_lr above lr", HEAD TRAIN "optim:\n  lr: 1e-4\n  min_lr: 1e-3\n", NULL,
     "bad.yaml: optim.min_lr (0.001) must not exceed optim.lr (0.0001)"},
    {"nvme offload without a path", HEAD TRAIN "offload:\n  optimizer: nvme\n", NULL,
     "bad.yaml: offload.optimizer is nvme, which needs offload.nvme_path"},
    {"params on nvme without the optimizer offloaded", HEAD TRAIN "zero: {stage: 3}\noffload:\n  params: nvme\n  nvme_path: /tmp\n", NULL,
     "bad.yaml: offload.params is nvme, which needs offload.optimizer cpu or nvme (the CPU update writes the parameters to disk)"},
    {"params offloaded below stage 3", HEAD TRAIN "offload:\n  params: cpu\n", NULL,
     "bad.yaml: offload.params is cpu, which needs zero.stage 3 (stages 0-2 keep full parameters on every rank)"},
    {"optimizer ratio without offload", HEAD TRAIN "offload:\n  optimizer_ratio: 0.5\n", NULL,
     "bad.yaml: offload.optimizer_ratio (0.5) is the share of the optimizer state offloaded, but offload.optimizer is "
     "none (set it to cpu or nvme, or the ratio to 1)"},
    {"optimizer ratio with parameters offloaded", HEAD TRAIN "zero: {stage: 3}\noffload: {optimizer: cpu, params: cpu, optimizer_ratio: 0.25}\n",
     NULL, "bad.yaml: offload.optimizer_ratio (0.25) below 1 needs offload.params none (a unit whose optimizer state "
     "stays on the device updates its parameters there)"},
    {"nvme ratio without the optimizer on nvme", HEAD TRAIN "offload: {optimizer: cpu, nvme_ratio: 0.5}\n", NULL,
     "bad.yaml: offload.nvme_ratio (0.5) is the share of the offloaded optimizer state on NVMe, but offload.optimizer "
     "is cpu (set it to nvme, or the ratio to 1)"},
    {"optimizer ratio of 0", HEAD TRAIN "offload: {optimizer: cpu, optimizer_ratio: 0}\n", NULL,
     "bad.yaml:11: key 'offload.optimizer_ratio': must be greater than 0 and at most 1, or auto, got 0"},
    {"negative hang timeout", HEAD TRAIN "run:\n  hang_timeout_s: -1\n", NULL,
     "bad.yaml:12: key 'run.hang_timeout_s': must be between 0 and 10000000, got -1"},
    {"gradients offloaded without the optimizer", HEAD TRAIN "offload:\n  gradients: cpu\n", NULL,
     "bad.yaml: offload.gradients is cpu, which needs offload.optimizer cpu or nvme (the CPU update reads the gradients "
     "there; an update on the device reads them on the device)"},
    {"gradients on nvme", HEAD TRAIN "offload: {optimizer: cpu, gradients: nvme}\n", NULL,
     "bad.yaml:11: key 'offload.gradients': expected one of none, cpu; got 'nvme'"},
    {"nvme block not 4 KiB aligned", HEAD TRAIN "offload:\n  block_kb: 1026\n", NULL,
     "bad.yaml: offload.block_kb (1026) must be a multiple of 4 (O_DIRECT needs 4 KiB alignment)"},

    /* a quoted \0 would cut the value short unseen (found by tests/fuzz/fuzz_config) */
    {"NUL byte in a quoted value", HEAD "  val: \"v\\0al\"\n" TRAIN, NULL,
     "bad.yaml:9: 'v...' holds a NUL byte, which no key or value may"},
    /* the model families' keys */
    {"llama without an MLP width", LLAMA "data: {train: x}\ntrain: {steps: 1}\n", NULL,
     "bad.yaml: model.intermediate_size is required for model.arch llama (the SwiGLU MLP's width)"},
    {"query heads not a multiple of key/value heads", LLAMA "  intermediate_size: 32\n  n_kv_head: 3\n" DATA_TRAIN, NULL,
     "bad.yaml: model.n_head (4) must be a multiple of model.n_kv_head (3): each key/value head serves a group of "
     "query heads"},
    {"odd head size", LLAMA "  intermediate_size: 32\n  head_dim: 5\n" DATA_TRAIN, NULL,
     "bad.yaml: model.head_dim (5) must be even: RoPE turns the two halves of a head together"},
    {"llama channels not divisible by heads", "model: {arch: llama, n_layer: 2, n_head: 4, n_embd: 18, seq_len: 16, "
     "vocab_size: 256, intermediate_size: 32}\n" DATA_TRAIN, NULL,
     "bad.yaml: model.n_embd (18) must be divisible by model.n_head (4), or model.head_dim set"},
    {"context past the checkpoint's", LLAMA "  intermediate_size: 32\n  max_position_embeddings: 8\n" DATA_TRAIN, NULL,
     "bad.yaml: model.seq_len (16) must not exceed model.max_position_embeddings (8), the context the weights were "
     "made for"},
    {"llama3 RoPE with low >= high", LLAMA "  intermediate_size: 32\n  rope_scaling: llama3\n  rope_high_freq_factor: 1\n"
     DATA_TRAIN, NULL, "bad.yaml: model.rope_high_freq_factor (1) must be greater than model.rope_low_freq_factor (1)"},
    {"qwen2 without its biases", LLAMA "  intermediate_size: 32\n  hf_model_type: qwen2\n" DATA_TRAIN, NULL,
     "bad.yaml: model.hf_model_type qwen2 has q/k/v biases and no q/k norms: model.qkv_bias must be true and "
     "model.qk_norm false"},
    {"llama named with q/k norms", LLAMA "  intermediate_size: 32\n  hf_model_type: llama\n  qk_norm: true\n" DATA_TRAIN,
     NULL, "bad.yaml: model.hf_model_type llama has neither q/k/v biases nor q/k norms, but model.qk_norm is true "
     "(qwen2 has the biases, qwen3 the norms)"},
    {"unknown family", "model:\n  arch: bert\n", NULL, "bad.yaml:2: key 'model.arch': expected one of gpt2, llama; got 'bert'"},
    {"gpt2 with grouped-query attention", GPT2 "  n_kv_head: 1\n" DATA_TRAIN, NULL,
     "bad.yaml: model.n_kv_head (1) must be 0 or model.n_head (2): GPT-2 has one key/value head per query head "
     "(grouped-query attention is model.arch llama's)"},
    {"gpt2 with q/k/v biases", GPT2 "  qkv_bias: true\n" DATA_TRAIN, NULL,
     "bad.yaml: model.qkv_bias is true, but it applies to model.arch llama only (this model is gpt2)"},
    {"gpt2 with RoPE's base", GPT2 "  rope_theta: 500000\n" DATA_TRAIN, NULL,
     "bad.yaml: model.rope_theta is 500000.0, but it applies to model.arch llama only (this model is gpt2)"},
    {"gpt2 untied", GPT2 "  tie_embeddings: false\n" DATA_TRAIN, NULL,
     "bad.yaml: model.tie_embeddings is false, but GPT-2's LM head is tied to the token embedding"},

    /* --set overrides: the file is fine, the override is not. */
    {"--set: not an integer", HEAD TRAIN, "train.steps=x", "--set: key 'train.steps': expected an integer, got 'x'"},
    {"--set: missing '='", HEAD TRAIN, "train.steps", "--set: expected section.key=value, got 'train.steps'"},
    {"--set: unknown key", HEAD TRAIN, "train.stepz=5", "--set: unknown key 'train.stepz' (did you mean 'train.steps'?)"},
    {"--set: unknown section", HEAD TRAIN, "optimm.lr=1", "--set: unknown section 'optimm' (did you mean 'optim'?)"},
    {"--set: whole section", HEAD TRAIN, "train=5", "--set: section 'train' must be a mapping of keys, got a scalar"},
    {"--set: out of range", HEAD TRAIN, "zero.stage=4", "--set: key 'zero.stage': must be between 0 and 3, got 4"},
    {"--set: breaks a cross-key rule", HEAD TRAIN, "optim.min_lr=1",
     "bad.yaml: optim.min_lr (1) must not exceed optim.lr (0.0003)"},
};

static void test_bad_catalogue(void) {
    int n = (int)(sizeof bad_cases / sizeof bad_cases[0]);
    for (int i = 0; i < n; i++) {
        const bad_case *b = &bad_cases[i];
        strata_config c;
        strata_clear_error();
        const char *sets[1] = {b->set};
        int rc = strata_config_load_string(&c, "bad.yaml", b->yaml, sets, b->set ? 1 : 0);
        int ok = rc == -1 && !strcmp(strata_error(), b->expect);
        CHECK(ok, "%s:\n  want: %s\n  got (rc %d): %s", b->what, b->expect, rc, strata_error());
        if (ok) printf("ok   bad config rejected: %s\n", b->what);
    }
    CHECK(n >= 24, "catalogue has %d bad configs", n);
}

static char *source_path(const char *rel) {
    const char *dir = getenv("STRATA_SOURCE_DIR");
    if (!dir || !*dir) dir = ".";
    size_t n = strlen(dir) + strlen(rel) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, rel);
    return p;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    *len = got;
    return buf;
}

static void test_bad_file_on_disk(void) {
    char path[256], expect[512];
    snprintf(path, sizeof path, "/tmp/strata_test_config_%d.yaml", (int)getpid());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot create %s", path);
    if (!f) return;
    fputs(HEAD TRAIN "optim:\n  lr: 3e-4\n  warmup_steps: 1.5\n", f);
    fclose(f);
    strata_config c;
    int rc = strata_config_load(&c, path, NULL, 0);
    snprintf(expect, sizeof expect, "%s:13: key 'optim.warmup_steps': expected an integer, got '1.5'", path);
    CHECK(rc == -1 && !strcmp(strata_error(), expect), "file on disk: want '%s', got '%s'", expect, strata_error());
    unlink(path);

    rc = strata_config_load(&c, path, NULL, 0);
    snprintf(expect, sizeof expect, "%s: cannot read: No such file or directory", path);
    CHECK(rc == -1 && !strcmp(strata_error(), expect), "missing file: want '%s', got '%s'", expect, strata_error());
    printf("ok   bad file on disk and missing file name the path\n");
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* `base: FILE`: the variant overrides its base, required keys may come from the base, and
 * errors name the file (base or variant) and line where they are. */
static void test_base(void) {
    char dir[64], base[128], var[128], sub[128], loop[128], expect[512];
    snprintf(dir, sizeof dir, "/tmp/strata_test_base_%d", (int)getpid());
    mkdir(dir, 0700);
    snprintf(base, sizeof base, "%s/base.yaml", dir);
    snprintf(var, sizeof var, "%s/variant.yaml", dir);
    snprintf(sub, sizeof sub, "%s/sub", dir);
    mkdir(sub, 0700);
    write_text(base, HEAD TRAIN "zero:\n  stage: 1\noptim:\n  lr: 1e-3\n");
    /* base written after the keys it is overridden by, in a subfolder-relative path */
    snprintf(loop, sizeof loop, "%s/sub/v2.yaml", dir);
    write_text(var, "zero:\n  stage: 3\nbase: base.yaml\n");
    write_text(loop, "base: ../variant.yaml\noptim:\n  lr: 5e-4\n");
    strata_config c;
    int rc = strata_config_load(&c, var, NULL, 0);
    CHECK(rc == 0 && c.zero.stage == 3 && c.optim.lr == 1e-3 && c.model.n_layer == 2 && c.train.steps == 10 &&
              !strcmp(c.path, var),
          "base: variant overrides zero.stage, keeps the rest (%s)", rc ? strata_error() : "ok");
    const char *sets[1] = {"zero.stage=2"};
    rc = strata_config_load(&c, loop, sets, 1);
    CHECK(rc == 0 && c.zero.stage == 2 && c.optim.lr == 5e-4 && c.model.n_embd == 8,
          "base: two levels, relative to each file's folder, then --set (%s)", rc ? strata_error() : "ok");

    write_text(base, HEAD TRAIN "optim:\n  lr: fast\n");
    rc = strata_config_load(&c, var, NULL, 0);
    snprintf(expect, sizeof expect, "%s:12: key 'optim.lr': expected a number, got 'fast'", base);
    CHECK(rc == -1 && !strcmp(strata_error(), expect), "error in a base: want '%s', got '%s'", expect, strata_error());

    write_text(var, "base: missing.yaml\n");
    rc = strata_config_load(&c, var, NULL, 0);
    snprintf(expect, sizeof expect, "%s:1: key 'base': %s/missing.yaml: cannot read: No such file or directory", var, dir);
    CHECK(rc == -1 && !strcmp(strata_error(), expect), "missing base: want '%s', got '%s'", expect, strata_error());

    write_text(var, "base: variant.yaml\n");
    rc = strata_config_load(&c, var, NULL, 0);
    CHECK(rc == -1 && strstr(strata_error(), "more than 8 files deep (does a file build on itself?)"),
          "a file that builds on itself is refused: %s", strata_error());

    write_text(var, "base: base.yaml\nbase: base.yaml\n");
    rc = strata_config_load(&c, var, NULL, 0);
    snprintf(expect, sizeof expect, "%s:2: duplicate key 'base' (first at line 1)", var);
    CHECK(rc == -1 && !strcmp(strata_error(), expect), "duplicate base: want '%s', got '%s'", expect, strata_error());

    write_text(base, "model:\n  n_layer: 2\n");
    write_text(var, "base: base.yaml\n");
    rc = strata_config_load(&c, var, NULL, 0);
    snprintf(expect, sizeof expect, "%s: missing required key 'model.n_head'", var);
    CHECK(rc == -1 && !strcmp(strata_error(), expect), "required key in neither: want '%s', got '%s'", expect,
          strata_error());
    unlink(loop);
    rmdir(sub);
    unlink(var);
    unlink(base);
    rmdir(dir);
    printf("ok   base: inheritance, overrides and its errors\n");
}

static void test_defaults(void) {
    strata_config c;
    strata_config_defaults(&c);
    CHECK(c.device == STRATA_BACKEND_AUTO, "device");
    CHECK(c.model.n_layer == 0 && c.model.vocab_size == 0, "required keys stay unset");
    CHECK(c.model.padded_vocab_size == 0 && c.model.init_std == 0.02, "model defaults");
    CHECK(!strcmp(c.data.val, "") && c.data.shuffle == 1 && c.data.document_mask == 1 && !strcmp(c.data.train, ""),
          "data defaults");
    CHECK(c.train.steps == 0 && c.train.epochs == 0.0, "train.steps and train.epochs: neither (one is required)");
    CHECK(c.train.micro_batch == 8 && c.train.seq_len == 0 && c.train.grad_accum == 1 && c.train.seed == 1337,
          "train defaults 1");
    CHECK(c.train.eval_every == 100 && c.train.eval_batches == 8 && c.train.log_every == 1 &&
              c.train.sample_every == 0 && c.train.sample_tokens == 200,
          "train defaults 2");
    CHECK(c.train.activation_checkpointing == 0 && c.train.dtype == STRATA_DTYPE_AUTO &&
              c.train.grad_reduce_dtype == STRATA_DTYPE_AUTO && c.train.threads == 0,
          "train defaults 3");
    CHECK(c.optim.lr == 3e-4 && c.optim.min_lr == 3e-5 && c.optim.warmup_steps == 0 &&
              c.optim.schedule == STRATA_SCHEDULE_COSINE,
          "optim defaults 1");
    CHECK(c.optim.beta1 == 0.9 && c.optim.beta2 == 0.95 && c.optim.eps == 1e-8 && c.optim.weight_decay == 0.1 &&
              c.optim.grad_clip == 1.0,
          "optim defaults 2");
    CHECK(!strcmp(c.run.dir, "runs/default") && c.run.checkpoint_every == 0 && c.run.keep == 3, "run defaults");
    CHECK(c.zero.stage == 0 && c.zero.reduce_bucket_mb == 25 && c.zero.overlap_comm == 1 && c.zero.prefetch_units == 1,
          "zero defaults");
    CHECK(c.comm.backend == STRATA_COMM_AUTO && c.comm.timeout_s == 300, "comm defaults");
    CHECK(c.offload.optimizer == STRATA_OFFLOAD_NONE && c.offload.params == STRATA_OFFLOAD_NONE &&
              !strcmp(c.offload.nvme_path, "") && c.offload.pinned_budget_gb == 0 && c.offload.buffer_count == 4 && c.offload.chunk_kb == 65536 &&
              c.offload.block_kb == 1024 && c.offload.queue_depth == 32,
          "offload defaults");
    CHECK(c.memory.auto_fit == 0 && c.memory.gpu_gb == 0 && c.memory.host_gb == 0 && c.memory.nvme_gb == 0,
          "memory defaults");
    printf("ok   defaults\n");
}

static void test_minimal_and_derived(void) {
    strata_config c;
    int rc = strata_config_load_string(&c, "min.yaml", HEAD TRAIN, NULL, 0);
    CHECK(rc == 0, "minimal config: %s", strata_error());
    CHECK(c.model.n_layer == 2 && c.model.n_embd == 8 && !strcmp(c.data.train, "t_*.bin") && c.train.steps == 10,
          "required keys read");
    CHECK(c.train.micro_batch == 8 && c.optim.lr == 3e-4 && !strcmp(c.path, "min.yaml"), "defaults kept");
    CHECK(strata_config_seq_len(&c) == 16, "seq_len falls back to model.seq_len");
    CHECK(strata_config_padded_vocab(&c) == 256, "256 stays 256");
    c.model.vocab_size = 50257;
    CHECK(strata_config_padded_vocab(&c) == 50304, "50257 pads to 50304, got %d", strata_config_padded_vocab(&c));
    c.model.padded_vocab_size = 50560;
    CHECK(strata_config_padded_vocab(&c) == 50560, "explicit padded vocab wins");

    /* Flow style, an empty section, quoted scalars and each checkpointing form. */
    const char *flow = "device: cpu\nmodel: {n_layer: 1, n_head: 1, n_embd: 4, seq_len: 8, vocab_size: 10}\n"
                       "data: {train: 'a b.bin', val: ~}\ntrain: {steps: 3, seq_len: 4, activation_checkpointing: "
                       "every:3}\nzero:\noptim: {lr: 1e-3, min_lr: 0, schedule: linear}\n";
    rc = strata_config_load_string(&c, "flow.yaml", flow, NULL, 0);
    CHECK(rc == 0, "flow config: %s", strata_error());
    CHECK(c.device == STRATA_BACKEND_CPU && !strcmp(c.data.train, "a b.bin") && !strcmp(c.data.val, ""),
          "flow values");
    CHECK(c.train.activation_checkpointing == 3 && strata_config_seq_len(&c) == 4, "every:3 and train.seq_len");
    CHECK(c.optim.schedule == STRATA_SCHEDULE_LINEAR && c.optim.lr == 1e-3 && c.optim.min_lr == 0, "optim values");
    const char *sets_blocks[] = {"train.activation_checkpointing=blocks"};
    rc = strata_config_load_string(&c, "flow.yaml", flow, sets_blocks, 1);
    CHECK(rc == 0 && c.train.activation_checkpointing == 1, "blocks = 1");
    const char *sets_none[] = {"train.activation_checkpointing=none"};
    rc = strata_config_load_string(&c, "flow.yaml", flow, sets_none, 1);
    CHECK(rc == 0 && c.train.activation_checkpointing == 0, "none = 0");
    printf("ok   minimal config, flow style, derived values\n");
}

static void test_overrides(void) {
    strata_config c;
    const char *sets[] = {"train.micro_batch=32", " device = cuda ", "data.val=v_*.bin", "optim.lr=6e-4",
                          "train.seed=18446744073709551615", "memory.auto=true", "offload.optimizer=nvme",
                          "offload.nvme_path=/mnt/nvme", "offload.params=cpu", "zero.stage=3"};
    int rc = strata_config_load_string(&c, "o.yaml", "device: cpu\n" HEAD TRAIN "  micro_batch: 4\n", sets, 10);
    CHECK(rc == 0, "overrides: %s", strata_error());
    CHECK(c.train.micro_batch == 32, "--set beats the file (%d)", c.train.micro_batch);
    CHECK(c.device == STRATA_BACKEND_CUDA, "top-level --set, spaces trimmed");
    CHECK(!strcmp(c.data.val, "v_*.bin") && c.optim.lr == 6e-4 && c.train.seed == UINT64_MAX && c.memory.auto_fit == 1,
          "other overrides");
    CHECK(c.offload.optimizer == STRATA_OFFLOAD_NVME && !strcmp(c.offload.nvme_path, "/mnt/nvme") &&
              c.offload.params == STRATA_OFFLOAD_CPU && c.zero.stage == 3, "nvme with path, params on the cpu at stage 3");

    /* offload.gradients is for one rank: the world's rule names the key and the world */
    const char *grads[] = {"offload.optimizer=cpu", "offload.gradients=cpu"};
    rc = strata_config_load_string(&c, "g.yaml", HEAD TRAIN, grads, 2);
    CHECK(rc == 0 && c.offload.gradients == STRATA_OFFLOAD_CPU && strata_config_check_world(&c, "g.yaml", 1) == 0,
          "offload.gradients: cpu at one rank: %s", strata_error());
    CHECK(strata_config_check_world(&c, "g.yaml", 2) != 0 &&
              !strcmp(strata_error(), "g.yaml: offload.gradients is cpu, which is for one rank (this run has 2): with "
                                      "several, zero.stage 2 or 3 keeps 1/2 of the gradient on each device instead"),
          "offload.gradients: cpu at two ranks is refused: %s", strata_error());

    /* train.global_batch: grad_accum follows the world, whole or refused naming both keys */
    const char *global[] = {"train.global_batch=24", "train.micro_batch=2"};
    int accum[5] = {0};
    for (int w = 1; w <= 4; w++) {
        rc = strata_config_load_string(&c, "b.yaml", HEAD TRAIN, global, 2);
        accum[w] = rc == 0 && strata_config_set_world(&c, "b.yaml", w) == 0 ? c.train.grad_accum : -1;
    }
    CHECK(accum[1] == 12 && accum[2] == 6 && accum[3] == 4 && accum[4] == 3,
          "global_batch 24 at micro_batch 2: grad_accum 12, 6, 4, 3 at 1-4 ranks (%d %d %d %d)", accum[1], accum[2],
          accum[3], accum[4]);
    rc = strata_config_load_string(&c, "b.yaml", HEAD TRAIN, global, 2);
    CHECK(rc == 0 && strata_config_set_world(&c, "b.yaml", 5) != 0 &&
              !strcmp(strata_error(), "b.yaml: train.global_batch 24 is not a multiple of train.micro_batch 2 x 5 ranks "
                                      "= 10 sequences a micro-step"),
          "24 over 5 ranks of 2 is refused: %s", strata_error());
    const char *both[] = {"train.global_batch=24", "train.micro_batch=2", "train.grad_accum=3"};
    rc = strata_config_load_string(&c, "b.yaml", HEAD TRAIN, both, 3);
    CHECK(rc == 0 && strata_config_set_world(&c, "b.yaml", 4) == 0 && c.train.grad_accum == 3,
          "a grad_accum given that agrees is fine");
    rc = strata_config_load_string(&c, "b.yaml", HEAD TRAIN, both, 3);
    CHECK(rc == 0 && strata_config_set_world(&c, "b.yaml", 2) != 0 &&
              !strcmp(strata_error(), "b.yaml: train.grad_accum 3 and train.global_batch 24 disagree (at 2 ranks with "
                                      "micro_batch 2, global_batch asks for grad_accum 6): set one of them"),
          "one that disagrees is refused naming both: %s", strata_error());

    /* optim.warmup_ratio (the run turns it into warmup_steps) or warmup_steps, not both */
    const char *warm[] = {"optim.warmup_ratio=0.03"};
    rc = strata_config_load_string(&c, "w.yaml", HEAD TRAIN, warm, 1);
    CHECK(rc == 0 && c.optim.warmup_ratio == 0.03 && c.optim.warmup_steps == 0, "optim.warmup_ratio alone: %s",
          strata_error());
    const char *ratio_steps[] = {"optim.warmup_ratio=0.03", "optim.warmup_steps=10"};
    rc = strata_config_load_string(&c, "w.yaml", HEAD TRAIN, ratio_steps, 2);
    CHECK(rc != 0 && !strcmp(strata_error(), "w.yaml: optim.warmup_steps 10 and optim.warmup_ratio 0.03 both say how "
                                             "long the warmup is: set one"),
          "warmup_ratio with warmup_steps is refused naming both: %s", strata_error());
    const char *ratio_one[] = {"optim.warmup_ratio=1"};
    CHECK(strata_config_load_string(&c, "w.yaml", HEAD TRAIN, ratio_one, 1) != 0, "warmup_ratio 1 is out of range");

    /* train.early_stop_patience counts validations: refused where there are none, naming why */
    const char *es_noval[] = {"train.early_stop_patience=3", "train.eval_every=10"};
    rc = strata_config_load_string(&c, "e.yaml", HEAD TRAIN, es_noval, 2);
    CHECK(rc != 0 && !strcmp(strata_error(), "e.yaml: train.early_stop_patience 3 counts validations, and this run has "
                                             "none: it needs data.val (empty) and train.eval_every > 0"),
          "early stopping without data.val is refused: %s", strata_error());
    const char *es_never[] = {"train.early_stop_patience=3", "train.eval_every=0", "data.val=v_*.bin"};
    rc = strata_config_load_string(&c, "e.yaml", HEAD TRAIN, es_never, 3);
    CHECK(rc != 0 && strstr(strata_error(), "it needs data.val and train.eval_every > 0 (it is 0)"),
          "early stopping with eval_every 0 is refused: %s", strata_error());
    const char *es_ok[] = {"train.early_stop_patience=3", "train.eval_every=10", "data.val=v_*.bin",
                           "train.early_stop_min_delta=0.01"};
    rc = strata_config_load_string(&c, "e.yaml", HEAD TRAIN, es_ok, 4);
    CHECK(rc == 0 && c.train.early_stop_patience == 3 && c.train.early_stop_min_delta == 0.01 &&
              strata_config_keeps_best(&c) && !c.run.keep_best,
          "early stopping with validations: loads, and spares the best checkpoint: %s", strata_error());
    const char *es_neg[] = {"train.early_stop_min_delta=-1"};
    CHECK(strata_config_load_string(&c, "e.yaml", HEAD TRAIN, es_neg, 1) != 0, "early_stop_min_delta -1 is out of range");

    /* A required key may come from --set alone. */
    const char *need[] = {"data.train=x_*.bin"};
    rc = strata_config_load_string(&c, "o.yaml", "model: {n_layer: 1, n_head: 1, n_embd: 4, seq_len: 8, vocab_size: 10}\n"
                                                 TRAIN, need, 1);
    CHECK(rc == 0 && !strcmp(c.data.train, "x_*.bin"), "required key from --set: %s", strata_error());

    /* A failed load or set leaves the struct untouched. */
    strata_config before = c;
    rc = strata_config_set(&c, "train.micro_batch=zero");
    CHECK(rc == -1 && !memcmp(&before, &c, sizeof c), "failed set leaves c unchanged");
    rc = strata_config_load_string(&c, "bad.yaml", "nope: 1\n", NULL, 0);
    CHECK(rc == -1 && !memcmp(&before, &c, sizeof c), "failed load leaves c unchanged");
    rc = strata_config_set(&c, "train.seq_len=1000");
    CHECK(rc == 0 && c.train.seq_len == 1000, "set skips cross-key rules");
    rc = strata_config_check(&c, "o.yaml");
    CHECK(rc == -1 && !strcmp(strata_error(), "o.yaml: train.seq_len (1000) must not exceed model.seq_len (8)"),
          "check after set: %s", strata_error());

    /* offload.optimizer_ratio takes "auto" (the launcher resolves it) or a share */
    const char *ratio[] = {"offload.optimizer=cpu", "offload.optimizer_ratio=auto"};
    rc = strata_config_load_string(&c, "o.yaml", HEAD TRAIN, ratio, 2);
    CHECK(rc == 0 && c.offload.optimizer_ratio == STRATA_AUTO, "optimizer_ratio auto: %s", strata_error());
    rc = strata_config_set(&c, "offload.optimizer_ratio=half");
    CHECK(rc == -1 && !strcmp(strata_error(), "--set: key 'offload.optimizer_ratio': expected a number or auto, got 'half'"),
          "optimizer_ratio text: %s", strata_error());
    rc = strata_config_set(&c, "offload.optimizer_ratio=1.5");
    CHECK(rc == -1 && !strcmp(strata_error(), "--set: key 'offload.optimizer_ratio': must be greater than 0 and at most 1, "
                                              "or auto, got 1.5"), "optimizer_ratio range: %s", strata_error());
    const char *auto_none[] = {"offload.optimizer_ratio=auto"};
    rc = strata_config_load_string(&c, "o.yaml", HEAD TRAIN, auto_none, 1);
    CHECK(rc == -1 && strstr(strata_error(), "offload.optimizer_ratio (auto) is the share of the optimizer state offloaded, "
                                             "but offload.optimizer is none"), "auto without offload: %s", strata_error());
    const char *nvme_auto[] = {"offload.optimizer=nvme", "offload.nvme_path=/mnt/nvme", "offload.nvme_ratio=auto"};
    rc = strata_config_load_string(&c, "o.yaml", HEAD TRAIN, nvme_auto, 3);
    CHECK(rc == 0 && c.offload.nvme_ratio == STRATA_AUTO, "nvme_ratio auto: %s", strata_error());
    const char *nvme_auto_cpu[] = {"offload.optimizer=cpu", "offload.nvme_ratio=auto"};
    rc = strata_config_load_string(&c, "o.yaml", HEAD TRAIN, nvme_auto_cpu, 2);
    CHECK(rc == -1 && strstr(strata_error(), "offload.nvme_ratio (auto) is the share of the offloaded optimizer state on "
                                             "NVMe, but offload.optimizer is cpu"), "nvme_ratio auto without nvme: %s",
          strata_error());
    printf("ok   overrides win over the file; failures leave the config unchanged\n");
}

static void round_trip(const strata_config *c, int with_comments, const char *what) {
    char *text = strata_config_yaml(c, with_comments);
    CHECK(text != NULL, "%s: the config writes as YAML: %s", what, text ? "" : strata_error());
    if (!text) return;
    strata_config back;
    memset(&back, 0, sizeof back);
    int rc = strata_config_load_string(&back, c->path, text, NULL, 0);
    CHECK(rc == 0, "%s: written config does not parse: %s\n%s", what, strata_error(), text);
    CHECK(rc != 0 || !memcmp(&back, c, sizeof back), "%s: parsed config differs\n%s", what, text);
    /* Every key is printed: count "key:" lines against the sections and keys. */
    int lines = 0;
    for (const char *p = text; *p; p++) lines += *p == '\n';
    CHECK(lines >= 60, "%s: only %d lines", what, lines);
    free(text);
}

static void test_round_trip(void) {
    strata_config c;
    memset(&c, 0, sizeof c);
    const char *sets[] = {"data.val=say \"hi\"\\ and \t tab", "optim.lr=3e-4", "optim.min_lr=1.2345678901234567e-7",
                          "optim.eps=1.2345678901234567e-30", "train.seed=18446744073709551615", "train.activation_checkpointing=every:7",
                          "train.steps=1000000000000", "zero.stage=3", "comm.timeout_s=0.5", "train.dtype=bf16",
                          "train.grad_reduce_dtype=fp32", "offload.optimizer=cpu", "data.shuffle=false",
                          "run.dir=runs/with: colon # hash", "model.padded_vocab_size=384",
                          /* YAML's other line breaks, NEL, LS and PS (found by tests/fuzz/fuzz_config) */
                          "data.tokenizer=nel\xc2\x85 ls\xe2\x80\xa8 ps\xe2\x80\xa9 end",
                          /* what libyaml refuses or drops raw: a C1 control, a BOM, DEL; and
                           * what it keeps: other non-ASCII text */
                          "offload.nvme_path=c1\xc2\x80 bom\xef\xbb\xbf del\x7f \xc3\xa9t\xc3\xa9 \xf0\x9f\x99\x82"};
    int rc = strata_config_load_string(&c, "rt.yaml", HEAD TRAIN, sets, (int)(sizeof sets / sizeof sets[0]));
    CHECK(rc == 0, "round-trip source: %s", strata_error());
    round_trip(&c, 1, "with comments");
    round_trip(&c, 0, "without comments");
    printf("ok   write -> parse round trip is exact\n");
}

/* A config is YAML text and every checkpoint records it: a string YAML cannot hold (a
 * --set value that is not UTF-8) is refused when it is given, naming the key, instead
 * of failing the first checkpoint after the training it was meant to keep. */
static void test_not_utf8_refused(void) {
    strata_config c;
    int rc = strata_config_load_string(&c, "u.yaml", HEAD TRAIN, NULL, 0);
    CHECK(rc == 0, "source: %s", strata_error());
    strata_config before = c;
    rc = strata_config_set(&c, "run.dir=runs/x\xff");
    CHECK(rc != 0 && strstr(strata_error(), "key 'run.dir': byte 6 is not valid UTF-8"),
          "a --set value that is not UTF-8 is refused naming key and byte: %s", strata_error());
    CHECK(!memcmp(&before, &c, sizeof c), "the refused value left the config as it was");
    const char *sets[] = {"data.val=\xc3("}; /* a sequence cut short */
    rc = strata_config_load_string(&c, "u.yaml", HEAD TRAIN, sets, 1);
    CHECK(rc != 0 && strstr(strata_error(), "key 'data.val': byte 0 is not valid UTF-8"),
          "a cut-short sequence is refused too: %s", strata_error());
}

static void test_builtin_matches_file(void) {
    char *path = source_path("configs/quickstart.yaml");
    size_t len = 0;
    char *text = read_file(path, &len);
    CHECK(text != NULL, "cannot read %s", path);
    if (text) {
        const char *builtin = strata_config_builtin_yaml();
        CHECK(len == strlen(builtin) && !memcmp(text, builtin, len),
              "%s differs from the built-in copy compiled into the binary", path);
    }
    strata_config a, b;
    int rc = strata_config_load(&a, NULL, NULL, 0);
    CHECK(rc == 0, "built-in config: %s", strata_error());
    rc = strata_config_load(&b, path, NULL, 0);
    CHECK(rc == 0, "quickstart file: %s", strata_error());
    memcpy(b.path, a.path, sizeof b.path);
    CHECK(!memcmp(&a, &b, sizeof a), "built-in and file load to different configs");
    CHECK(a.path[0] == 0, "built-in config has an empty path");
    CHECK(a.model.n_layer == 4 && a.model.n_embd == 128 && a.model.vocab_size == 256 && a.train.steps == 1500 &&
              a.train.micro_batch == 16 && a.train.log_every == 50 && a.train.sample_tokens == 300 &&
              a.optim.lr == 4e-3 && a.optim.min_lr == 2e-4 && a.optim.warmup_steps == 50 &&
              !strcmp(a.run.dir, "runs/quickstart") && a.run.checkpoint_every == 500 && a.run.keep == 2 &&
              !strcmp(a.data.train, "data/quickstart/train_*.bin"),
          "quickstart values");
    const char *sets[] = {"train.seq_len=256"};
    rc = strata_config_load(&a, NULL, sets, 1);
    CHECK(rc == -1 && !strcmp(strata_error(), "<built-in>: train.seq_len (256) must not exceed model.seq_len (128)"),
          "built-in name in messages: %s", strata_error());
    free(text);
    free(path);
    printf("ok   built-in config == configs/quickstart.yaml\n");
}

static void test_shipped_configs(void) {
    static const struct {
        const char *file;
        int n_layer, n_head, n_embd, zero_stage;
    } shipped[] = {
        {"configs/quickstart.yaml", 4, 4, 128, 0},   {"configs/tinyshakespeare.yaml", 4, 4, 128, 0},
        {"configs/gpt2-124m.yaml", 12, 12, 768, 0},  {"configs/gpt2-350m.yaml", 24, 16, 1024, 0},
        {"configs/gpt2-774m.yaml", 36, 20, 1280, 0}, {"configs/gpt2-1.5b.yaml", 48, 25, 1600, 2},
        {"configs/gpt2-124m-zero1.yaml", 12, 12, 768, 1},   {"configs/gpt2-124m-zero2.yaml", 12, 12, 768, 2},
        {"configs/gpt2-124m-zero3.yaml", 12, 12, 768, 3},   {"configs/gpt2-350m-zero1.yaml", 24, 16, 1024, 1},
        {"configs/gpt2-350m-zero2.yaml", 24, 16, 1024, 2},  {"configs/gpt2-350m-zero3.yaml", 24, 16, 1024, 3},
        {"configs/gpt2-774m-zero1.yaml", 36, 20, 1280, 1},  {"configs/gpt2-774m-zero2.yaml", 36, 20, 1280, 2},
        {"configs/gpt2-774m-zero3.yaml", 36, 20, 1280, 3},  {"configs/gpt2-1.5b-zero1.yaml", 48, 25, 1600, 1},
        {"configs/gpt2-1.5b-zero2.yaml", 48, 25, 1600, 2},  {"configs/gpt2-1.5b-zero3.yaml", 48, 25, 1600, 3},
    };
    for (size_t i = 0; i < sizeof shipped / sizeof shipped[0]; i++) {
        char *path = source_path(shipped[i].file);
        strata_config c;
        int rc = strata_config_load(&c, path, NULL, 0);
        CHECK(rc == 0, "%s: %s", path, strata_error());
        CHECK(rc != 0 || (c.model.n_layer == shipped[i].n_layer && c.model.n_head == shipped[i].n_head &&
                          c.model.n_embd == shipped[i].n_embd && c.zero.stage == shipped[i].zero_stage),
              "%s: shape", path);
        if (rc == 0) round_trip(&c, 1, shipped[i].file);
        free(path);
    }
    strata_config c;
    char *path = source_path("configs/gpt2-124m.yaml");
    int rc = strata_config_load(&c, path, NULL, 0);
    CHECK(rc == 0 && c.device == STRATA_BACKEND_CUDA && c.train.dtype == STRATA_DTYPE_BF16 &&
              c.model.vocab_size == 50257 && c.model.seq_len == 1024 && c.train.micro_batch == 16 &&
              c.train.steps == 5000 && c.optim.lr == 6e-4 && c.optim.warmup_steps == 700 &&
              !strcmp(c.data.train, "data/fineweb10B/fineweb_train_*.bin"),
          "gpt2-124m values");
    free(path);
    path = source_path("configs/tinyshakespeare.yaml");
    rc = strata_config_load(&c, path, NULL, 0);
    CHECK(rc == 0 && c.device == STRATA_BACKEND_CPU && c.train.steps == 1000 && c.optim.lr == 4e-3 &&
              c.train.eval_every == 200 && !strcmp(c.data.train, "data/tinyshakespeare/train_*.bin"),
          "tinyshakespeare values");
    free(path);
    printf("ok   every shipped config loads and round-trips\n");
}

/* Values just inside the bounds as floats stay accepted: the float checks refuse only what
 * the kernels would not see as written (issue 31 item 5). */
static void test_float_hyperparameters_kept(void) {
    strata_config c;
    const char *sets[] = {"optim.beta2=0.9999999", "optim.beta1=0", "optim.eps=1e-40", "optim.lr=1e-30",
                          "optim.min_lr=0", "optim.weight_decay=0", "optim.grad_clip=0"};
    int rc = strata_config_load_string(&c, "f.yaml", HEAD TRAIN, sets, (int)(sizeof sets / sizeof sets[0]));
    CHECK(rc == 0 && (float)c.optim.beta2 < 1.0f && (float)c.optim.eps > 0 && (float)c.optim.lr > 0,
          "beta2 0.9999999 (0.99999988 as a float), eps 1e-40 (a subnormal float), lr 1e-30 and zeros are accepted: %s",
          rc ? strata_error() : "ok");
}

/* model.init_from's config.json goes through the schema's bounds like the YAML's own keys
 * (issue 31 item 4): a shape beyond them is refused naming config.json and the key, not
 * allocated. */
static void test_init_from_bounds(void) {
    char dir[64], json[128], yaml[512], expect[512];
    snprintf(dir, sizeof dir, "/tmp/strata_test_hf_bounds_%d", (int)getpid());
    snprintf(json, sizeof json, "%s/config.json", dir);
    mkdir(dir, 0755);
    static const struct {
        const char *json, *key, *hf_key;
        long value;
        const char *range;
    } cases[] = {
        {"{\"model_type\": \"gpt2\", \"n_layer\": 100000000, \"n_head\": 2, \"n_embd\": 8, \"n_positions\": 16, "
         "\"vocab_size\": 256}", "n_layer", "n_layer", 100000000, "between 1 and 1024"},
        {"{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, \"n_positions\": 16, \"vocab_size\": 2000000}", "vocab_size",
         "vocab_size", 2000000, "between 1 and 1048576"},
        {"{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, \"n_ctx\": 2000000, \"vocab_size\": 256}", "seq_len",
         "n_positions", 2000000, "between 1 and 1048576"},
        {"{\"n_layer\": 2, \"n_head\": 4096, \"n_embd\": 8192, \"n_positions\": 16, \"vocab_size\": 256}", "n_head",
         "n_head", 4096, "between 1 and 1024"},
        {"{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 131072, \"n_positions\": 16, \"vocab_size\": 256}", "n_embd",
         "n_embd", 131072, "between 1 and 65536"},
    };
    snprintf(yaml, sizeof yaml, "model: {init_from: \"%s\"}\ndata: {train: x}\ntrain: {steps: 1}\n", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(json, cases[i].json);
        strata_config c;
        int rc = strata_config_load_string(&c, "ft.yaml", yaml, NULL, 0);
        snprintf(expect, sizeof expect, "ft.yaml: model.init_from's %s has %s %ld, but model.%s must be %s", json,
                 cases[i].hf_key, cases[i].value, cases[i].key, cases[i].range);
        CHECK(rc != 0 && !strcmp(strata_error(), expect), "config.json's %s %ld refused:\n  want: %s\n  got (rc %d): %s",
              cases[i].hf_key, cases[i].value, expect, rc, strata_error());
    }
    /* the YAML may still say the key itself, and then config.json must agree with it */
    write_text(json, cases[0].json);
    strata_config c;
    const char *set = "model.n_layer=2";
    int rc = strata_config_load_string(&c, "ft.yaml", yaml, &set, 1);
    CHECK(rc != 0 && strstr(strata_error(), "model.n_layer is 2, but model.init_from's"),
          "a YAML n_layer against config.json's 100000000 is the disagreement it was: %s", strata_error());
    unlink(json);
    rmdir(dir);
}

/* The keys a checkpoint's weights mean something by (issue 31 item 6): another n_head is
 * refused naming both values; what only changes how a run computes is not. */
static void test_same_model(void) {
    strata_config saved, now;
    MUST(strata_config_load_string(&saved, "s.yaml", HEAD TRAIN, NULL, 0));
    const char *lr = "optim.lr=0.001", *heads = "model.n_head=4", *vocab = "model.vocab_size=200";
    MUST(strata_config_load_string(&now, "n.yaml", HEAD TRAIN, &lr, 1));
    CHECK(strata_config_check_same_model(&saved, "ckpt/step_1", &now) == 0, "another optim.lr is the same model");
    MUST(strata_config_load_string(&now, "n.yaml", HEAD TRAIN, &heads, 1));
    CHECK(strata_config_check_same_model(&saved, "ckpt/step_1", &now) != 0 &&
              !strncmp(strata_error(), "model.n_head is 4, but ckpt/step_1 was trained with model.n_head 2", 66),
          "another n_head is refused naming both values: %s", strata_error());
    MUST(strata_config_load_string(&now, "n.yaml", HEAD TRAIN, &vocab, 1));
    CHECK(strata_config_check_same_model(&saved, "ckpt/step_1", &now) != 0 &&
              strstr(strata_error(), "model.vocab_size is 200, but ckpt/step_1 was trained with model.vocab_size 256"),
          "another vocab_size within the same padded rows too: %s", strata_error());
}

/* What ranks compare at start (issue 31 item 9): the keys that differ, both values, the
 * skipped keys left out, and a digest that differs exactly when the diff is not empty. */
static void test_diff_and_digest(void) {
    strata_config a, b;
    const char *sb[] = {"train.steps=12", "optim.lr=0.002", "train.threads=3", "data.train=elsewhere/t_*.bin"};
    MUST(strata_config_load_string(&a, "a.yaml", HEAD TRAIN, NULL, 0));
    MUST(strata_config_load_string(&b, "b.yaml", HEAD TRAIN, sb, 4));
    char out[512];
    int n = strata_config_diff(&a, &b, NULL, out, sizeof out);
    CHECK(n == 4 && !strcmp(out, "data.train t_*.bin vs elsewhere/t_*.bin, train.steps 10 vs 12, train.threads 0 vs 3, "
                                  "optim.lr 0.0003 vs 0.002"),
          "every key that differs, a's value first (%d): %s", n, out);
    const char *skip[] = {"train.threads", "data.train", NULL};
    n = strata_config_diff(&a, &b, skip, out, sizeof out);
    CHECK(n == 2 && !strcmp(out, "train.steps 10 vs 12, optim.lr 0.0003 vs 0.002"), "skipped keys left out (%d): %s",
          n, out);
    CHECK(strata_config_digest(&a, skip) != strata_config_digest(&b, skip), "digests differ where the diff is not empty");
    n = strata_config_diff(&a, &b, skip, out, 20);
    CHECK(n == 2 && strlen(out) == 19, "a short buffer is cut, the count still whole (%d): '%s'", n, out);
    const char *sa[] = {"train.steps=12", "optim.lr=0.002"};
    MUST(strata_config_load_string(&a, "a.yaml", HEAD TRAIN, sa, 2));
    CHECK(strata_config_diff(&a, &b, skip, out, sizeof out) == 0 && out[0] == 0 &&
              strata_config_digest(&a, skip) == strata_config_digest(&b, skip),
          "configs that differ only in skipped keys: no difference, the same digest (%s)", out);
    CHECK(strata_config_digest(&a, NULL) != strata_config_digest(&b, NULL), "... which count without the skip list");
}

/* The Llama family's keys: 0s resolved in the config a run records, the model shape, the
 * Hugging Face model_type export writes, the description, the round trip. */
static void test_llama_keys(void) {
    strata_config c;
    int rc = strata_config_load_string(&c, "l.yaml", LLAMA "  intermediate_size: 32\n" DATA_TRAIN, NULL, 0);
    CHECK(rc == 0 && c.model.arch == STRATA_ARCH_LLAMA && c.model.n_kv_head == 4 && c.model.head_dim == 4 &&
              c.model.max_position_embeddings == 16 && c.model.tie_embeddings && c.model.rope_theta == 10000 &&
              (float)c.model.rms_norm_eps == 1e-6f && !strcmp(strata_config_hf_model_type(&c), "llama"),
          "llama defaults: n_kv_head = n_head, head_dim = n_embd / n_head, max_position_embeddings = seq_len (%s)",
          rc ? strata_error() : "ok");
    if (rc == 0) round_trip(&c, 1, "llama");
    strata_model_shape sh = strata_config_model_shape(&c);
    CHECK(sh.arch == STRATA_ARCH_LLAMA && sh.n_kv_head == 4 && sh.head_dim == 4 && sh.intermediate_size == 32 &&
              sh.rope_type == STRATA_ROPE_DEFAULT && sh.tie_embeddings && !sh.qkv_bias,
          "the model shape carries the family's keys");
    const char *sets[] = {"model.n_kv_head=2", "model.head_dim=6", "model.qkv_bias=true", "model.rope_scaling=llama3",
                          "model.tie_embeddings=false"};
    rc = strata_config_load_string(&c, "l.yaml", LLAMA "  intermediate_size: 32\n" DATA_TRAIN, sets, 5);
    char desc[256] = "";
    if (rc == 0) strata_config_model_describe(&c, desc, sizeof desc);
    CHECK(rc == 0 && !strcmp(strata_config_hf_model_type(&c), "qwen2") &&
              !strcmp(desc, "qwen2: 2 layers, 4 heads (2 key/value) of 6, 16 channels, MLP 32, vocab 256, RoPE llama3 "
                            "theta 10000, q/k/v biases"),
          "q/k/v biases are qwen2 unless named otherwise; described as: %s", rc ? strata_error() : desc);
    const char *norm = "model.qk_norm=true";
    rc = strata_config_load_string(&c, "l.yaml", LLAMA "  intermediate_size: 32\n" DATA_TRAIN, &norm, 1);
    CHECK(rc == 0 && !strcmp(strata_config_hf_model_type(&c), "qwen3"), "q/k norms are qwen3");
    const char *mistral = "model.hf_model_type=mistral";
    rc = strata_config_load_string(&c, "l.yaml", LLAMA "  intermediate_size: 32\n" DATA_TRAIN, &mistral, 1);
    CHECK(rc == 0 && !strcmp(strata_config_hf_model_type(&c), "mistral"), "a model_type kept as named");
    rc = strata_config_load_string(&c, "g.yaml", HEAD TRAIN, NULL, 0);
    CHECK(rc == 0 && c.model.arch == STRATA_ARCH_GPT2 && c.model.n_kv_head == 0 && c.model.head_dim == 0 &&
              !strcmp(strata_config_hf_model_type(&c), "gpt2"),
          "GPT-2 leaves the family's keys as they are");

    /* what a checkpoint's weights mean: RoPE and the norms do, the context of a rotary
     * model does not (GPT-2's does: it is wpe's rows) */
    strata_config saved, now;
    MUST(strata_config_load_string(&saved, "s.yaml", LLAMA "  intermediate_size: 32\n  max_position_embeddings: 64\n"
                                   DATA_TRAIN, NULL, 0));
    const char *longer = "model.seq_len=64", *theta = "model.rope_theta=500000", *kv = "model.n_kv_head=2";
    MUST(strata_config_load_string(&now, "n.yaml", LLAMA "  intermediate_size: 32\n  max_position_embeddings: 64\n"
                                   DATA_TRAIN, &longer, 1));
    CHECK(strata_config_check_same_model(&saved, "ckpt/step_1", &now) == 0, "llama: another model.seq_len is the same model");
    MUST(strata_config_load_string(&now, "n.yaml", LLAMA "  intermediate_size: 32\n  max_position_embeddings: 64\n"
                                   DATA_TRAIN, &theta, 1));
    CHECK(strata_config_check_same_model(&saved, "ckpt/step_1", &now) != 0 &&
              strstr(strata_error(), "model.rope_theta is 500000.0, but ckpt/step_1 was trained with model.rope_theta 10000.0"),
          "another rope_theta is refused: %s", strata_error());
    MUST(strata_config_load_string(&now, "n.yaml", LLAMA "  intermediate_size: 32\n  max_position_embeddings: 64\n"
                                   DATA_TRAIN, &kv, 1));
    CHECK(strata_config_check_same_model(&saved, "ckpt/step_1", &now) != 0 &&
              strstr(strata_error(), "model.n_kv_head is 2, but ckpt/step_1 was trained with model.n_kv_head 4"),
          "another n_kv_head is refused: %s", strata_error());
    const char *arch = "model.arch=gpt2";
    MUST(strata_config_load_string(&now, "n.yaml", HEAD TRAIN, &arch, 1));
    CHECK(strata_config_check_same_model(&saved, "ckpt/step_1", &now) != 0 &&
              strstr(strata_error(), "model.arch is gpt2, but ckpt/step_1 was trained with model.arch llama"),
          "another family is refused first: %s", strata_error());
    const char *gpt2_longer = "model.seq_len=32";
    MUST(strata_config_load_string(&saved, "s.yaml", HEAD TRAIN, NULL, 0));
    MUST(strata_config_load_string(&now, "n.yaml", HEAD TRAIN, &gpt2_longer, 1));
    CHECK(strata_config_check_same_model(&saved, "ckpt/step_1", &now) != 0, "gpt2: another model.seq_len is refused");
}

/* model.init_from of each family's config.json (transformers 5.x's rope_parameters, 4.x's
 * rope_theta and rope_scaling): every model key the YAML leaves out filled in, a context up
 * to max_position_embeddings, disagreements and short sliding windows refused by name. */
static void test_llama_init_from(void) {
    char dir[64], json[128], yaml[512];
    snprintf(dir, sizeof dir, "/tmp/strata_test_hf_llama_%d", (int)getpid());
    snprintf(json, sizeof json, "%s/config.json", dir);
    mkdir(dir, 0755);
    write_text(json, "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                     "\"num_key_value_heads\": 2, \"head_dim\": 6, \"hidden_size\": 16, \"intermediate_size\": 40, "
                     "\"vocab_size\": 300, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-05, "
                     "\"hidden_act\": \"silu\", \"tie_word_embeddings\": false, \"rope_parameters\": {\"rope_type\": "
                     "\"llama3\", \"rope_theta\": 500000.0, \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                     "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 16}}");
    snprintf(yaml, sizeof yaml, "model: {init_from: \"%s\"}\ndata: {train: x}\ntrain: {steps: 1}\n", dir);
    strata_config c;
    int rc = strata_config_load_string(&c, "ft.yaml", yaml, NULL, 0);
    CHECK(rc == 0 && c.model.arch == STRATA_ARCH_LLAMA && c.model.n_layer == 2 && c.model.n_head == 4 &&
              c.model.n_kv_head == 2 && c.model.head_dim == 6 && c.model.n_embd == 16 && c.model.intermediate_size == 40 &&
              c.model.vocab_size == 300 && c.model.seq_len == 64 && c.model.max_position_embeddings == 64 &&
              c.model.rope_theta == 500000 && c.model.rope_scaling == STRATA_ROPE_LLAMA3 && c.model.rope_factor == 8 &&
              c.model.rope_original_context == 16 && c.model.rms_norm_eps == 1e-5 && !c.model.tie_embeddings &&
              c.model.hf_model_type == STRATA_HF_LLAMA,
          "llama config.json (rope_parameters): every model key filled in, seq_len = max_position_embeddings (%s)",
          rc ? strata_error() : "ok");
    const char *shorter = "model.seq_len=32", *longer = "model.seq_len=128", *kv = "model.n_kv_head=4";
    rc = strata_config_load_string(&c, "ft.yaml", yaml, &shorter, 1);
    CHECK(rc == 0 && c.model.seq_len == 32 && c.model.max_position_embeddings == 64,
          "a shorter context is the YAML's to choose (%s)", rc ? strata_error() : "ok");
    rc = strata_config_load_string(&c, "ft.yaml", yaml, &longer, 1);
    CHECK(rc != 0 && strstr(strata_error(), "model.seq_len (128) must not exceed model.max_position_embeddings (64)"),
          "a longer one is refused: %s", strata_error());
    rc = strata_config_load_string(&c, "ft.yaml", yaml, &kv, 1);
    char want[512];
    snprintf(want, sizeof want, "ft.yaml: model.n_kv_head is 4, but model.init_from's %s has num_key_value_heads 2 (leave "
                                "model.n_kv_head out to take it from there)", json);
    CHECK(rc != 0 && !strcmp(strata_error(), want), "a disagreeing key names both values:\n  want: %s\n  got: %s", want,
          strata_error());

    write_text(json, "{\"model_type\": \"qwen2\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                     "\"num_key_value_heads\": 2, \"hidden_size\": 16, \"intermediate_size\": 40, \"vocab_size\": 300, "
                     "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
                     "\"rope_scaling\": null, \"sliding_window\": 8, \"use_sliding_window\": false, "
                     "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\"}");
    rc = strata_config_load_string(&c, "ft.yaml", yaml, NULL, 0);
    CHECK(rc == 0 && c.model.qkv_bias && !c.model.qk_norm && c.model.head_dim == 4 && c.model.tie_embeddings &&
              c.model.rope_theta == 1e6 && c.model.rope_scaling == STRATA_ROPE_DEFAULT && c.model.hf_model_type == STRATA_HF_QWEN2,
          "qwen2 config.json (rope_theta, no sliding window in use): q/k/v biases, head_dim from the sizes, tied (%s)",
          rc ? strata_error() : "ok");
    write_text(json, "{\"model_type\": \"mistral\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                     "\"num_key_value_heads\": 2, \"hidden_size\": 16, \"intermediate_size\": 40, \"vocab_size\": 300, "
                     "\"max_position_embeddings\": 64, \"sliding_window\": 16}");
    rc = strata_config_load_string(&c, "ft.yaml", yaml, &shorter, 1);
    CHECK(rc != 0 && strstr(strata_error(), "has sliding_window 16, shorter than model.seq_len 32") &&
              strstr(strata_error(), "set model.seq_len to at most 16"),
          "a sliding window shorter than the context is refused: %s", strata_error());
    const char *within = "model.seq_len=16";
    rc = strata_config_load_string(&c, "ft.yaml", yaml, &within, 1);
    CHECK(rc == 0 && c.model.hf_model_type == STRATA_HF_MISTRAL, "... and one as long is the full causal mask (%s)",
          rc ? strata_error() : "ok");
    unlink(json);
    rmdir(dir);
}

/* Llama 3.1 8B's config.json, as Hugging Face serves it */
static const char llama31_8b_json[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, "
    "\"bos_token_id\": 128000, \"eos_token_id\": 128001, \"hidden_act\": \"silu\", \"hidden_size\": 4096, "
    "\"initializer_range\": 0.02, \"intermediate_size\": 14336, \"max_position_embeddings\": 131072, \"mlp_bias\": "
    "false, \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": "
    "8, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, "
    "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, "
    "\"rope_theta\": 500000.0, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", "
    "\"transformers_version\": \"4.43.0.dev0\", \"use_cache\": true, \"vocab_size\": 128256}";

/* configs/llama-3.2-1b.yaml, llama-3.1-8b-offload.yaml, llama-3.1-8b-32k.yaml and
 * qwen2.5-7b-offload.yaml against their models' config.json (as Hugging Face serves them),
 * written where init_from would find them: each loads, round-trips and describes the model
 * with its known size. */
static void test_llama_shipped_configs(void) {
    static const struct {
        const char *file, *config_json, *desc;
        size_t params;
    } shipped[] = {
        {"configs/llama-3.2-1b.yaml",
         "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0, "
         "\"bos_token_id\": 128000, \"eos_token_id\": 128001, \"head_dim\": 64, \"hidden_act\": \"silu\", "
         "\"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192, \"max_position_embeddings\": "
         "131072, \"mlp_bias\": false, \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 16, "
         "\"num_key_value_heads\": 8, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0, "
         "\"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, "
         "\"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"torch_dtype\": "
         "\"bfloat16\", \"transformers_version\": \"4.45.0.dev0\", \"use_cache\": true, \"vocab_size\": 128256}",
         "llama: 16 layers, 32 heads (8 key/value) of 64, 2048 channels, MLP 8192, vocab 128256, RoPE llama3 theta 500000, tied",
         1235814400},
        {"configs/llama-3.1-8b-offload.yaml", llama31_8b_json,
         "llama: 32 layers, 32 heads (8 key/value) of 128, 4096 channels, MLP 14336, vocab 128256, RoPE llama3 theta 500000",
         8030261248},
        {"configs/llama-3.1-8b-32k.yaml", llama31_8b_json,
         "llama: 32 layers, 32 heads (8 key/value) of 128, 4096 channels, MLP 14336, vocab 128256, RoPE llama3 theta 500000",
         8030261248},
        {"configs/qwen2.5-7b-offload.yaml",
         "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643, "
         "\"eos_token_id\": 151643, \"hidden_act\": \"silu\", \"hidden_size\": 3584, \"initializer_range\": 0.02, "
         "\"intermediate_size\": 18944, \"max_position_embeddings\": 131072, \"max_window_layers\": 28, \"model_type\": "
         "\"qwen2\", \"num_attention_heads\": 28, \"num_hidden_layers\": 28, \"num_key_value_heads\": 4, \"rms_norm_eps\": "
         "1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 131072, \"tie_word_embeddings\": false, \"torch_dtype\": "
         "\"bfloat16\", \"transformers_version\": \"4.43.1\", \"use_cache\": true, \"use_sliding_window\": false, "
         "\"vocab_size\": 152064}",
         "qwen2: 28 layers, 28 heads (4 key/value) of 128, 3584 channels, MLP 18944, vocab 152064, RoPE theta 1000000, "
         "q/k/v biases",
         7615616512},
    };
    char dir[64], json[128], set[160];
    snprintf(dir, sizeof dir, "/tmp/strata_test_hf_shipped_%d", (int)getpid());
    snprintf(json, sizeof json, "%s/config.json", dir);
    snprintf(set, sizeof set, "model.init_from=%s", dir);
    mkdir(dir, 0755);
    const char *sets[] = {set};
    for (size_t i = 0; i < sizeof shipped / sizeof shipped[0]; i++) {
        write_text(json, shipped[i].config_json);
        char *path = source_path(shipped[i].file);
        strata_config c;
        int rc = strata_config_load(&c, path, sets, 1);
        CHECK(rc == 0, "%s: %s", shipped[i].file, rc ? strata_error() : "");
        if (rc) {
            free(path);
            continue;
        }
        round_trip(&c, 1, shipped[i].file);
        char desc[256];
        strata_config_model_describe(&c, desc, sizeof desc);
        strata_model_shape shape = strata_config_model_shape(&c);
        strata_model m;
        strata_model_init(&m, &shape);
        CHECK(!strcmp(desc, shipped[i].desc) && strata_model_num_params(&m) == shipped[i].params &&
                  c.model.seq_len <= c.model.max_position_embeddings && c.model.max_position_embeddings == 131072,
              "%s: %s, %zu parameters", shipped[i].file, desc, strata_model_num_params(&m));
        strata_model_free(&m);
        free(path);
    }
    unlink(json);
    rmdir(dir);
}

static void test_names(void) {
    CHECK(!strcmp(strata_schedule_name(STRATA_SCHEDULE_CONSTANT), "constant"), "schedule name");
    CHECK(!strcmp(strata_offload_name(STRATA_OFFLOAD_NVME), "nvme"), "offload name");
    CHECK(!strcmp(strata_dtype_choice_name(STRATA_DTYPE_BF16), "bf16"), "dtype name");
    printf("ok   enum names\n");
}

int main(void) {
    check_quiet = 1; /* each catalogue entry prints its own line */
    test_bad_catalogue();
    test_bad_file_on_disk();
    test_base();
    test_defaults();
    test_minimal_and_derived();
    test_overrides();
    test_round_trip();
    test_not_utf8_refused();
    test_float_hyperparameters_kept();
    test_init_from_bounds();
    test_same_model();
    test_diff_and_digest();
    test_builtin_matches_file();
    test_shipped_configs();
    test_llama_keys();
    test_llama_init_from();
    test_llama_shipped_configs();
    test_names();
    printf("%s: %d checks, %d failures\n", failures ? "FAIL" : "PASS", checks, failures);
    return failures ? 1 : 0;
}
