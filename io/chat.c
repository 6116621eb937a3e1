/* io/chat.c: the chat formats (io/chat.h): their templates, written out as token ids and a
 * loss mask, and as the Jinja transformers runs. */
#include "io/chat.h"

#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/text.h"

/* Llama 3 Instruct's template, as its tokenizer_config.json has it (bos_token first, the
 * content trimmed), and Qwen's ChatML without the default system message. */
static const char llama3_template[] =
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt "
    "%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";
static const char chatml_template[] =
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

int strata_chat_format_parse(const char *name, strata_chat_format *f) {
    if (!strcmp(name, "llama3")) *f = STRATA_CHAT_LLAMA3;
    else if (!strcmp(name, "chatml")) *f = STRATA_CHAT_CHATML;
    else return strata_fail("chat format '%s' is not one Strata writes (llama3, chatml)", name);
    return 0;
}

const char *strata_chat_format_name(strata_chat_format f) {
    return f == STRATA_CHAT_LLAMA3 ? "llama3" : f == STRATA_CHAT_CHATML ? "chatml" : "none";
}

const char *strata_chat_template(strata_chat_format f) {
    return f == STRATA_CHAT_LLAMA3 ? llama3_template : f == STRATA_CHAT_CHATML ? chatml_template : NULL;
}

/* ---- a default system message ---- */

/* Each format's turn for a default system message, around the text as a Jinja string
 * literal, put where the template begins (after Llama 3's bos_token): a conversation whose
 * first message is not the system's gets it, as Qwen2.5's own template does. */
static const char llama3_bos[] = "{{- bos_token }}";
static const char system_if[] = "{%- if messages[0]['role'] != 'system' %}";
static const char llama3_system[2][100] = {"{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + '",
                                           "' | trim + '<|eot_id|>' }}{%- endif %}"};
static const char chatml_system[2][100] = {"{{- '<|im_start|>system\\n' + '", "' + '<|im_end|>' + '\\n' }}{%- endif %}"};

char *strata_chat_template_with(strata_chat_format f, const char *system) {
    const char *base = strata_chat_template(f);
    strata_sbuf b = {0};
    if (!base) return NULL;
    if (!system) {
        strata_sbuf_puts(&b, base);
        return b.p;
    }
    const char(*turn)[100] = f == STRATA_CHAT_LLAMA3 ? llama3_system : chatml_system;
    size_t skip = f == STRATA_CHAT_LLAMA3 ? strlen(llama3_bos) : 0;
    strata_sbuf_putn(&b, base, skip);
    strata_sbuf_puts(&b, system_if);
    strata_sbuf_puts(&b, turn[0]);
    for (const char *c = system; *c; c++) { /* a Jinja (Python) string literal in single quotes */
        if (*c == '\\' || *c == '\'') strata_sbuf_printf(&b, "\\%c", *c);
        else if (*c == '\n') strata_sbuf_puts(&b, "\\n");
        else if (*c == '\r') strata_sbuf_puts(&b, "\\r");
        else strata_sbuf_putn(&b, c, 1);
    }
    strata_sbuf_puts(&b, turn[1]);
    strata_sbuf_puts(&b, base + skip);
    return b.p;
}

/* The default system message of template t in format f, or NULL when t is not that
 * format's template with one (malloc'd): the literal read back, then the template made
 * again from it and compared whole, so nothing but Strata's own writing is taken. */
static char *system_of(const char *t, strata_chat_format f) {
    const char(*turn)[100] = f == STRATA_CHAT_LLAMA3 ? llama3_system : chatml_system;
    strata_sbuf head = {0};
    if (f == STRATA_CHAT_LLAMA3) strata_sbuf_puts(&head, llama3_bos);
    strata_sbuf_puts(&head, system_if);
    strata_sbuf_puts(&head, turn[0]);
    char *out = NULL;
    if (!strncmp(t, head.p, head.len)) {
        strata_sbuf s = {0};
        const char *c = t + head.len;
        for (; *c && *c != '\''; c++) { /* the literal, to its closing quote */
            if (*c == '\\' && c[1]) {
                c++;
                strata_sbuf_putn(&s, *c == 'n' ? "\n" : *c == 'r' ? "\r" : c, 1);
            } else {
                strata_sbuf_putn(&s, c, 1);
            }
        }
        out = s.p ? s.p : strata_xstrdup("");
        char *again = *c ? strata_chat_template_with(f, out) : NULL;
        if (!again || strcmp(again, t)) {
            free(out);
            out = NULL;
        }
        free(again);
    }
    strata_sbuf_free(&head);
    return out;
}

strata_chat_format strata_chat_format_system(const strata_bpe *tk, char **system) {
    const char *t = tk ? strata_bpe_chat_template(tk) : NULL;
    if (system) *system = NULL;
    if (!t) return STRATA_CHAT_NONE;
    if (!strcmp(t, llama3_template)) return STRATA_CHAT_LLAMA3;
    if (!strcmp(t, chatml_template)) return STRATA_CHAT_CHATML;
    for (strata_chat_format f = STRATA_CHAT_LLAMA3; f <= STRATA_CHAT_CHATML; f++) {
        char *s = system_of(t, f);
        if (!s) continue;
        if (system) *system = s;
        else free(s);
        return f;
    }
    return STRATA_CHAT_NONE;
}

strata_chat_format strata_chat_format_of(const strata_bpe *tk) { return strata_chat_format_system(tk, NULL); }

strata_chat_format strata_chat_format_detect(const strata_bpe *tk) {
    strata_chat_format f = strata_chat_format_of(tk);
    if (f != STRATA_CHAT_NONE) return f;
    int llama3 = strata_bpe_token_id(tk, "<|start_header_id|>") >= 0 && strata_bpe_token_id(tk, "<|end_header_id|>") >= 0 &&
                 strata_bpe_token_id(tk, "<|eot_id|>") >= 0;
    int chatml = strata_bpe_token_id(tk, "<|im_start|>") >= 0 && strata_bpe_token_id(tk, "<|im_end|>") >= 0;
    return llama3 == chatml ? STRATA_CHAT_NONE : llama3 ? STRATA_CHAT_LLAMA3 : STRATA_CHAT_CHATML;
}

/* ---- ids with a mask ---- */

void strata_tokens_push(strata_tokens *t, int32_t id, uint8_t learned) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->ids = strata_xrealloc(t->ids, t->cap * sizeof *t->ids);
        t->mask = strata_xrealloc(t->mask, t->cap);
    }
    t->ids[t->n] = id;
    t->mask[t->n++] = learned;
}

typedef struct push_ctx {
    strata_tokens *t;
    uint8_t learned;
} push_ctx;

static int push_ids(void *ctx, const int32_t *ids, size_t n) {
    push_ctx *p = ctx;
    for (size_t i = 0; i < n; i++) strata_tokens_push(p->t, ids[i], p->learned);
    return 0;
}

int strata_tokens_encode(strata_tokens *t, strata_bpe *tk, const char *text, size_t len, uint8_t learned,
                         const char *name) {
    push_ctx p = {t, learned};
    return strata_bpe_encode(tk, text, len, name, push_ids, &p);
}

void strata_tokens_free(strata_tokens *t) {
    free(t->ids);
    free(t->mask);
    *t = (strata_tokens){0};
}

/* ---- the formats ---- */

int strata_chat_open(strata_chat *c, strata_bpe *tk, strata_chat_format f) {
    *c = (strata_chat){.format = f, .tk = tk, .bos = -1, .start = -1, .end = -1, .turn_end = -1};
    static const char *const llama3[] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    static const char *const chatml[] = {NULL, "<|im_start|>", NULL, "<|im_end|>"};
    const char *const *names = f == STRATA_CHAT_LLAMA3 ? llama3 : chatml;
    int32_t *slots[4] = {&c->bos, &c->start, &c->end, &c->turn_end};
    char missing[256] = "";
    for (int i = 0; i < 4; i++) {
        if (!names[i]) continue;
        *slots[i] = strata_bpe_token_id(tk, names[i]);
        if (*slots[i] < 0) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? ", " : "", names[i]);
    }
    if (missing[0])
        return strata_fail("chat format %s needs the tokens %s, which tokenizer %s does not have (is it the tokenizer of a "
                           "model of that format?)", strata_chat_format_name(f), missing, strata_bpe_source(tk));
    return 0;
}

void strata_chat_begin(const strata_chat *c, strata_tokens *out) {
    if (c->bos >= 0) strata_tokens_push(out, c->bos, 0);
}

/* Python's str.isspace, what Jinja's trim strips: the characters of bidi class WS, B or S,
 * and the space separators. */
static int py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* s[0, *n) without the whitespace around it (valid UTF-8): returns the new start. */
static const char *trim(const char *s, size_t *n) {
    size_t a = 0, z = *n;
    uint32_t c;
    size_t len;
    while (a < z && (len = strata_utf8_decode(s + a, z - a, &c)) > 0 && py_space(c)) a += len;
    while (z > a) {
        size_t st = z - 1;
        while (st > a && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        if (strata_utf8_decode(s + st, z - st, &c) != z - st || !py_space(c)) break;
        z = st;
    }
    *n = z - a;
    return s + a;
}

int strata_chat_message(const strata_chat *c, strata_tokens *out, const char *role, const char *content, size_t len,
                        int learned, const char *name) {
    uint8_t l = learned ? 1 : 0;
    strata_tokens_push(out, c->start, 0);
    if (c->format == STRATA_CHAT_LLAMA3) {
        if (strata_tokens_encode(out, c->tk, role, strlen(role), 0, name)) return -1;
        strata_tokens_push(out, c->end, 0);
        if (strata_tokens_encode(out, c->tk, "\n\n", 2, 0, name)) return -1;
        content = trim(content, &len);
        if (strata_tokens_encode(out, c->tk, content, len, l, name)) return -1;
        strata_tokens_push(out, c->turn_end, l);
        return 0;
    }
    size_t rn = strlen(role);
    char *header = strata_xmalloc(rn + 2);
    memcpy(header, role, rn);
    header[rn] = '\n';
    header[rn + 1] = 0;
    int rc = strata_tokens_encode(out, c->tk, header, rn + 1, 0, name);
    free(header);
    if (rc) return -1; /* the encoder's message names the example */
    if (strata_tokens_encode(out, c->tk, content, len, l, name)) return -1;
    strata_tokens_push(out, c->turn_end, l);
    return strata_tokens_encode(out, c->tk, "\n", 1, 0, name);
}

int strata_chat_reply_end(const strata_chat *c, strata_tokens *out, int ended) {
    if (!ended) strata_tokens_push(out, c->turn_end, 0);
    if (c->format == STRATA_CHAT_LLAMA3) return 0;
    return strata_tokens_encode(out, c->tk, "\n", 1, 0, "the end of a reply");
}

int strata_chat_generation_prompt(const strata_chat *c, strata_tokens *out) {
    strata_tokens_push(out, c->start, 0);
    if (c->format == STRATA_CHAT_LLAMA3) {
        if (strata_tokens_encode(out, c->tk, "assistant", 9, 0, "the generation prompt")) return -1;
        strata_tokens_push(out, c->end, 0);
        return strata_tokens_encode(out, c->tk, "\n\n", 2, 0, "the generation prompt");
    }
    return strata_tokens_encode(out, c->tk, "assistant\n", 10, 0, "the generation prompt");
}

int32_t strata_chat_turn_end(const strata_chat *c) { return c->turn_end; }
