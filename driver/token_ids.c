/* token_ids.c - files of token ids, as `smelt eval --ids` and calibration
 * (`--calib`) read them (driver.h). */
#include "driver_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_ID_FILE_BYTES = 256 * 1024 * 1024 };

/* The whole file, or NULL after reporting. */
static char *read_whole_file(const char *path, size_t *length, diag_engine *d) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        diag_error(d, SMELT_NO_LOC, "cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    size_t capacity = 1 << 16, n = 0;
    char *bytes = malloc(capacity);
    while (bytes) {
        size_t got = fread(bytes + n, 1, capacity - n, fp);
        n += got;
        if (got == 0) break;
        if (n < capacity) continue;
        if (capacity >= MAX_ID_FILE_BYTES) {
            diag_error(d, SMELT_NO_LOC, "'%s' is larger than %d MiB", path, MAX_ID_FILE_BYTES >> 20);
            free(bytes);
            fclose(fp);
            return NULL;
        }
        char *grown = realloc(bytes, capacity *= 2);
        if (!grown) free(bytes);
        bytes = grown;
    }
    bool failed = ferror(fp);
    fclose(fp);
    if (!bytes || failed) {
        diag_error(d, SMELT_NO_LOC, "cannot read '%s': %s", path, bytes ? "read error" : "out of memory");
        free(bytes);
        return NULL;
    }
    *length = n;
    return bytes;
}

static bool is_id_separator(char c) { return c != '\0' && strchr(", \t\r\n", c) != NULL; }

/* The format is chosen by the name, never guessed from the bytes (a binary
 * file can consist of digits): FILE.bin holds little-endian uint16 ids (an
 * even number of bytes); any other name holds decimal ids as text, separated
 * by commas, spaces or newlines, and any other byte is an error. */
int32_t *drv_token_ids_read(const char *path, size_t *count, diag_engine *d) {
    size_t length, name_length = strlen(path);
    char *bytes = read_whole_file(path, &length, d);
    if (!bytes) return NULL;
    bool text = !(name_length >= 4 && strcmp(path + name_length - 4, ".bin") == 0);
    int32_t *ids = malloc((length / 2 + 1) * sizeof *ids); /* an id and a separator take 2 bytes */
    if (!ids) {
        diag_error(d, SMELT_NO_LOC, "'%s': out of memory for %zu ids", path, length / 2 + 1);
        free(bytes);
        return NULL;
    }
    size_t n = 0;
    if (text) {
        for (size_t i = 0; i < length;) {
            if (is_id_separator(bytes[i])) {
                i++;
                continue;
            }
            if (bytes[i] < '0' || bytes[i] > '9') {
                diag_error(d, SMELT_NO_LOC,
                           "'%s': byte %zu (0x%02x) is not a digit, comma, space or newline; text ids are "
                           "decimal (a file of uint16 ids must be named *.bin)",
                           path, i, (unsigned char)bytes[i]);
                free(ids);
                free(bytes);
                return NULL;
            }
            long long v = 0;
            while (i < length && bytes[i] >= '0' && bytes[i] <= '9' && v <= INT32_MAX)
                v = v * 10 + (bytes[i++] - '0');
            if (v > INT32_MAX) {
                diag_error(d, SMELT_NO_LOC, "'%s': id %zu does not fit in 32 bits", path, n + 1);
                free(ids);
                free(bytes);
                return NULL;
            }
            ids[n++] = (int32_t)v;
        }
    } else if (length % 2 != 0) {
        diag_error(d, SMELT_NO_LOC, "'%s': %zu bytes is not a whole number of uint16 ids", path, length);
        free(ids);
        free(bytes);
        return NULL;
    } else {
        for (size_t i = 0; i + 1 < length; i += 2)
            ids[n++] = (int32_t)((unsigned char)bytes[i] | (unsigned char)bytes[i + 1] << 8);
    }
    free(bytes);
    *count = n;
    return ids;
}
