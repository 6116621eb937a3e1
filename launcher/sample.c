/* launcher/sample.c: sampling (strata_generate, the text it writes as it goes), `strata
 * sample` (a prompt, or a JSONL file of them) and `strata chat` (a conversation on stdin),
 * over a model's weights alone (launcher/infer.h). */
#include "launcher/sample.h"

#include <errno.h>
#include <math.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "shard/comm.h"
#include "shard/engine.h"
#include "io/chat.h"
#include "io/files.h"
#include "io/json.h"
#include "launcher/commands.h"
#include "launcher/infer.h"
#include "launcher/tokenizer.h"

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct { float p; int id; } cand;
static int cand_desc(const void *a, const void *b) {
    float x = ((const cand *)a)->p, y = ((const cand *)b)->p;
    if (x != y) return x < y ? 1 : -1;
    return ((const cand *)a)->id - ((const cand *)b)->id;
}

/* One draw from a row of logits (Vp entries, V real): greedy at temperature 0, else
 * from softmax(logits / temperature) over the top_k most likely (0: all). */
static int draw(const void *row, size_t es, cand *c, int V, float temperature, int top_k, strata_rng *rng) {
    float maxv = -INFINITY;
    for (int v = 0; v < V; v++) {
        float x = es == 4 ? ((const float *)row)[v] : bf16_to_f32(((const uint16_t *)row)[v]);
        c[v] = (cand){x, v};
        if (x > maxv) maxv = x;
    }
    int next = 0;
    if (temperature <= 0.0f) {
        for (int v = 1; v < V; v++) if (c[v].p > c[next].p) next = v;
        return next;
    }
    double sum = 0;
    for (int v = 0; v < V; v++) {
        c[v].p = expf((c[v].p - maxv) / temperature);
        sum += c[v].p;
    }
    int k = V;
    if (top_k > 0 && top_k < V) {
        qsort(c, V, sizeof *c, cand_desc);
        k = top_k;
        sum = 0;
        for (int v = 0; v < k; v++) sum += c[v].p;
    }
    double r = strata_rng_uniform(rng) * sum, acc = 0;
    next = c[k - 1].id;
    for (int v = 0; v < k; v++) {
        acc += c[v].p;
        if (r < acc) return c[v].id;
    }
    return next;
}

int strata_generate(strata_model *m, const int32_t *prompt, int n_prompt, int n_new, float temperature, int top_k,
                    strata_rng *rng, strata_token_sink sink, void *ctx) {
    int V = m->shape.vocab_size, Vp = m->shape.padded_vocab_size, T = m->T;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return strata_fail("prompt token %d at position %d is outside the model's vocabulary [0, %d)", prompt[i], i, V);
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    /* window[0, n) holds the context, its last T tokens the model's input */
    int32_t *window = strata_xmalloc(2 * (size_t)T * sizeof *window);
    int first = n_prompt > T ? n_prompt - T : 0, n = n_prompt - first;
    memcpy(window, prompt + first, (size_t)n * sizeof *window);
    void *row = strata_xmalloc((size_t)Vp * es);
    cand *c = strata_xmalloc((size_t)V * sizeof *c);
    int rc = 0;
    for (int i = 0; i < n_new && !rc; i++) {
        if (n == 2 * T) { /* keep the last T-1: room for T more before the next move */
            memmove(window, window + n - (T - 1), (size_t)(T - 1) * sizeof *window);
            n = T - 1;
        }
        int start = n > T ? n - T : 0, t = n - start, rows = t;
        int next = 0;
        if (t == 0) { /* empty prompt on a byte-level model: start from a newline */
            next = '\n' < V ? '\n' : 0;
        } else {
            if (!m->kv) {
                rc = strata_model_forward_logits(m, window + start, 1, t);
            } else {
                /* the cache's rows of the window's first tokens stand (a row depends on the
                 * tokens up to it alone): the token drawn last, a conversation's next turn;
                 * a window that moved on (past T tokens) starts over. The last token always
                 * runs: its row gives the logits. */
                int keep = 0, most = m->kv_len < t ? m->kv_len : t - 1;
                while (keep < most && m->kv_ids[keep] == window[start + keep]) keep++;
                m->kv_len = keep;
                rc = strata_model_extend(m, window + start + keep, t - keep);
                rows = t - keep;
            }
            if (rc) break;
            STRATA_TRY_GOTO(strata_memcpy_async(m->dev, m->dev->compute, row,
                                                (char *)m->logits + (size_t)(rows - 1 - m->logits_first) * Vp * es,
                                                (size_t)Vp * es),
                            rc, done);
            STRATA_TRY_GOTO(strata_stream_sync(m->dev, m->dev->compute), rc, done);
            next = draw(row, es, c, V, temperature, top_k, rng);
        }
        window[n++] = next;
        int said = sink ? sink(ctx, next) : 0;
        if (said == STRATA_TOKEN_STOP) break; /* the sink's end: a chat's turn is over */
        if (said) rc = strata_fail("writing the generated text failed");
    }
done:
    free(window);
    free(row);
    free(c);
    return rc;
}

/* The length of the unfinished UTF-8 character at the end of s[0, n): 0 if it ends on a
 * boundary. Only a lead byte followed by continuation bytes, fewer than it announces,
 * is unfinished; anything else is decided by the bytes already there. */
static size_t utf8_unfinished_tail(const unsigned char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

void strata_text_out_init(strata_text_out *o, FILE *f, int vocab_size, const strata_tokenizer *tk,
                          const strata_bpe *bpe) {
    memset(o, 0, sizeof *o);
    o->f = f;
    o->vocab_size = vocab_size;
    o->tk = tk;
    o->bpe = bpe && !strata_bpe_is_bytes(bpe) ? bpe : NULL; /* byte-level models keep the escaping below */
    o->stop_id = -1;
    uint32_t ch;
    if (o->bpe) o->strip = strata_bpe_strip_start(o->bpe, &ch);
}

/* The pending BPE bytes up to `upto` as text (U+FFFD for bytes that are no character). */
static void write_pending(strata_text_out *o, size_t upto) {
    size_t len = 0;
    char *text = strata_bpe_decode_bytes(o->pend, upto, &len);
    size_t skip = 0;
    while (o->strip && skip < len && text[skip] == ' ') skip++, o->strip--;
    if (skip < len) o->strip = 0; /* the text has begun: the decoder strips nothing later */
    fwrite(text + skip, 1, len - skip, o->f);
    free(text);
    memmove(o->pend, o->pend + upto, o->n_pend - upto);
    o->n_pend -= upto;
}

int strata_text_out_put(void *ctx, int32_t t) {
    strata_text_out *o = ctx;
    if (o->bpe) {
        size_t len = 0;
        const unsigned char *b = strata_bpe_token_bytes(o->bpe, t, &len);
        if (b && len) {
            if (o->n_pend + len > o->cap) {
                o->cap = (o->n_pend + len) * 2;
                o->pend = strata_xrealloc(o->pend, o->cap);
            }
            memcpy(o->pend + o->n_pend, b, len);
            o->n_pend += len;
            write_pending(o, o->n_pend - utf8_unfinished_tail(o->pend, o->n_pend));
        }
    } else if (o->tk && t >= 0 && t < o->tk->vocab_size) {
        fwrite(o->tk->pieces[t], 1, o->tk->lens[t], o->f);
    } else if (o->vocab_size <= 256) {
        unsigned char ch = (unsigned char)t;
        if (ch == '\n' || ch == '\t' || (ch >= 32 && ch != 127)) fputc(ch, o->f);
        else fprintf(o->f, "\\x%02x", ch);
    } else {
        fprintf(o->f, "<%d>", t);
    }
    if (fflush(o->f) != 0 || ferror(o->f)) return 1;
    return t == o->stop_id ? STRATA_TOKEN_STOP : 0;
}

void strata_text_out_finish(strata_text_out *o) {
    if (o->n_pend) write_pending(o, o->n_pend);
    fflush(o->f);
    free(o->pend);
    o->pend = NULL;
    o->cap = 0;
}

/* The BPE encoder's sink for a prompt: ids into a growing array. */
typedef struct ids_buf {
    int32_t *ids;
    size_t n, cap;
} ids_buf;

static int collect_ids(void *ctx, const int32_t *ids, size_t n) {
    ids_buf *b = ctx;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->ids = strata_xrealloc(b->ids, b->cap * sizeof *b->ids);
    }
    memcpy(b->ids + b->n, ids, n * sizeof *ids);
    b->n += n;
    return 0;
}


/* ---- strata sample ---- */

/* The command whose messages these are: "sample", or "chat" (strata_cmd_chat). */
static const char *cmd_name = "sample";
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "strata %s: ", cmd_name);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

/* The window a sample plans when --context does not say: the model's context, but no more
 * than this (Llama 3.1's 131072 tokens would plan 28 GiB of activations at 8B). */
#define SAMPLE_DEFAULT_CONTEXT 8192

static int usage(void) {
    if (!strcmp(cmd_name, "chat"))
        fprintf(stderr, "usage: strata chat CKPT|RUNDIR|HF_MODEL [--system TEXT] [--tokens N] [--temperature T] [--top-k K]\n"
                        "                   [--seed S] [--tokenizer FILE] [--context N] [--device cpu|cuda]\n"
                        "                   [--weights auto|device|host]\n");
    else
        fprintf(stderr, "usage: strata sample CKPT|RUNDIR|HF_MODEL [--prompt TEXT | --prompts FILE] [--chat [--system TEXT]]\n"
                        "                     [--tokens N] [--temperature T] [--top-k K] [--seed S] [--tokenizer FILE]\n"
                        "                     [--context N] [--device cpu|cuda] [--weights auto|device|host]\n");
    return STRATA_EXIT_USAGE;
}

/* The command line. */
typedef struct sample_args {
    const char *what, *prompt, *tok_path, *system;
    const char *prompts; /* --prompts FILE: a completion for each of its prompts, as JSON lines */
    const char *device; /* --device: instead of the run's */
    int n_tokens, top_k, chat, one_prompt;
    int context; /* --context: the window, 0 = the model's (at most SAMPLE_DEFAULT_CONTEXT) */
    int weights; /* --weights: a strata_weights_home */
    double temperature;
    uint64_t seed;
} sample_args;

/* What one sample holds: the tokenizer (llm.c's, or a BPE, or neither) and the prompt's
 * ids, the first n_hidden of which are not text the user wrote (the template's BOS, or
 * GPT-2's <|endoftext|> that an empty prompt starts from) and are not printed. */
typedef struct sample_run {
    strata_tokenizer tk; /* llm.c's .bin, when have_tk: decoding only */
    int have_tk;
    strata_bpe *bpe;
    int32_t *prompt_ids;
    size_t n_prompt, n_hidden;
    int32_t stop_id; /* --chat: the end of the assistant's turn, else -1 */
} sample_run;

static void sample_run_free(sample_run *s) {
    free(s->prompt_ids);
    if (s->have_tk) strata_tokenizer_free(&s->tk);
    strata_bpe_free(s->bpe);
}

/* The command line into a (defaults: 200 tokens, temperature 1, all tokens, seed 1337).
 * Returns an exit code (0: go on), the usage error printed. */
static int parse_args(int argc, char **argv, sample_args *sa, int chat_cmd) {
    *sa = (sample_args){.prompt = "", .n_tokens = 200, .top_k = 0, .temperature = 1.0, .seed = 1337};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--prompt") && v) sa->prompt = argv[++i], sa->one_prompt = 1;
        else if (!strcmp(a, "--prompts") && v) sa->prompts = argv[++i];
        else if (!strcmp(a, "--chat")) sa->chat = 1;
        else if (!strcmp(a, "--system") && v) sa->system = argv[++i];
        else if (!strcmp(a, "--tokenizer") && v) sa->tok_path = argv[++i];
        else if (!strcmp(a, "--device") && v) {
            if (strata_parse_device("sample", (sa->device = argv[++i]))) return STRATA_EXIT_USAGE;
        } else if (!strcmp(a, "--context") && v) {
            long long want = strtoll(argv[++i], &end, 10);
            if (*end || !*v || want < 1 || want > 1048576) { say("--context expects a number of tokens from 1 to 1048576, got '%s'\n", v); return STRATA_EXIT_USAGE; }
            sa->context = (int)want;
        } else if (!strcmp(a, "--weights") && v) {
            if (strata_parse_weights("sample", argv[++i], &sa->weights)) return STRATA_EXIT_USAGE;
        }
        else if (!strcmp(a, "--tokens") && v) {
            errno = 0;
            long long want = strtoll(argv[++i], &end, 10);
            if (*end || !*v || want < 1) { say("--tokens expects a positive integer, got '%s'\n", v); return STRATA_EXIT_USAGE; }
            if (errno == ERANGE || want > STRATA_SAMPLE_MAX_TOKENS) {
                say("--tokens %s is more than the %d one sample may generate\n", v,
                        STRATA_SAMPLE_MAX_TOKENS);
                return STRATA_EXIT_USAGE;
            }
            sa->n_tokens = (int)want;
        } else if (!strcmp(a, "--top-k") && v) {
            sa->top_k = (int)strtol(argv[++i], &end, 10);
            if (*end || sa->top_k < 0) { say("--top-k expects an integer >= 0, got '%s'\n", v); return STRATA_EXIT_USAGE; }
        } else if (!strcmp(a, "--temperature") && v) {
            sa->temperature = strtod(argv[++i], &end);
            if (*end || !(sa->temperature >= 0)) { say("--temperature expects a number >= 0, got '%s'\n", v); return STRATA_EXIT_USAGE; }
        } else if (!strcmp(a, "--seed") && v) {
            sa->seed = strtoull(argv[++i], &end, 10);
            if (*end) { say("--seed expects an integer, got '%s'\n", v); return STRATA_EXIT_USAGE; }
        } else if (a[0] != '-' && !sa->what) sa->what = a;
        else { say("unexpected argument '%s'\n", a); return usage(); }
    }
    sa->chat |= chat_cmd;
    if (sa->system && !sa->chat) {
        say("--system goes with --chat\n");
        return STRATA_EXIT_USAGE;
    }
    if (sa->prompts && sa->one_prompt) {
        say("--prompt and --prompts: one prompt, or a file of them\n");
        return STRATA_EXIT_USAGE;
    }
    if (chat_cmd && (sa->prompts || sa->one_prompt)) {
        say("the user's messages come from stdin, a line each: no --prompt or --prompts\n");
        return STRATA_EXIT_USAGE;
    }
    return sa->what ? 0 : usage();
}

/* --tokenizer: llm.c's .bin (decoding only) or a Hugging Face BPE; default: the one the
 * run recorded beside the checkpoint (none is no error). Returns an exit code. */
static int open_tokenizer(sample_run *s, const char *tok_path, const char *ckpt_dir, int hf) {
    int failed = 0;
    char hf_tok[STRATA_PATH_MAX + 32];
    snprintf(hf_tok, sizeof hf_tok, "%s/tokenizer.json", ckpt_dir);
    if (!tok_path && hf && strata_is_dir(ckpt_dir) && strata_is_file(hf_tok)) tok_path = ckpt_dir; /* the model's own */
    if (tok_path && strlen(tok_path) > 4 && !strcmp(tok_path + strlen(tok_path) - 4, ".bin")) {
        if (strata_tokenizer_load(&s->tk, tok_path)) failed = 1;
        s->have_tk = !failed;
    } else if (tok_path) {
        failed = !(s->bpe = strata_bpe_load(tok_path));
    } else if (!hf) {
        s->bpe = strata_ckpt_tokenizer(ckpt_dir, &failed);
    }
    if (failed) {
        say("tokenizer: %s\n", strata_error());
        return STRATA_EXIT_USAGE;
    }
    return 0;
}

/* The prompt as token ids: the BPE's, or bytes for a byte-level model (a larger
 * vocabulary needs its tokenizer). Returns an exit code. */
static int encode_prompt(sample_run *s, const char *prompt, int vocab_size) {
    if (s->bpe) { /* as tokenizer(prompt): the template's tokens before it (a BOS), none after */
        ids_buf b = {0};
        const int32_t *prefix, *suffix;
        int n_prefix, n_suffix;
        strata_bpe_template(s->bpe, &prefix, &n_prefix, &suffix, &n_suffix);
        collect_ids(&b, prefix, (size_t)n_prefix);
        int rc = strata_bpe_encode(s->bpe, prompt, strlen(prompt), "--prompt", collect_ids, &b);
        s->prompt_ids = b.ids;
        s->n_prompt = b.n;
        s->n_hidden = (size_t)n_prefix;
        if (rc) {
            say("%s\n", strata_error());
            return STRATA_EXIT_USAGE;
        }
    } else if (prompt[0]) {
        s->n_prompt = strlen(prompt);
        s->prompt_ids = strata_xmalloc(s->n_prompt * sizeof(int32_t));
        for (size_t i = 0; i < s->n_prompt; i++) s->prompt_ids[i] = (unsigned char)prompt[i];
        if (vocab_size > 256) {
            say("--prompt needs the model's tokenizer: this checkpoint has vocab_size %d and "
                            "its run recorded none (pass --tokenizer tokenizer.json or a model directory)\n",
                    vocab_size);
            return STRATA_EXIT_USAGE;
        }
    }
    return 0;
}

/* Every prompt id must be inside the model's vocabulary; the message names the first
 * that is not, and where. Returns an exit code. */
static int check_prompt(const sample_run *s, int vocab_size) {
    for (size_t i = 0; i < s->n_prompt; i++) {
        if (s->prompt_ids[i] < vocab_size) continue;
        size_t len = 0;
        const unsigned char *text = s->bpe ? strata_bpe_token_bytes(s->bpe, s->prompt_ids[i], &len) : NULL;
        if (s->bpe)
            say("--prompt: token %d (\"%.*s\") at position %zu is outside the model's "
                            "vocabulary of %d (is this the tokenizer the model was trained with?)\n",
                    s->prompt_ids[i], (int)len, text ? (const char *)text : "", i, vocab_size);
        else
            say("--prompt: byte 0x%02x at byte %zu is outside the model's vocabulary of "
                            "%d (a byte-level model takes bytes below it; pass --tokenizer for another)\n",
                    (unsigned)s->prompt_ids[i], i, vocab_size);
        return STRATA_EXIT_USAGE;
    }
    return 0;
}

/* A conversation's start in the chat format of the run's data (its tokenizer_config.json's
 * template, io/chat.h), or for a Hugging Face model the one its special tokens say: the
 * BOS, then --system's message, else the template's default system message when it has
 * one. *chat is the format bound to the tokenizer. Returns an exit code, the error printed. */
static int chat_start(const sample_run *s, const char *given_system, int hf, strata_chat *chat, strata_tokens *t) {
    char *system = NULL; /* the template's default system message, which a conversation starts with */
    strata_chat_format f = strata_chat_format_system(s->bpe, &system);
    /* a Hugging Face model's own template is not one Strata wrote: its special tokens say
     * which format it speaks (Llama 3 Instruct's, or ChatML's) */
    if (f == STRATA_CHAT_NONE && hf && s->bpe) f = strata_chat_format_detect(s->bpe);
    if (given_system) { /* --system: this one, instead */
        free(system);
        system = strata_xstrdup(given_system);
    }
    if (!s->bpe || f == STRATA_CHAT_NONE) {
        free(system);
        if (hf)
            say("a chat needs a model whose tokenizer speaks Llama 3 Instruct's or ChatML's "
                            "format (%s)\n", s->bpe ? "this one has neither's special tokens" : "this one has no tokenizer.json");
        else
            say("a chat needs the chat template of data prepared with --chat-format llama3 or "
                            "chatml (%s)\n", s->bpe ? "this run's tokenizer has no such template" : "this run has no tokenizer");
        return STRATA_EXIT_USAGE;
    }
    *t = (strata_tokens){0};
    int rc = strata_chat_open(chat, s->bpe, f);
    if (!rc) {
        strata_chat_begin(chat, t);
        rc = system && strata_chat_message(chat, t, "system", system, strlen(system), 0, "the default system message");
    }
    free(system);
    if (rc) {
        say("--chat: %s\n", strata_error());
        strata_tokens_free(t);
        return STRATA_EXIT_USAGE;
    }
    return 0;
}

/* --chat: the prompt as a user's message after the conversation's start (chat_start), then
 * the assistant's header; the generation stops at the end of the assistant's turn. Returns
 * an exit code. */
static int chat_prompt(sample_run *s, const char *prompt, const char *given_system, int hf) {
    strata_chat chat;
    strata_tokens t;
    int rc = chat_start(s, given_system, hf, &chat, &t);
    if (rc) return rc;
    s->n_hidden = chat.bos >= 0 ? 1 : 0; /* the BOS */
    if (strata_chat_message(&chat, &t, "user", prompt, strlen(prompt), 0, "--prompt") ||
        strata_chat_generation_prompt(&chat, &t)) {
        say("--chat: %s\n", strata_error());
        strata_tokens_free(&t);
        return STRATA_EXIT_USAGE;
    }
    s->prompt_ids = t.ids;
    s->n_prompt = t.n;
    s->stop_id = strata_chat_turn_end(&chat);
    free(t.mask);
    return 0;
}

/* An empty prompt on a GPT-2 vocabulary starts, as GPT-2 does, from <|endoftext|>, which
 * is not part of the text. */
static void start_token(sample_run *s, int vocab_size) {
    int eot = s->bpe ? strata_bpe_special_id(s->bpe, "<|endoftext|>") : -1;
    if (s->n_prompt == 0 && eot >= 0 && eot < vocab_size) {
        s->prompt_ids = strata_xrealloc(s->prompt_ids, sizeof *s->prompt_ids);
        s->prompt_ids[s->n_prompt++] = eot;
        s->n_hidden = 1;
    }
}

/* The model's weights for a window of T tokens, said on stderr (stdout is the text alone).
 * 0, or -1 with the error printed. */
static int load(strata_infer *inf, const sample_args *sa, const strata_config *cfg, strata_ckpt *ck, int T) {
    strata_infer_batch batch = STRATA_INFER_SAMPLING(T);
    if (strata_infer_open_weights(inf, cfg, ck, &batch, (strata_weights_home)sa->weights)) {
        say("%s%s\n", strata_error(),
                cfg->device != STRATA_BACKEND_CPU && !strata_cuda_available() ? " (--device cpu samples on the CPU)" : "");
        return -1;
    }
    char held[sizeof inf->from + 512];
    strata_infer_describe(inf, held, sizeof held);
    fprintf(stderr, "[sample] %s\n", held);
    return 0;
}

/* The model, then the prompt and each token as it is drawn, on stdout: nothing waits for
 * the end. Returns an exit code, the error printed. */
static int generate(const sample_run *s, const sample_args *sa, const strata_config *cfg, strata_ckpt *ck, int T) {
    strata_infer inf;
    if (load(&inf, sa, cfg, ck, T)) return STRATA_EXIT_ERROR;
    strata_rng rng;
    strata_rng_seed(&rng, sa->seed);
    strata_text_out out;
    strata_text_out_init(&out, stdout, cfg->model.vocab_size, s->have_tk ? &s->tk : NULL, s->bpe);
    int echoed = 1;
    for (size_t i = s->n_hidden; echoed && i < s->n_prompt; i++)
        if (strata_text_out_put(&out, s->prompt_ids[i])) {
            strata_fail("writing the generated text failed"); /* as strata_generate says it */
            echoed = 0;
        }
    out.stop_id = s->stop_id; /* set after the echo: a prompt's own turn ends do not stop it */
    int rc = STRATA_EXIT_ERROR;
    if (!echoed || strata_generate(&inf.m, s->prompt_ids, (int)s->n_prompt, sa->n_tokens, (float)sa->temperature,
                                   sa->top_k, &rng, strata_text_out_put, &out)) {
        strata_text_out_finish(&out);
        say("%s\n", strata_error());
    } else {
        strata_text_out_finish(&out);
        fputc('\n', stdout);
        rc = STRATA_EXIT_OK;
    }
    strata_infer_close(&inf);
    return rc;
}

/* ---- --prompts FILE: a completion for each prompt of a JSONL file ---- */

/* One prompt of the file: its ids, and where it came from. */
typedef struct file_prompt {
    int32_t *ids;
    size_t n, line;
    char *text;
} file_prompt;

/* A completion's sink: each token to the text but the chat turn's end, which ends it unwritten. */
typedef struct completion_sink {
    strata_text_out out;
    int32_t stop_id;
    size_t tokens;
    int stopped;
} completion_sink;
static int completion_put(void *ctx, int32_t id) {
    completion_sink *c = ctx;
    if (id == c->stop_id) return c->stopped = 1, STRATA_TOKEN_STOP;
    c->tokens++;
    return strata_text_out_put(&c->out, id);
}

/* The file's prompts as ids: each non-blank line an object with "prompt" (text; with --chat
 * the user's message) and, with --chat, "system" if it likes. Every line is read and
 * encoded before the model loads, so a bad one costs nothing. Returns an exit code. */
static int read_prompts(sample_run *s, const sample_args *sa, int V, int hf, file_prompt **out, size_t *n_out) {
    char *buf = NULL;
    size_t len = 0, n = 0, cap = 0;
    if (strata_read_file_bounded(sa->prompts, STRATA_TEXT_MAX_BYTES, &buf, &len)) {
        say("--prompts: %s\n", strata_error());
        return STRATA_EXIT_USAGE;
    }
    file_prompt *p = NULL;
    int rc = 0;
    size_t line = 0;
    for (char *at = buf; !rc && at < buf + len; line++) {
        char *nl = memchr(at, '\n', (size_t)(buf + len - at)), *end = nl ? nl : buf + len;
        char *start = at;
        at = end + 1;
        if (strspn(start, " \t\r") >= (size_t)(end - start)) continue; /* blank */
        char name[STRATA_PATH_MAX + 32];
        snprintf(name, sizeof name, "%s:%zu", sa->prompts, line + 1);
        strata_json_doc doc;
        if (strata_json_parse(&doc, start, (size_t)(end - start), name)) {
            say("--prompts: %s\n", strata_error());
            rc = STRATA_EXIT_USAGE;
            break;
        }
        const strata_json *pr = strata_json_get(&doc.root, "prompt"), *sys = strata_json_get(&doc.root, "system");
        if (!pr || pr->type != STRATA_JSON_STRING || (sys && (sys->type != STRATA_JSON_STRING || !sa->chat))) {
            say("--prompts: %s: %s\n", name,
                    !pr ? "no \"prompt\" (each line is an object with \"prompt\": the text)"
                    : pr->type != STRATA_JSON_STRING ? "\"prompt\" is no string"
                    : sys->type != STRATA_JSON_STRING ? "\"system\" is no string"
                                                      : "\"system\" goes with --chat");
            strata_json_free(&doc);
            rc = STRATA_EXIT_USAGE;
            break;
        }
        free(s->prompt_ids);
        s->prompt_ids = NULL;
        s->n_prompt = s->n_hidden = 0;
        rc = sa->chat ? chat_prompt(s, pr->str, sys ? sys->str : sa->system, hf) : encode_prompt(s, pr->str, V);
        if (!rc) rc = check_prompt(s, V);
        if (!rc) {
            start_token(s, V);
            if (n == cap) p = strata_xrealloc(p, (cap = cap ? 2 * cap : 64) * sizeof *p);
            p[n++] = (file_prompt){.ids = s->prompt_ids, .n = s->n_prompt, .line = line + 1,
                                   .text = strata_xstrdup(pr->str)};
            s->prompt_ids = NULL;
        } else {
            say("(the prompt of %s)\n", name);
        }
        strata_json_free(&doc);
    }
    free(buf);
    if (!rc && n == 0) {
        say("--prompts: %s holds no prompt\n", sa->prompts);
        rc = STRATA_EXIT_USAGE;
    }
    *out = p;
    *n_out = n;
    return rc;
}

/* A line of JSON for each prompt of the file, in its order: {"prompt", "completion" (the
 * generated text; with --chat up to the turn's end, which it leaves out), "tokens",
 * "stopped" (the turn ended before --tokens)}. Returns an exit code. */
static int generate_file(sample_run *s, const sample_args *sa, const strata_config *cfg, strata_ckpt *ck, int T, int hf) {
    file_prompt *p = NULL;
    size_t n = 0;
    int V = cfg->model.vocab_size;
    int rc = read_prompts(s, sa, V, hf, &p, &n), loaded = 0;
    strata_infer inf;
    if (!rc && !(loaded = load(&inf, sa, cfg, ck, T) == 0)) rc = STRATA_EXIT_ERROR;
    strata_rng rng;
    strata_rng_seed(&rng, sa->seed);
    for (size_t i = 0; i < n && !rc; i++) {
        char *text = NULL;
        size_t text_len = 0;
        FILE *mem = open_memstream(&text, &text_len);
        completion_sink c = {.stop_id = s->stop_id};
        strata_text_out_init(&c.out, mem, V, s->have_tk ? &s->tk : NULL, s->bpe);
        int bad = strata_generate(&inf.m, p[i].ids, (int)p[i].n, sa->n_tokens, (float)sa->temperature, sa->top_k, &rng,
                                  completion_put, &c);
        strata_text_out_finish(&c.out);
        fclose(mem);
        if (bad) {
            say("--prompts line %zu: %s\n", p[i].line, strata_error());
            rc = STRATA_EXIT_ERROR;
        } else {
            fputs("{\"prompt\": ", stdout);
            strata_json_write_string(stdout, p[i].text, strlen(p[i].text));
            fputs(", \"completion\": ", stdout);
            strata_json_write_string(stdout, text, text_len);
            printf(", \"tokens\": %zu, \"stopped\": %s}\n", c.tokens, c.stopped ? "true" : "false");
            if (fflush(stdout) || ferror(stdout)) {
                say("writing the completions failed\n");
                rc = STRATA_EXIT_ERROR;
            }
        }
        free(text);
    }
    for (size_t i = 0; i < n; i++) {
        free(p[i].ids);
        free(p[i].text);
    }
    free(p);
    if (loaded) strata_infer_close(&inf);
    return rc;
}

/* The model to sample (a checkpoint's or a Hugging Face model's weights, launcher/infer.h:
 * whatever world, stage and offload saved it) and the window, *T: --context, else the
 * model's context up to SAMPLE_DEFAULT_CONTEXT. Returns an exit code, the error printed. */
static int open_for_sampling(const sample_args *sa, strata_opened_ckpt *o, int *T) {
    int rc = strata_open_model(cmd_name, sa->what, sa->device, o);
    if (rc) return rc;
    *T = o->cfg.model.seq_len;
    if (sa->context > *T) {
        say("--context %d is more than the model's context, %d tokens (model.seq_len)\n", sa->context, *T);
        strata_ckpt_close(o->ck);
        return STRATA_EXIT_USAGE;
    }
    *T = sa->context ? sa->context : *T < SAMPLE_DEFAULT_CONTEXT ? *T : SAMPLE_DEFAULT_CONTEXT;
    return 0;
}

int strata_cmd_sample(int argc, char **argv) {
    sample_args sa;
    cmd_name = "sample";
    int rc = parse_args(argc, argv, &sa, 0), T = 0;
    strata_opened_ckpt o;
    if (rc || (rc = open_for_sampling(&sa, &o, &T))) return rc;
    int hf = o.ck == NULL, V = o.cfg.model.vocab_size;
    sample_run s = {.stop_id = -1};
    if (!(rc = open_tokenizer(&s, sa.tok_path, o.dir, hf)) && sa.prompts) {
        rc = generate_file(&s, &sa, &o.cfg, o.ck, T, hf);
    } else if (!rc && !(rc = sa.chat ? chat_prompt(&s, sa.prompt, sa.system, hf) : encode_prompt(&s, sa.prompt, V)) &&
               !(rc = check_prompt(&s, V))) {
        start_token(&s, V);
        rc = generate(&s, &sa, &o.cfg, o.ck, T);
    }
    sample_run_free(&s);
    strata_ckpt_close(o.ck);
    return rc;
}

/* ---- strata chat: a conversation, the user's messages from stdin ---- */

/* A reply's sink: each token into the conversation, and as text to stdout but the turn's
 * end, which ends the reply unwritten. */
typedef struct reply_sink {
    strata_text_out out;
    strata_tokens *conv;
    int32_t stop_id;
    int ended;
} reply_sink;
static int reply_put(void *ctx, int32_t id) {
    reply_sink *r = ctx;
    strata_tokens_push(r->conv, id, 0);
    if (id == r->stop_id) return r->ended = 1, STRATA_TOKEN_STOP;
    return strata_text_out_put(&r->out, id);
}

/* Each line of stdin a user's message, each answered on a line of stdout; the conversation
 * so far is the prompt of the next reply, its tokens already in the model's cache. */
static int converse(sample_run *s, const sample_args *sa, strata_infer *inf, strata_chat *chat, strata_tokens *conv) {
    int V = inf->m.shape.vocab_size, tty = isatty(STDIN_FILENO), rc = 0;
    strata_rng rng;
    strata_rng_seed(&rng, sa->seed);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    for (size_t turn = 1; !rc; turn++) {
        if (tty) fputs("> ", stderr);
        if ((len = getline(&line, &cap, stdin)) < 0) break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (strspn(line, " \t") == (size_t)len) continue; /* nothing said */
        char name[64];
        snprintf(name, sizeof name, "the message of line %zu", turn);
        size_t before = conv->n;
        if (strata_chat_message(chat, conv, "user", line, (size_t)len, 0, name) ||
            strata_chat_generation_prompt(chat, conv)) {
            say("%s\n", strata_error());
            rc = STRATA_EXIT_USAGE;
            break;
        }
        for (size_t i = before; i < conv->n && !rc; i++)
            if (conv->ids[i] >= V) {
                say("%s: token %d is outside the model's vocabulary of %d\n", name, conv->ids[i], V);
                rc = STRATA_EXIT_USAGE;
            }
        if (rc) break;
        reply_sink r = {.conv = conv, .stop_id = strata_chat_turn_end(chat)};
        strata_text_out_init(&r.out, stdout, V, NULL, s->bpe);
        int bad = strata_generate(&inf->m, conv->ids, (int)conv->n, sa->n_tokens, (float)sa->temperature, sa->top_k,
                                  &rng, reply_put, &r);
        strata_text_out_finish(&r.out);
        fputc('\n', stdout);
        if (bad || fflush(stdout) || ferror(stdout)) {
            say("%s\n", bad ? strata_error() : "writing the reply failed");
            rc = STRATA_EXIT_ERROR;
        } else if (strata_chat_reply_end(chat, conv, r.ended)) {
            say("%s\n", strata_error());
            rc = STRATA_EXIT_ERROR;
        }
    }
    free(line);
    return rc;
}

int strata_cmd_chat(int argc, char **argv) {
    sample_args sa;
    cmd_name = "chat";
    int rc = parse_args(argc, argv, &sa, 1), T = 0;
    strata_opened_ckpt o;
    if (rc || (rc = open_for_sampling(&sa, &o, &T))) return rc;
    int hf = o.ck == NULL;
    sample_run s = {.stop_id = -1};
    strata_chat chat;
    strata_tokens conv = {0};
    strata_infer inf;
    if (!(rc = open_tokenizer(&s, sa.tok_path, o.dir, hf)) && !(rc = chat_start(&s, sa.system, hf, &chat, &conv))) {
        if (load(&inf, &sa, &o.cfg, o.ck, T)) rc = STRATA_EXIT_ERROR;
        else {
            rc = converse(&s, &sa, &inf, &chat, &conv);
            strata_infer_close(&inf);
        }
    }
    strata_tokens_free(&conv);
    sample_run_free(&s);
    strata_ckpt_close(o.ck);
    return rc;
}
