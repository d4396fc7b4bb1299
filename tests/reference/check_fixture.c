/* check_fixture.c - compares what `smelt run --dump-logits` produced with a
 * PyTorch fixture (tests/reference/README.md):
 *
 *   check_fixture FIXTURE_DIR PRODUCED.npy PRODUCED_STDOUT [TOLERANCE]
 *
 * Passes when the logits have the fixture's shape, every row is within
 * TOLERANCE x (max - min of the fixture's logits) of the fixture's row, and
 * the tokens printed on the "tokens:" line start with the fixture's greedy
 * tokens (tokens.txt). TOLERANCE is docs/design.md §7's bound for the plan's
 * precision: 1e-4 (the default) for fp32, 2e-2 for bf16. Prints the worst
 * error found either way. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_TOKENS = 4096 };
static const double DEFAULT_TOLERANCE = 1e-4;

typedef struct array2d {
    uint64_t rows, cols;
    float *data;
} array2d;

static char *read_all(const char *path, size_t *length) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "check_fixture: cannot read '%s': %s\n", path, strerror(errno));
        return NULL;
    }
    size_t capacity = 1 << 16, n = 0, got;
    char *text = malloc(capacity + 1);
    while (text && (got = fread(text + n, 1, capacity - n, f)) > 0) {
        n += got;
        if (n == capacity) text = realloc(text, (capacity *= 2) + 1);
    }
    fclose(f);
    if (!text) return NULL;
    text[n] = '\0';
    *length = n;
    return text;
}

/* A little-endian float32, C-order, 2-D .npy (format 1.0 or 2.0). */
static int read_npy(const char *path, array2d *out) {
    size_t length;
    char *bytes = read_all(path, &length);
    if (!bytes) return 0;
    int ok = 0;
    if (length < 10 || memcmp(bytes, "\x93NUMPY", 6) != 0) {
        fprintf(stderr, "check_fixture: '%s' is not a .npy file\n", path);
        goto done;
    }
    size_t header_length, start;
    if (bytes[6] == 1) {
        header_length = (unsigned char)bytes[8] | (size_t)(unsigned char)bytes[9] << 8;
        start = 10;
    } else {
        header_length = (unsigned char)bytes[8] | (size_t)(unsigned char)bytes[9] << 8 |
                        (size_t)(unsigned char)bytes[10] << 16 | (size_t)(unsigned char)bytes[11] << 24;
        start = 12;
    }
    if (start + header_length > length) goto bad;
    char header[1024];
    if (header_length >= sizeof header) goto bad;
    memcpy(header, bytes + start, header_length);
    header[header_length] = '\0';
    unsigned long long rows, cols;
    const char *shape = strstr(header, "'shape': (");
    if (!strstr(header, "'descr': '<f4'") || !strstr(header, "'fortran_order': False") || !shape ||
        sscanf(shape, "'shape': (%llu, %llu)", &rows, &cols) != 2)
        goto bad;
    size_t data_start = start + header_length;
    if (rows * cols > (length - data_start) / sizeof(float) ||
        rows * cols * sizeof(float) != length - data_start)
        goto bad;
    out->rows = rows;
    out->cols = cols;
    out->data = malloc(rows * cols * sizeof(float) + 1);
    memcpy(out->data, bytes + data_start, rows * cols * sizeof(float));
    ok = 1;
    goto done;
bad:
    fprintf(stderr, "check_fixture: '%s' is not a 2-D float32 .npy file\n", path);
done:
    free(bytes);
    return ok;
}

/* Comma- or space-separated integers after `prefix` (NULL: from the start). */
static size_t parse_ids(const char *text, const char *prefix, long *ids) {
    if (prefix) {
        text = strstr(text, prefix);
        if (!text) return 0;
        text += strlen(prefix);
    }
    size_t n = 0;
    char *end;
    for (;;) {
        while (*text == ',' || *text == ' ')
            text++;
        long v = strtol(text, &end, 10);
        if (end == text || n == MAX_TOKENS) return n;
        ids[n++] = v;
        text = end;
    }
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: check_fixture FIXTURE_DIR PRODUCED.npy PRODUCED_STDOUT [TOLERANCE]\n");
        return 2;
    }
    double tolerance = argc == 5 ? strtod(argv[4], NULL) : DEFAULT_TOLERANCE;
    if (!(tolerance > 0 && tolerance < 1)) {
        fprintf(stderr, "check_fixture: tolerance '%s' is not in (0, 1)\n", argv[4]);
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/logits.npy", argv[1]);
    array2d expected = {0}, produced = {0};
    if (!read_npy(path, &expected) || !read_npy(argv[2], &produced)) return 1;
    if (expected.rows != produced.rows || expected.cols != produced.cols) {
        fprintf(stderr, "FAIL: logits have shape [%llu, %llu]; the fixture has [%llu, %llu]\n",
                (unsigned long long)produced.rows, (unsigned long long)produced.cols,
                (unsigned long long)expected.rows, (unsigned long long)expected.cols);
        return 1;
    }
    float lo = INFINITY, hi = -INFINITY;
    for (uint64_t i = 0; i < expected.rows * expected.cols; i++) {
        lo = fminf(lo, expected.data[i]);
        hi = fmaxf(hi, expected.data[i]);
    }
    double bound = tolerance * (hi - lo), worst = 0;
    int failed = 0;
    for (uint64_t r = 0; r < expected.rows; r++) {
        double row_worst = 0;
        for (uint64_t c = 0; c < expected.cols; c++) {
            double e =
                fabs((double)produced.data[r * expected.cols + c] - expected.data[r * expected.cols + c]);
            if (!(e <= row_worst)) row_worst = e; /* NaN counts as worst */
        }
        if (!(row_worst <= bound)) {
            fprintf(stderr, "FAIL: row %llu: max abs error %.3g > %.3g (%g of the logit range %.3f)\n",
                    (unsigned long long)r, row_worst, bound, tolerance, hi - lo);
            failed = 1;
        }
        if (!(row_worst <= worst)) worst = row_worst;
    }

    long want[MAX_TOKENS], got[MAX_TOKENS];
    size_t length;
    snprintf(path, sizeof path, "%s/tokens.txt", argv[1]);
    char *tokens_text = read_all(path, &length), *stdout_text = read_all(argv[3], &length);
    if (!tokens_text || !stdout_text) return 1;
    size_t want_count = parse_ids(tokens_text, NULL, want),
           got_count = parse_ids(stdout_text, "tokens:", got);
    if (want_count == 0 || got_count < want_count) {
        fprintf(stderr, "FAIL: %zu tokens printed; the fixture has %zu\n", got_count, want_count);
        failed = 1;
    }
    for (size_t i = 0; i < want_count && i < got_count; i++)
        if (want[i] != got[i]) {
            fprintf(stderr, "FAIL: token %zu is %ld; the fixture's greedy token is %ld\n", i + 1, got[i],
                    want[i]);
            failed = 1;
        }
    printf("%s: %llu rows, max abs error %.3g = %.3g of the logit range (bound %g); %zu greedy tokens %s\n",
           argv[1], (unsigned long long)expected.rows, worst, worst / (hi - lo), tolerance, want_count,
           failed ? "checked: MISMATCH" : "identical");
    free(tokens_text);
    free(stdout_text);
    free(expected.data);
    free(produced.data);
    return failed;
}
