/* plan_tables.c - the tables of a plan file the driver reads beside the
 * engine: the launch program (the weight table), the tokenizer, and the
 * manifest's ignored tensors. */
#include "driver_internal.h"

#include "plan_read.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* The manifest's "ignored_tensors" (the model's `ignore` patterns) into a
 * malloc'd array of malloc'd strings; false when out of memory. */
static bool read_ignored(const uint8_t *data, uint64_t size, drv_ignored_tensors *out) {
    json_t *root = json_loadb((const char *)data, size, 0, NULL);
    json_t *list = json_object_get(root, "ignored_tensors");
    size_t n = json_is_array(list) ? json_array_size(list) : 0;
    out->patterns = n ? calloc(n, sizeof *out->patterns) : NULL;
    bool ok = !n || out->patterns;
    for (size_t i = 0; ok && i < n; i++) {
        const char *text = json_string_value(json_array_get(list, i));
        if (!text) continue;
        ok = (out->patterns[out->count++] = strdup(text)) != NULL;
    }
    json_decref(root);
    return ok;
}

void drv_ignored_tensors_free(drv_ignored_tensors *t) {
    for (uint32_t i = 0; i < t->count; i++)
        free(t->patterns[i]);
    free(t->patterns);
    t->patterns = NULL;
    t->count = 0;
}

bool drv_plan_tables_read(const char *plan_path, program *p, drv_tokenizer *tokenizer,
                          drv_ignored_tensors *ignored, diag_engine *d) {
    plan_file file;
    char error[512] = "the plan has no launch program";
    const uint8_t *data;
    uint64_t size;
    if (!plan_open(plan_path, &file, error, sizeof error) ||
        !plan_section(&file, PLAN_SECTION_PROGRAM, &data, &size) ||
        !program_decode(data, size, p, error, sizeof error)) {
        diag_error(d, SMELT_NO_LOC, "%s", error);
        plan_close(&file);
        return false;
    }
    if (plan_section(&file, PLAN_SECTION_TOKENIZER, &data, &size))
        drv_tokenizer_parse((const char *)data, size, tokenizer, d);
    if (ignored && plan_section(&file, PLAN_SECTION_MANIFEST, &data, &size) &&
        !read_ignored(data, size, ignored)) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
        plan_close(&file);
        program_free(p);
        drv_ignored_tensors_free(ignored);
        return false;
    }
    plan_close(&file);
    drv_eos eos = {.count = p->eos_count};
    for (uint32_t i = 0; i < p->eos_count; i++)
        eos.ids[i] = p->eos[i];
    if (tokenizer->present &&
        !drv_tokenizer_fits(tokenizer, &eos, p->vocab, "the plan's byte tokenizer", d)) {
        program_free(p);
        if (ignored) drv_ignored_tensors_free(ignored);
        return false;
    }
    return true;
}
