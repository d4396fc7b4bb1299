/* plan_tables.c - the tables of a plan file the driver reads beside the
 * engine: the launch program (the weight table) and the tokenizer. */
#include "driver_internal.h"

#include "plan_read.h"

bool drv_plan_tables_read(const char *plan_path, program *p, drv_tokenizer *tokenizer, diag_engine *d) {
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
    plan_close(&file);
    drv_eos eos = {.count = p->eos_count};
    for (uint32_t i = 0; i < p->eos_count; i++)
        eos.ids[i] = p->eos[i];
    if (tokenizer->present && !drv_tokenizer_fits(tokenizer, &eos, p->vocab, "the plan's byte tokenizer", d)) {
        program_free(p);
        return false;
    }
    return true;
}
