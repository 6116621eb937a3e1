/* tests/test_layers.c: no include climbs a layer (docs/architecture.md). Every
 * `#include "folder/..."` in core/, shard/, offload/ and launcher/ (subfolders too) names
 * a layer that the including layer may see: core only core; shard core and shard;
 * offload core and offload (never shard: the engine reaches offload only through
 * core/update_tier.h); launcher any. The build enforces the same rule through each
 * layer library's include root (CMakeLists.txt); this check says which line broke it.
 * It first proves it finds violations in a planted tree, so a clean result means clean. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/check.h"

static const char *const layers[] = {"core", "shard", "offload", "launcher"};
enum { N_LAYERS = 4 };
/* may[i][j]: layer i may include layer j's headers */
static const int may[N_LAYERS][N_LAYERS] = {
    {1, 0, 0, 0}, /* core */
    {1, 1, 0, 0}, /* shard */
    {1, 0, 1, 0}, /* offload */
    {1, 1, 1, 1}, /* launcher */
};

typedef struct scan {
    int files;
    int violations;
    char first[2400]; /* the first violation, for messages */
} scan;

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

static scan scan_tree(const char *root, int layer) {
    scan s = {0};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, layers[layer]);
    scan_dir(dir, layers[layer], layer, &s);
    return s;
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

/* A tree with one violation per lower layer and allowed includes around them. */
static void test_planted(void) {
    char root[] = "/tmp/strata-test-layers-XXXXXX";
    if (!mkdtemp(root)) {
        CHECK(0, "cannot make a scratch tree: %s", strerror(errno));
        return;
    }
    plant(root, "core/a.c", "#include \"core/b.h\"\n#include <stdio.h>\n#include \"b.h\"\n");
    plant(root, "core/cpu/k.c", "#include \"core/a.h\"\n  #  include \"shard/comm.h\"\n");
    plant(root, "shard/e.c", "#include \"core/a.h\"\n#include \"shard/e.h\"\n// #include \"offload/x.h\"\n"
                             "#include \"offload/pipeline.h\"\n");
    plant(root, "offload/p.h", "#include \"core/update_tier.h\"\n#include \"shard/engine.h\"\n");
    plant(root, "launcher/t.c", "#include \"core/a.h\"\n#include \"shard/e.h\"\n#include \"offload/p.h\"\n"
                                "#include \"launcher/t.h\"\n");
    int want[N_LAYERS] = {1, 1, 1, 0}, files[N_LAYERS] = {2, 1, 1, 1};
    for (int l = 0; l < N_LAYERS; l++) {
        scan s = scan_tree(root, l);
        CHECK(s.violations == want[l] && s.files == files[l], "planted %s: %d violation(s) in %d file(s) found (%s)",
              layers[l], s.violations, s.files, s.violations ? s.first : "none");
    }
    const char *rm[] = {"core/a.c", "core/cpu/k.c", "core/cpu", "core", "shard/e.c", "shard", "offload/p.h", "offload",
                        "launcher/t.c", "launcher"};
    for (size_t i = 0; i < sizeof rm / sizeof rm[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", root, rm[i]);
        remove(path);
    }
    rmdir(root);
}

int main(void) {
    const char *src = getenv("STRATA_SOURCE_DIR");
    if (!src) {
        printf("FAIL: STRATA_SOURCE_DIR is not set (ctest sets it to the source tree)\n");
        return 1;
    }
    test_planted();
    for (int l = 0; l < N_LAYERS; l++) {
        scan s = scan_tree(src, l);
        CHECK(s.files > 0 && s.violations == 0, "%s: %d files, %d include(s) climbing a layer%s%s", layers[l], s.files,
              s.violations, s.violations ? ", the first: " : "", s.violations ? s.first : "");
    }
    return check_report();
}
