/* driver.c - replays fuzz inputs without libFuzzer:
 *   fuzz_NAME FILE_OR_FOLDER...
 * runs LLVMFuzzerTestOneInput on every file (folders: every file in them)
 * and prints how many ran. A crash or sanitizer report fails the run. */
#include "fuzz.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot read %s\n", path);
        return 0;
    }
    size_t capacity = 1 << 16, n = 0, got;
    uint8_t *data = malloc(capacity);
    while (data && (got = fread(data + n, 1, capacity - n, f)) > 0) {
        n += got;
        if (n == capacity) data = realloc(data, capacity *= 2);
    }
    fclose(f);
    if (!data) return 0;
    LLVMFuzzerTestOneInput(data, n);
    free(data);
    return 1;
}

int main(int argc, char **argv) {
    int count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "no such file or folder: %s\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            count += run_file(argv[i]);
            continue;
        }
        DIR *dir = opendir(argv[i]);
        struct dirent *e;
        while (dir && (e = readdir(dir)) != NULL) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            struct stat entry;
            if (stat(path, &entry) == 0 && S_ISREG(entry.st_mode)) count += run_file(path);
        }
        if (dir) closedir(dir);
    }
    printf("%d inputs replayed\n", count);
    return count > 0 ? 0 : 1;
}
