/* tests/test_layers.c: no include climbs a layer, and no files of one layer include each
 * other in a loop (docs/architecture.md).
 *
 * Every `#include "folder/..."` in core/, io/, shard/, offload/ and launcher/ (subfolders
 * too) names a layer that the including layer may see: core only core (one rank's compute
 * knows no file format); io core and io; shard and offload core, io and their own (never
 * each other: the engine reaches offload only through core/update_tier.h); launcher any.
 * The build enforces the same rule through each layer library's include root
 * (CMakeLists.txt); this check says which line broke it.
 *
 * Within a layer, a file's module is its path without the extension (io/config.c and
 * io/config.h are one module); module A uses B when either of A's files includes B's
 * header. The uses must form no cycle, so every layer reads bottom up.
 *
 * Both checks first prove they find what they look for in a planted tree, so a clean
 * result means clean. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/check.h"

static const char *const layers[] = {"core", "io", "shard", "offload", "launcher"};
enum { N_LAYERS = 5 };
/* may[i][j]: layer i may include layer j's headers */
static const int may[N_LAYERS][N_LAYERS] = {
    {1, 0, 0, 0, 0}, /* core */
    {1, 1, 0, 0, 0}, /* io */
    {1, 1, 1, 0, 0}, /* shard */
    {1, 1, 0, 1, 0}, /* offload */
    {1, 1, 1, 1, 1}, /* launcher */
};

enum { MAX_MODULES = 256, MODULE_NAME = 160 };

/* The modules of one layer and which uses which (uses[a][b]: a includes b's header). */
typedef struct module_graph {
    int n;
    char name[MAX_MODULES][MODULE_NAME];
    unsigned char uses[MAX_MODULES][MAX_MODULES];
} module_graph;

typedef struct scan {
    int files;
    int violations;
    char first[2400]; /* the first violation, for messages */
    module_graph *g;  /* the layer's own includes */
} scan;

/* The module of a path: the path without its extension (n bytes of it). */
static int module_of(module_graph *g, const char *path, size_t n) {
    const char *dot = memrchr(path, '.', n);
    if (dot) n = (size_t)(dot - path);
    if (n >= MODULE_NAME) n = MODULE_NAME - 1;
    for (int i = 0; i < g->n; i++)
        if (strlen(g->name[i]) == n && !strncmp(g->name[i], path, n)) return i;
    if (g->n == MAX_MODULES) return -1;
    memcpy(g->name[g->n], path, n);
    g->name[g->n][n] = 0;
    return g->n++;
}

static int layer_index(const char *name, size_t n) {
    for (int i = 0; i < N_LAYERS; i++)
        if (strlen(layers[i]) == n && !strncmp(layers[i], name, n)) return i;
    return -1;
}

static int is_source(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (!strcmp(dot, ".c") || !strcmp(dot, ".h") || !strcmp(dot, ".cu") || !strcmp(dot, ".cuh"));
}

/* Checks one file of layer `from`; rel is its path for messages. */
static void scan_file(const char *path, const char *rel, int from, scan *s) {
    FILE *f = fopen(path, "r");
    if (!f) {
        s->violations++;
        snprintf(s->first, sizeof s->first, "%s: cannot read: %s", rel, strerror(errno));
        return;
    }
    s->files++;
    char line[1024];
    for (int no = 1; fgets(line, sizeof line, f); no++) {
        const char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p++ != '#') continue;
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, "include", 7)) continue;
        p += 7;
        while (*p == ' ' || *p == '\t') p++;
        if (*p++ != '"') continue; /* <system> headers are not layers */
        const char *slash = strchr(p, '/'), *end = strchr(p, '"');
        if (!end || !slash || slash > end) continue; /* "x.h": the including file's own folder */
        int to = layer_index(p, (size_t)(slash - p));
        if (to == from) {
            int a = module_of(s->g, rel, strlen(rel)), b = module_of(s->g, p, (size_t)(end - p));
            if (a >= 0 && b >= 0 && a != b) s->g->uses[a][b] = 1;
        }
        if (to >= 0 && may[from][to]) continue;
        if (!s->violations++) {
            char allowed[64] = "";
            for (int l = 0; l < N_LAYERS; l++)
                if (may[from][l]) snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s%s",
                                           allowed[0] ? ", " : "", layers[l]);
            snprintf(s->first, sizeof s->first, "%s:%d includes \"%.*s\": %s may include %s only", rel, no,
                     (int)(end - p), p, layers[from], allowed);
        }
        printf("  %s:%d: #include \"%.*s\" climbs out of %s\n", rel, no, (int)(end - p), p, layers[from]);
    }
    fclose(f);
}

static void scan_dir(const char *dir, const char *rel, int from, scan *s) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.') continue;
        char path[1024], sub[1024];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        snprintf(sub, sizeof sub, "%s/%s", rel, ent->d_name);
        struct stat st;
        if (stat(path, &st)) continue;
        if (S_ISDIR(st.st_mode)) scan_dir(path, sub, from, s);
        else if (is_source(ent->d_name)) scan_file(path, sub, from, s);
    }
    closedir(d);
}

static scan scan_tree(const char *root, int layer, module_graph *g) {
    scan s = {0};
    memset(g, 0, sizeof *g);
    s.g = g;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, layers[layer]);
    scan_dir(dir, layers[layer], layer, &s);
    return s;
}

/* Depth-first search for a cycle of uses; on finding one, writes it ("io/a -> io/b ->
 * io/a") into out and returns 1. state: 0 unseen, 1 on the current path, 2 done. */
static int find_cycle_from(const module_graph *g, int m, unsigned char *state, int *path, int depth, char *out,
                           size_t n) {
    state[m] = 1;
    path[depth] = m;
    for (int k = 0; k < g->n; k++) {
        if (!g->uses[m][k]) continue;
        if (state[k] == 1) {
            size_t o = 0;
            int start = depth;
            while (path[start] != k) start--;
            for (int i = start; i <= depth && o < n; i++) o += (size_t)snprintf(out + o, n - o, "%s -> ", g->name[path[i]]);
            if (o < n) snprintf(out + o, n - o, "%s", g->name[k]);
            return 1;
        }
        if (!state[k] && find_cycle_from(g, k, state, path, depth + 1, out, n)) return 1;
    }
    state[m] = 2;
    return 0;
}

static int find_cycle(const module_graph *g, char *out, size_t n) {
    unsigned char state[MAX_MODULES] = {0};
    int path[MAX_MODULES];
    for (int m = 0; m < g->n; m++)
        if (!state[m] && find_cycle_from(g, m, state, path, 0, out, n)) return 1;
    return 0;
}

static void plant(const char *root, const char *rel, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    char *slash = strrchr(path, '/');
    *slash = 0;
    mkdir(path, 0755);
    *slash = '/';
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void remove_tree(const char *root) {
    static const char *const rm[] = {"core/a.c", "core/cpu/k.c", "core/cpu", "core", "io/a.h", "io/b.h", "io/b.c",
                                     "io/c.c", "io", "shard/e.c", "shard", "offload/p.h", "offload", "launcher/t.c",
                                     "launcher"};
    for (size_t i = 0; i < sizeof rm / sizeof rm[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", root, rm[i]);
        remove(path);
    }
    rmdir(root);
}

/* A tree with one upward include per layer below launcher, allowed includes around them,
 * and in io/ a loop of two modules (a uses b, b uses a) beside a module that only uses. */
static void test_planted(void) {
    char root[] = "/tmp/strata-test-layers-XXXXXX";
    if (!mkdtemp(root)) {
        CHECK(0, "cannot make a scratch tree: %s", strerror(errno));
        return;
    }
    plant(root, "core/a.c", "#include \"core/b.h\"\n#include <stdio.h>\n#include \"b.h\"\n");
    plant(root, "core/cpu/k.c", "#include \"core/a.h\"\n  #  include \"io/config.h\"\n");
    plant(root, "io/a.h", "#include \"core/a.h\"\n#include \"io/b.h\"\n");
    plant(root, "io/b.h", "#include \"core/a.h\"\n");
    plant(root, "io/b.c", "#include \"io/b.h\"\n#include \"io/a.h\"\n#include \"shard/engine.h\"\n");
    plant(root, "io/c.c", "#include \"io/a.h\"\n#include \"io/b.h\"\n");
    plant(root, "shard/e.c", "#include \"core/a.h\"\n#include \"io/a.h\"\n// #include \"offload/x.h\"\n"
                             "#include \"offload/pipeline.h\"\n");
    plant(root, "offload/p.h", "#include \"core/update_tier.h\"\n#include \"io/a.h\"\n#include \"shard/engine.h\"\n");
    plant(root, "launcher/t.c", "#include \"core/a.h\"\n#include \"io/a.h\"\n#include \"shard/e.h\"\n"
                                "#include \"offload/p.h\"\n#include \"launcher/t.h\"\n");
    int want[N_LAYERS] = {1, 1, 1, 1, 0}, files[N_LAYERS] = {2, 4, 1, 1, 1}, loops[N_LAYERS] = {0, 1, 0, 0, 0};
    static module_graph g;
    for (int l = 0; l < N_LAYERS; l++) {
        scan s = scan_tree(root, l, &g);
        CHECK(s.violations == want[l] && s.files == files[l], "planted %s: %d upward include(s) in %d file(s) found (%s)",
              layers[l], s.violations, s.files, s.violations ? s.first : "none");
        char cycle[1024] = "";
        int found = find_cycle(&g, cycle, sizeof cycle);
        CHECK(found == loops[l] && (!found || !strcmp(cycle, "io/a -> io/b -> io/a")),
              "planted %s: %s", layers[l], found ? cycle : "no loop found");
    }
    remove_tree(root);
}

int main(void) {
    const char *src = getenv("STRATA_SOURCE_DIR");
    if (!src) {
        printf("FAIL: STRATA_SOURCE_DIR is not set (ctest sets it to the source tree)\n");
        return 1;
    }
    test_planted();
    static module_graph g;
    for (int l = 0; l < N_LAYERS; l++) {
        scan s = scan_tree(src, l, &g);
        CHECK(s.files > 0 && s.violations == 0, "%s: %d files, %d include(s) climbing a layer%s%s", layers[l], s.files,
              s.violations, s.violations ? ", the first: " : "", s.violations ? s.first : "");
        char cycle[1024] = "";
        int found = find_cycle(&g, cycle, sizeof cycle);
        CHECK(!found, "%s: %d modules, no loop of includes between them%s%s", layers[l], g.n, found ? ": " : "",
              cycle);
    }
    return check_report();
}
