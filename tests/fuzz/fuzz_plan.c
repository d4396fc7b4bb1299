/* fuzz_plan.c - the plan reader on arbitrary bytes: the container checks,
 * then the kernel table and the launch program of whatever passes them (and
 * the program against the kernel table), then the whole `smelt inspect`
 * printout. */
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
    plan_kernel_table table = {0};
    bool have_table = plan_section(&plan, PLAN_SECTION_KERNELS, &section, &section_size) &&
                      plan_kernel_table_decode(section, section_size, &table, error, sizeof error);
    if (plan_section(&plan, PLAN_SECTION_PROGRAM, &section, &section_size)) {
        program p;
        if (program_decode(section, section_size, &p, error, sizeof error)) {
            /* and against the rest of the plan, as the runtime checks it */
            const uint8_t *weights;
            uint64_t weight_size = 0;
            if (!plan_section(&plan, PLAN_SECTION_WEIGHT_DATA, &weights, &weight_size)) weight_size = 0;
            if (have_table)
                program_check_plan(&p, table.kernels, table.count, weight_size, error, sizeof error);
            program_free(&p);
        }
    }
    if (have_table) plan_kernel_table_free(&table);
    plan_print_options options = {.kernel_source = true};
    plan_print(fuzz_null_stream(), &plan, &options, error, sizeof error);
    plan_close(&plan);
    return 0;
}
