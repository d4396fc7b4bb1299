/* plan_print.c - `smelt inspect`: the plan container and its sections, in
 * words (the layout is in plan_format.h).
 *
 * Text that comes from the plan (names, the manifest, sources) is printed
 * with control bytes escaped as \xNN, so a damaged or hostile plan cannot
 * drive the terminal.
 */
#include "plan_print.h"

#include <inttypes.h>
#include <string.h>

/* One entry per section kind: a title, and the printer of its contents
 * (NULL: not written yet; the section is shown by its size). A decoder for a
 * new section adds its printer here. */
static const struct {
    const char *title;
    plan_section_printer print;
} section_printers[PLAN_SECTION_KIND_COUNT + 1] = {
    [PLAN_SECTION_MANIFEST] = {"manifest", plan_print_manifest},
    [PLAN_SECTION_KERNELS] = {"kernels", plan_print_kernels},
    [PLAN_SECTION_HOST_KERNELS] = {"host kernels (shared object for the host simulator)", NULL},
    [PLAN_SECTION_PROGRAM] = {"launch program", plan_print_program},
    [PLAN_SECTION_MEMORY] = {"memory plan", plan_print_memory},
    [PLAN_SECTION_WEIGHT_TABLE] = {"weight table", NULL},
    [PLAN_SECTION_WEIGHT_DATA] = {"weight data", NULL},
    [PLAN_SECTION_TOKENIZER] = {"tokenizer", plan_print_manifest}, /* JSON text too */
};

/* Writes text from the plan; `newlines` keeps line breaks (else they are
 * escaped too, for one-line fields). */
void plan_print_escaped(FILE *out, const char *data, uint64_t length, bool newlines) {
    for (uint64_t i = 0; i < length; i++) {
        unsigned char c = (unsigned char)data[i];
        if ((c == '\n' && newlines) || c == '\t' || (c >= 0x20 && c != 0x7f))
            fputc(c, out);
        else
            fprintf(out, "\\x%02x", c);
    }
}

static void print_escaped(FILE *out, const char *data, uint64_t length, bool newlines) {
    plan_print_escaped(out, data, length, newlines);
}

static void print_inline(FILE *out, plan_text text) { print_escaped(out, text.data, text.length, false); }

/* Multi-line text, each line after the first indented to `indent` columns. */
static void print_block(FILE *out, plan_text text, int indent) {
    const char *p = text.data, *end = text.data + text.length;
    bool first = true;
    while (p < end) {
        const char *newline = memchr(p, '\n', (size_t)(end - p));
        const char *stop = newline ? newline : end;
        if (!first) fprintf(out, "%*s", indent, "");
        print_escaped(out, p, (uint64_t)(stop - p), false);
        fputc('\n', out);
        first = false;
        p = newline ? newline + 1 : end;
    }
    if (first) fputc('\n', out);
}

void plan_affine_format(plan_affine rule, char *text, size_t size) {
    int64_t value;
    if (rule.a == 0 && plan_affine_eval(rule, 0, &value)) {
        snprintf(text, size, "%" PRId64, value);
        return;
    }
    if (rule.a == 0) { /* a negative constant: show it as it is */
        snprintf(text, size, "ceil(%" PRId64 " / %" PRId64 ")", rule.b, rule.c);
        return;
    }
    if (rule.b == 0) {
        snprintf(text, size, "ceil(T * %" PRId64 " / %" PRId64 ")", rule.a, rule.c);
        return;
    }
    /* |b| as unsigned, which also holds INT64_MIN */
    uint64_t magnitude = rule.b < 0 ? (uint64_t)0 - (uint64_t)rule.b : (uint64_t)rule.b;
    snprintf(text, size, "ceil((T * %" PRId64 " %c %" PRIu64 ") / %" PRId64 ")", rule.a,
             rule.b < 0 ? '-' : '+', magnitude, rule.c);
}

void plan_print_header(FILE *out, const plan_file *plan) {
    char hash[33];
    plan_content_hash_hex(plan, hash);
    fprintf(out, "plan format:   %" PRIu32 "\n", plan->format_version);
    fprintf(out, "smelt version: ");
    print_escaped(out, plan->smelt_version, strlen(plan->smelt_version), false);
    fprintf(out, "\ncontent hash:  xxh3-128:%s\n", hash);
    fprintf(out, "file size:     %zu bytes\n", plan->size);
    fprintf(out, "sections:      %" PRIu32 "\n", plan->section_count);
    if (plan->section_count == 0) return;
    fprintf(out, "  %-14s %14s %14s  %s\n", "kind", "offset", "bytes", "xxh64");
    for (uint32_t i = 0; i < plan->section_count; i++) {
        const plan_section_entry *e = &plan->sections[i];
        fprintf(out, "  %-14s %14" PRIu64 " %14" PRIu64 "  %016" PRIx64 "\n", plan_section_kind_name(e->kind),
                e->offset, e->size, e->checksum);
    }
}

bool plan_print_manifest(FILE *out, const plan_file *plan, const uint8_t *data, uint64_t size,
                         const plan_print_options *options, char *error, size_t error_size) {
    print_escaped(out, (const char *)data, size, true);
    if (size > 0 && data[size - 1] != '\n') fputc('\n', out);
    return true;
}

static void print_launch(FILE *out, const plan_launch_rule *launch) {
    char text[6][128];
    for (int d = 0; d < 3; d++) {
        plan_affine_format(launch->grid[d], text[d], sizeof text[d]);
        plan_affine_format(launch->block[d], text[3 + d], sizeof text[3 + d]);
    }
    fprintf(out, "grid = (%s, %s, %s), block = (%s, %s, %s), shared = %" PRIu64 "\n", text[0], text[1],
            text[2], text[3], text[4], text[5], launch->dynamic_shared_bytes);
}

/* "0: reads T*256 B, 1: tokens, 2: writes T*256 B": what the kernel declares
 * it touches through each parameter. */
static void print_params(FILE *out, const plan_kernel *k) {
    if (k->param_count == 0) fprintf(out, "none");
    for (uint32_t p = 0; p < k->param_count; p++) {
        const plan_kernel_param *param = &k->params[p];
        char extent[128];
        plan_affine_format(param->extent, extent, sizeof extent);
        if (param->kind == 1)
            fprintf(out, "%s%" PRIu32 ": tokens", p ? ", " : "", p);
        else
            fprintf(out, "%s%" PRIu32 ": %s %s B", p ? ", " : "", p, param->writes ? "writes" : "reads",
                    extent);
    }
    fputc('\n', out);
}

static uint64_t count_lines(plan_text text) {
    uint64_t lines = 0;
    for (uint64_t i = 0; i < text.length; i++)
        lines += text.data[i] == '\n';
    return lines + (text.length > 0 && text.data[text.length - 1] != '\n');
}

static void print_kernel(FILE *out, uint32_t index, const plan_kernel *k, const plan_print_options *options) {
    fprintf(out, "  kernel %" PRIu32 ": ", index);
    print_inline(out, k->name);
    fprintf(out, "\n    family:    ");
    print_inline(out, k->family);
    fprintf(out, "\n    ops:       ");
    print_block(out, k->ops, 15);
    fprintf(out, "    launch:    ");
    print_launch(out, &k->launch);
    fprintf(out, "    params:    ");
    print_params(out, k);
    fprintf(out, "    resources:%s", k->resource_count ? "" : " none reported\n");
    for (uint32_t i = 0; i < k->resource_count; i++) {
        const plan_kernel_resources *r = &k->resources[i];
        fprintf(out, "%*s", i == 0 ? 1 : 15, "");
        print_inline(out, r->arch);
        fprintf(out,
                ": %" PRIu32 " registers, %" PRIu64 " B shared, %" PRIu64 " B stack, spills: %" PRIu64
                " B stored, %" PRIu64 " B loaded\n",
                r->registers, r->shared_bytes, r->stack_bytes, r->spill_store_bytes, r->spill_load_bytes);
    }
    fprintf(out, "    binaries: %s", k->binary_count ? "" : " none\n");
    for (uint32_t i = 0; i < k->binary_count; i++) {
        const plan_kernel_binary *b = &k->binaries[i];
        fprintf(out, "%*s", i == 0 ? 1 : 15, "");
        print_inline(out, b->arch);
        fprintf(out, " %s, %" PRIu64 " bytes\n", plan_binary_kind_name(b->kind), b->bytes.size);
    }
    fprintf(out, "    source:    %" PRIu64 " lines, %" PRIu64 " bytes\n", count_lines(k->source),
            k->source.length);
    if (options && options->kernel_source) {
        fprintf(out, "    ---\n");
        print_escaped(out, k->source.data, k->source.length, true);
        if (k->source.length > 0 && k->source.data[k->source.length - 1] != '\n') fputc('\n', out);
        fprintf(out, "    ---\n");
    }
}

bool plan_print_kernels(FILE *out, const plan_file *plan, const uint8_t *data, uint64_t size,
                        const plan_print_options *options, char *error, size_t error_size) {
    plan_kernel_table table;
    char message[512];
    if (!plan_kernel_table_decode(data, size, &table, message, sizeof message)) {
        fprintf(out, "  cannot be read: ");
        print_escaped(out, message, strlen(message), false);
        fputc('\n', out);
        if (error && error_size) snprintf(error, error_size, "%s", message);
        return false;
    }
    fprintf(out, "  %" PRIu32 " kernel%s\n", table.count, table.count == 1 ? "" : "s");
    for (uint32_t i = 0; i < table.count; i++)
        print_kernel(out, i, &table.kernels[i], options);
    plan_kernel_table_free(&table);
    return true;
}

bool plan_print(FILE *out, const plan_file *plan, const plan_print_options *options, char *error,
                size_t error_size) {
    plan_print_header(out, plan);
    bool ok = true;
    for (uint32_t kind = 1; kind <= PLAN_SECTION_KIND_COUNT; kind++) {
        const uint8_t *data;
        uint64_t size;
        if (!plan_section(plan, (plan_section_kind)kind, &data, &size)) continue;
        fprintf(out, "\n%s (%s, %" PRIu64 " bytes):\n", section_printers[kind].title,
                plan_section_kind_name(kind), size);
        if (!section_printers[kind].print) {
            fprintf(out, "  (contents not printed by this version of smelt)\n");
            continue;
        }
        /* The first failure's message is kept; later sections still print. */
        char scratch[512];
        bool first_failure = ok;
        if (!section_printers[kind].print(out, plan, data, size, options, first_failure ? error : scratch,
                                          first_failure ? error_size : sizeof scratch))
            ok = false;
    }
    if (ferror(out)) {
        if (ok && error && error_size) snprintf(error, error_size, "cannot write the output");
        ok = false;
    }
    return ok;
}
