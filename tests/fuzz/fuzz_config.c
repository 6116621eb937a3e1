/* tests/fuzz/fuzz_config.c: the config loader (io/config.c): YAML text to a validated
 * strata_config, the `base:` file it may build on, and `--set` overrides.
 *
 * Input: up to three parts joined by NUL bytes (fuzz.h): the config file; base.yaml
 * beside it (what `base: base.yaml` reads; the built-in quickstart.yaml is there too);
 * `--set` lines, one per line. Checked beyond "no crash": an accepted config written out
 * by strata_config_write loads back and writes the same text (the round trip the
 * `strata config` command promises). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/config.h"
#include "fuzz.h"

enum { MAX_SETS = 8 };

static char *config_text(const strata_config *c, size_t *len) {
    char *text = strata_config_yaml(c, 0);
    if (!text) fuzz_violation("a loaded config does not write as YAML: %s", strata_error());
    *len = strlen(text);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        const char *builtin = strata_config_builtin_yaml();
        fuzz_write("quickstart.yaml", builtin, strlen(builtin));
        ready = 1;
    }
    fuzz_part part[3];
    size_t n = fuzz_split(data, size, part, 3);
    const char *path = fuzz_write("config.yaml", part[0].data, part[0].len);
    if (n > 1) fuzz_write("base.yaml", part[1].data, part[1].len);
    else fuzz_remove("base.yaml");

    /* the third part's lines, as --set arguments */
    char *sets_text = NULL;
    const char *sets[MAX_SETS];
    int n_sets = 0;
    if (n > 2) {
        sets_text = malloc(part[2].len + 1);
        if (!sets_text) abort();
        memcpy(sets_text, part[2].data, part[2].len);
        sets_text[part[2].len] = 0; /* a NUL inside ends the last line early, like argv would */
        for (char *line = sets_text, *next; line && n_sets < MAX_SETS; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = 0;
            if (*line) sets[n_sets++] = line;
        }
    }

    strata_config c;
    int ok = strata_config_load(&c, path, sets, n_sets) == 0;
    free(sets_text);
    if (!ok) return 0;
    if (strata_config_check(&c, path)) fuzz_violation("a loaded config fails its own checks: %s", strata_error());

    size_t len1, len2;
    char *text1 = config_text(&c, &len1);
    strata_config back;
    if (strata_config_load_string(&back, path, text1, NULL, 0))
        fuzz_violation("strata_config_write's output does not load back: %s\n--- written:\n%s", strata_error(), text1);
    char *text2 = config_text(&back, &len2);
    if (len1 != len2 || memcmp(text1, text2, len1))
        fuzz_violation("the config does not survive a write and load:\n--- first:\n%s--- then:\n%s", text1, text2);
    free(text2);

    /* a rejected override leaves the config as it was */
    if (strata_config_set(&c, "train.micro_batch=-1") == 0) fuzz_violation("train.micro_batch=-1 was accepted");
    text2 = config_text(&c, &len2);
    if (len1 != len2 || memcmp(text1, text2, len1)) fuzz_violation("a rejected --set changed the config");
    free(text1);
    free(text2);
    fuzz_accepted = 1;
    return 0;
}
