/* tests/fuzz/planted/planted.c: a target with bugs planted on purpose, for the driver's
 * own test (tests/fuzz/planted/check_driver.sh): an input starting with one of the
 * words below does what the word says (REFUSE: not accepted, for the valid-* check). The mutation loop has to turn a seed into one,
 * and report it with a reproducer. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../fuzz.h"

static int starts(const uint8_t *data, size_t size, const char *word) {
    size_t n = strlen(word);
    return size >= n && !memcmp(data, word, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (starts(data, size, "REFUSE")) return 0; /* survived, not accepted */
    if (starts(data, size, "OVERFLOW")) {
        char *p = malloc(size);
        memcpy(p, data, size);
        volatile char c = p[size]; /* one byte past the allocation */
        (void)c;
        free(p);
    } else if (starts(data, size, "LEAKLEAK")) {
        char *p = malloc(64);
        memcpy(p, data, 8);
        p = NULL; /* the only pointer is gone */
    } else if (starts(data, size, "HANGHANG")) {
        for (volatile int spin = 1; spin;) {
        }
    } else if (starts(data, size, "ABORTNOW")) {
        abort();
    } else if (starts(data, size, "EXITEXIT")) {
        exit(3);
    }
    fuzz_accepted = 1;
    return 0;
}
