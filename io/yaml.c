/* io/yaml.c: the one libyaml reader, its typed accessors, and YAML scalars written to
 * read back exactly (io/yaml.h). */
#include "io/yaml.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/files.h"

/* ---- loading one document ---- */

int strata_yaml_line(const yaml_node_t *n) { return (int)n->start_mark.line + 1; }

static int yaml_problem(const yaml_parser_t *p, const char *name) {
    const char *problem = p->problem ? p->problem : "unknown error";
    if (p->error == YAML_READER_ERROR)
        return strata_fail("%s: invalid YAML: %s at byte %zu", name, problem, p->problem_offset);
    if (p->error == YAML_MEMORY_ERROR) return strata_fail("%s: invalid YAML: out of memory", name);
    char context[160] = "";
    if (p->context) snprintf(context, sizeof context, " (%s)", p->context);
    return strata_fail("%s:%zu:%zu: invalid YAML: %s%s", name, p->problem_mark.line + 1, p->problem_mark.column + 1,
                       problem, context);
}

/* a quoted "\0" would end the C string early and cut a key or value short unseen */
static int nul_free(const yaml_document_t *doc, const char *name) {
    for (yaml_node_t *n = doc->nodes.start; n < doc->nodes.top; n++)
        if (n->type == YAML_SCALAR_NODE && strlen((const char *)n->data.scalar.value) != n->data.scalar.length)
            return strata_fail("%s:%d: '%s...' holds a NUL byte, which no key or value may", name, strata_yaml_line(n),
                               (const char *)n->data.scalar.value);
    return 0;
}

int strata_yaml_load(yaml_document_t *doc, const char *name, const char *text, size_t len, const char *one_what) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return strata_fail("%s: cannot start the YAML parser", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int rc = 0;
    if (!yaml_parser_load(&parser, doc)) {
        rc = yaml_problem(&parser, name);
        yaml_parser_delete(&parser);
        return rc;
    }
    rc = nul_free(doc, name);
    /* a second `---` document would be silently ignored: refuse it instead */
    yaml_document_t next;
    if (!rc && !yaml_parser_load(&parser, &next)) {
        rc = yaml_problem(&parser, name);
    } else if (!rc) {
        if (yaml_document_get_root_node(&next))
            rc = strata_fail("%s:%d: a second YAML document starts here; %s is one document", name,
                             (int)next.start_mark.line + 1, one_what);
        yaml_document_delete(&next);
    }
    yaml_parser_delete(&parser);
    if (rc) yaml_document_delete(doc);
    return rc;
}

/* ---- writing ---- */

/* What YAML keeps as it is inside a scalar: tab, newline and the printable characters.
 * YAML turns CR and NEL, LS, PS into line breaks, drops a BOM, and libyaml refuses other
 * control characters, C1 ones included. */
static int yaml_printable(uint32_t cp) {
    return cp == '\t' || cp == '\n' || (cp >= 0x20 && cp <= 0x7E) ||
           (cp >= 0xA0 && cp <= 0xFFFD && cp != 0x2028 && cp != 0x2029 && cp != 0xFEFF) || cp >= 0x10000;
}

int strata_yaml_quoted(strata_sbuf *b, const char *s, size_t n, const char *what) {
    size_t bad = strata_utf8_invalid_at(s, n);
    if (bad < n) return strata_fail("%s is not valid UTF-8 (byte %zu), so YAML cannot hold it", what, bad);
    strata_sbuf_putn(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t len = strata_utf8_decode(s + i, n - i, &cp);
        if (cp == '"') strata_sbuf_putn(b, "\\\"", 2);
        else if (cp == '\\') strata_sbuf_putn(b, "\\\\", 2);
        else if (cp == '\n') strata_sbuf_putn(b, "\\n", 2);
        else if (cp == '\t') strata_sbuf_putn(b, "\\t", 2);
        else if (cp == '\r') strata_sbuf_putn(b, "\\r", 2);
        else if (cp == 0x85) strata_sbuf_putn(b, "\\N", 2);
        else if (cp == 0x2028) strata_sbuf_putn(b, "\\L", 2);
        else if (cp == 0x2029) strata_sbuf_putn(b, "\\P", 2);
        else if (cp < 0x20 || cp == 0x7F) strata_sbuf_printf(b, "\\x%02X", (unsigned)cp);
        else if (yaml_printable(cp)) strata_sbuf_putn(b, s + i, len);
        else strata_sbuf_printf(b, "\\u%04X", (unsigned)cp); /* C1 controls, BOM, U+FFFE/FFFF */
        i += len;
    }
    strata_sbuf_putn(b, "\"", 1);
    return 0;
}

int strata_yaml_text_value(strata_sbuf *b, const char *key, const char *text, const char *what) {
    size_t n = strlen(text);
    int literal_ok = n > 0;
    for (size_t i = 0; i < n && literal_ok;) {
        uint32_t cp;
        size_t len = strata_utf8_decode(text + i, n - i, &cp);
        literal_ok = len > 0 && yaml_printable(cp);
        i += len ? len : 1;
    }
    if (!literal_ok) {
        strata_sbuf_printf(b, "%s: ", key);
        if (strata_yaml_quoted(b, text, n, what)) return -1;
        strata_sbuf_putn(b, "\n", 1);
        return 0;
    }
    strata_sbuf_printf(b, "%s: |2%c\n", key, text[n - 1] == '\n' ? '+' : '-');
    for (size_t pos = 0; pos < n;) {
        const char *nl = memchr(text + pos, '\n', n - pos);
        size_t end = nl ? (size_t)(nl - text) : n;
        if (end > pos) {
            strata_sbuf_putn(b, "  ", 2);
            strata_sbuf_putn(b, text + pos, end - pos);
        }
        strata_sbuf_putn(b, "\n", 1);
        pos = end + 1;
    }
    return 0;
}

/* ---- a loaded document ---- */

int strata_ydoc_parse(strata_ydoc *d, const char *path, const char *text, size_t len, const char *what) {
    d->path = path;
    if (strata_yaml_load(&d->doc, path, text, len, what)) return -1;
    yaml_node_t *root = yaml_document_get_root_node(&d->doc);
    if (!root || root->type != YAML_MAPPING_NODE) {
        yaml_document_delete(&d->doc);
        return strata_fail("%s: not %s (%s)", path, what, root ? "the top level is not a mapping" : "empty");
    }
    return 0;
}

int strata_ydoc_read(strata_ydoc *d, const char *path, size_t max_bytes, const char *what) {
    char *text;
    size_t len;
    if (strata_read_file_bounded(path, max_bytes, &text, &len)) return -1;
    int rc = strata_ydoc_parse(d, path, text, len, what);
    free(text);
    return rc;
}

void strata_ydoc_free(strata_ydoc *d) { yaml_document_delete(&d->doc); }

yaml_node_t *strata_ydoc_root(strata_ydoc *d) { return yaml_document_get_root_node(&d->doc); }

const char *strata_ydoc_scalar(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static const char *sep(const char *ctx) { return *ctx ? ": " : ""; }

int strata_ydoc_keys_known(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *const *known,
                           const char *why) {
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(&d->doc, pr->key);
        int ok = k && k->type == YAML_SCALAR_NODE;
        for (int i = 0; ok && known[i]; i++)
            if (strlen(known[i]) == k->data.scalar.length && !memcmp(known[i], k->data.scalar.value, k->data.scalar.length))
                ok = 2;
        if (ok != 2)
            return strata_fail("%s: line %zu: %s%sunknown key '%.60s' (%s)", d->path,
                               (k ? k->start_mark.line : map->start_mark.line) + 1, ctx, sep(ctx),
                               k && k->type == YAML_SCALAR_NODE ? strata_ydoc_scalar(k) : "?", why);
    }
    return 0;
}

static const char *type_name(yaml_node_type_t t) {
    return t == YAML_SCALAR_NODE ? "scalar" : t == YAML_SEQUENCE_NODE ? "list" : "mapping";
}

int strata_ydoc_has(strata_ydoc *d, yaml_node_t *map, const char *key) {
    size_t klen = strlen(key);
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(&d->doc, pr->key);
        if (k && k->type == YAML_SCALAR_NODE && k->data.scalar.length == klen &&
            !memcmp(k->data.scalar.value, key, klen))
            return 1;
    }
    return 0;
}

yaml_node_t *strata_ydoc_get(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key,
                             yaml_node_type_t type) {
    size_t klen = strlen(key);
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(&d->doc, pr->key);
        if (!k || k->type != YAML_SCALAR_NODE || k->data.scalar.length != klen ||
            memcmp(k->data.scalar.value, key, klen) != 0)
            continue;
        yaml_node_t *v = yaml_document_get_node(&d->doc, pr->value);
        if (v->type != type) {
            strata_fail("%s: line %zu: %s%skey '%s' should be a %s, found a %s", d->path, v->start_mark.line + 1, ctx,
                        sep(ctx), key, type_name(type), type_name(v->type));
            return NULL;
        }
        return v;
    }
    strata_fail("%s: line %zu: %s%smissing key '%s'", d->path, map->start_mark.line + 1, ctx, sep(ctx), key);
    return NULL;
}

int strata_ydoc_mapping(strata_ydoc *d, yaml_node_t *n, const char *ctx) {
    if (n->type != YAML_MAPPING_NODE)
        return strata_fail("%s: line %zu: %s should be a mapping", d->path, n->start_mark.line + 1, ctx);
    return 0;
}

int strata_parse_u64(const char *s, int base, uint64_t *out) {
    *out = 0;
    if (base == 16) {
        if (s[0] != '0' || (s[1] != 'x' && s[1] != 'X')) return -1;
        s += 2;
    }
    if (!*s) return -1;
    uint64_t v = 0;
    for (; *s; s++) {
        unsigned dg;
        if (*s >= '0' && *s <= '9') dg = (unsigned)(*s - '0');
        else if (base == 16 && *s >= 'a' && *s <= 'f') dg = (unsigned)(*s - 'a' + 10);
        else if (base == 16 && *s >= 'A' && *s <= 'F') dg = (unsigned)(*s - 'A' + 10);
        else return -1;
        if (v > (UINT64_MAX - dg) / (unsigned)base) return -1;
        v = v * (unsigned)base + dg;
    }
    *out = v;
    return 0;
}

int strata_ydoc_bad_value(strata_ydoc *d, const yaml_node_t *n, const char *ctx, const char *key, const char *want) {
    return strata_fail("%s: line %zu: %s%skey '%s': '%s' is not %s", d->path, n->start_mark.line + 1, ctx, sep(ctx), key,
                       strata_ydoc_scalar(n), want);
}

int strata_ydoc_u64(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key, int base, uint64_t max,
                    uint64_t *out) {
    yaml_node_t *n = strata_ydoc_get(d, map, ctx, key, YAML_SCALAR_NODE);
    if (!n) return -1;
    if (strata_parse_u64(strata_ydoc_scalar(n), base, out) != 0 || *out > max)
        return strata_ydoc_bad_value(d, n, ctx, key,
                                     base == 16 ? "a 0x-prefixed hex number" : "an unsigned integer in range");
    return 0;
}

int strata_ydoc_size(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key, size_t max, size_t *out) {
    uint64_t v;
    if (strata_ydoc_u64(d, map, ctx, key, 10, max, &v) != 0) return -1;
    *out = (size_t)v;
    return 0;
}

int strata_ydoc_int(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key, int *out) {
    uint64_t v;
    if (strata_ydoc_u64(d, map, ctx, key, 10, INT_MAX, &v) != 0) return -1;
    *out = (int)v;
    return 0;
}

int strata_ydoc_double(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key, double *out) {
    yaml_node_t *n = strata_ydoc_get(d, map, ctx, key, YAML_SCALAR_NODE);
    if (!n) return -1;
    char *end;
    errno = 0;
    *out = strtod(strata_ydoc_scalar(n), &end);
    if (end == strata_ydoc_scalar(n) || *end) return strata_ydoc_bad_value(d, n, ctx, key, "a number");
    return 0;
}

int strata_ydoc_expect(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key, const char *want) {
    yaml_node_t *n = strata_ydoc_get(d, map, ctx, key, YAML_SCALAR_NODE);
    if (!n) return -1;
    if (strcmp(strata_ydoc_scalar(n), want) != 0)
        return strata_fail("%s: line %zu: %s%skey '%s' is '%s', expected '%s'", d->path, n->start_mark.line + 1, ctx,
                           sep(ctx), key, strata_ydoc_scalar(n), want);
    return 0;
}
