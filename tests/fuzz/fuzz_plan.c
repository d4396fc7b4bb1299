/* fuzz_plan.c - the plan reader on arbitrary bytes: the container checks,
 * then the kernel table and the launch program of whatever passes them, then
 * the whole `smelt inspect` printout. */
#include "fuzz.h"
#include "plan_print.h"
#include "plan_read.h"
#include "program.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    plan_file plan;
    char error[512];
    if (!plan_open_bytes(data, size, "fuzz.plan", &plan, error, sizeof error)) return 0;
    const uint8_t *section;
    uint64_t section_size;
    if (plan_section(&plan, PLAN_SECTION_KERNELS, &section, &section_size)) {
        plan_kernel_table table;
        if (plan_kernel_table_decode(section, section_size, &table, error, sizeof error))
            plan_kernel_table_free(&table);
    }
    if (plan_section(&plan, PLAN_SECTION_PROGRAM, &section, &section_size)) {
        program p;
        if (program_decode(section, section_size, &p, error, sizeof error)) program_free(&p);
    }
    plan_print_options options = {.kernel_source = true};
    plan_print(fuzz_null_stream(), &plan, &options, error, sizeof error);
    plan_close(&plan);
    return 0;
}
