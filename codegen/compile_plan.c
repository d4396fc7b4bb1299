/* compile_plan.c - lower, compile (NVRTC per arch, host object), write the
 * plan (see compile_plan.h). */
#include "compile_plan.h"

#include "compile_pool.h"
#include "host_build.h"
#include "ir_io.h"
#include "lower.h"
#include "numeric.h"
#include "plan_write.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { WEIGHT_ALIGNMENT = 256 };

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const cg_header kernel_header = {"smelt_kernel.h", cg_smelt_kernel_header};

/* ---- kernels ------------------------------------------------------------- */

typedef struct compiled_kernels {
    cg_compile_request *jobs; /* kernel i, arch j at i * arch_count + j */
    cg_compile_result *results;
    size_t job_count;
    cg_host_source *host_sources; /* per kernel, for the host build */
    cg_host_object host;
} compiled_kernels;

/* The NVRTC jobs: every kernel for every arch; the newest arch's job gives
 * the PTX too (one compile makes both). */
static bool make_cuda_jobs(const cg_lowered *l, const cg_plan_options *o, compiled_kernels *c,
                           diag_engine *d) {
    c->job_count = (size_t)l->kernel_count * o->arch_count;
    if (c->job_count == 0) return true;
    c->jobs = calloc(c->job_count, sizeof *c->jobs);
    c->results = calloc(c->job_count, sizeof *c->results);
    if (!c->jobs || !c->results) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false; /* cg_compile_plan frees them */
    }
    int newest = 0;
    for (uint32_t j = 0; j < o->arch_count; j++)
        if (o->archs[j] > newest) newest = o->archs[j];
    for (uint32_t i = 0; i < l->kernel_count; i++)
        for (uint32_t j = 0; j < o->arch_count; j++)
            c->jobs[i * o->arch_count + j] = (cg_compile_request){
                .source = l->kernels[i].source,
                .kernel_name = l->kernels[i].name,
                .headers = &kernel_header,
                .header_count = 1,
                .arch = o->archs[j],
                .want_cubin = true,
                .want_ptx = o->archs[j] == newest,
            };
    return true;
}

static uint64_t host_unit_cost(void *build, size_t unit) { return cg_host_build_unit_cost(build, unit); }
static void host_unit_run(void *build, size_t unit) { cg_host_build_run_unit(build, unit); }

/* NVRTC for every arch and the host object (when o->host), all on one pool:
 * the host compiler's per-kernel compiles run beside NVRTC's, so both
 * cores stay busy until the end (compile_pool.h). */
static bool compile_kernels(const cg_lowered *l, const cg_plan_options *o, cg_cache *cache,
                            compiled_kernels *c, cg_plan_report *report, diag_engine *d) {
    if (!make_cuda_jobs(l, o, c, d)) return false;
    static const char *const link_flags[] = {"-lm"};
    cg_host_build_request host_request = {
        .headers = &kernel_header,
        .header_count = 1,
        .sanitize_address = cg_host_build_process_is_sanitized(),
        .link_flags = link_flags,
        .link_flag_count = 1,
    };
    cg_host_builder *host = NULL;
    char error[4096];
    if (o->host) {
        c->host_sources = calloc(l->kernel_count ? l->kernel_count : 1, sizeof *c->host_sources);
        if (!c->host_sources) {
            diag_error(d, SMELT_NO_LOC, "out of memory");
            return false;
        }
        for (uint32_t i = 0; i < l->kernel_count; i++)
            c->host_sources[i] = (cg_host_source){l->kernels[i].name, l->kernels[i].source};
        host_request.sources = c->host_sources;
        host_request.source_count = l->kernel_count;
        if (!cg_host_build_begin(&host_request, cache, &host, error, sizeof error)) {
            diag_error(d, SMELT_NO_LOC, "building the host kernels: %s", error);
            return false;
        }
    }
    cg_pool_tasks host_tasks = {host ? cg_host_build_unit_count(host) : 0, host, host_unit_cost,
                                host_unit_run};
    size_t failed;
    if (!cg_compile_all_with_tasks(c->jobs, c->job_count, &host_tasks, o->jobs, cache, c->results,
                                   o->progress, o->progress_user, &failed, error, sizeof error)) {
        cg_host_build_cancel(host);
        diag_error(d, SMELT_NO_LOC, "compiling the kernels: %s", error);
        return false;
    }
    for (size_t i = 0; i < c->job_count; i++) {
        if (!c->results[i].ok)
            diag_error(d, SMELT_NO_LOC, "%s", c->results[i].error);
        else
            report->cache_hits += c->results[i].from_cache;
    }
    report->compile_jobs = (uint32_t)c->job_count;
    bool ok = failed == 0;
    if (host && !cg_host_build_finish(host, &c->host, error, sizeof error)) {
        diag_error(d, SMELT_NO_LOC, "building the host kernels: %s", error);
        ok = false;
    }
    return ok;
}

static plan_affine affine_of(prog_affine f) { return (plan_affine){f.a, f.b, f.c}; }

/* The kernel table: sources, launch rules, per-arch resources and binaries. */
static void add_kernel_table(const cg_lowered *l, const cg_plan_options *o, const compiled_kernels *c,
                             plan_writer *w, arena *a) {
    plan_kernel *kernels = arena_array(a, l->kernel_count ? l->kernel_count : 1, sizeof *kernels);
    for (uint32_t i = 0; i < l->kernel_count; i++) {
        const cg_kernel *k = &l->kernels[i];
        plan_kernel *p = &kernels[i];
        p->name = plan_text_from(k->name);
        p->family = plan_text_from(k->family);
        p->ops = plan_text_from(k->ops_text);
        p->source = plan_text_from(k->source);
        for (int axis = 0; axis < 3; axis++) {
            p->launch.grid[axis] = affine_of(k->rule.grid[axis]);
            p->launch.block[axis] = (plan_affine){0, k->rule.block[axis], 1};
        }
        p->launch.dynamic_shared_bytes = k->rule.dynamic_shared_bytes;
        program_declare_params(&l->program, i, p);
        plan_kernel_resources *resources =
            arena_array(a, o->arch_count ? o->arch_count : 1, sizeof *resources);
        plan_kernel_binary *binaries = arena_array(a, o->arch_count + 1, sizeof *binaries);
        for (uint32_t j = 0; c->results && j < o->arch_count; j++) {
            const cg_compiled *compiled = &c->results[i * o->arch_count + j].compiled;
            const char *arch = arena_printf(a, "sm_%d", o->archs[j]);
            const cg_kernel_resources *r = cg_resource_find(&compiled->resources, k->name);
            resources[p->resource_count++] = (plan_kernel_resources){
                .arch = plan_text_from(arch),
                .registers = r ? r->registers : 0,
                .shared_bytes = r ? r->shared_bytes : 0,
                .stack_bytes = r ? r->stack_frame_bytes : 0,
                .spill_store_bytes = r ? r->spill_store_bytes : 0,
                .spill_load_bytes = r ? r->spill_load_bytes : 0,
            };
            binaries[p->binary_count++] = (plan_kernel_binary){
                plan_text_from(arch), PLAN_BINARY_CUBIN, {compiled->cubin, compiled->cubin_size}};
            if (compiled->ptx)
                binaries[p->binary_count++] =
                    (plan_kernel_binary){plan_text_from(arena_printf(a, "compute_%d", o->archs[j])),
                                         PLAN_BINARY_PTX,
                                         {(const uint8_t *)compiled->ptx, compiled->ptx_size}};
        }
        p->resources = resources;
        p->binaries = binaries;
    }
    plan_writer_add_kernels(w, kernels, l->kernel_count);
}

/* ---- weights --------------------------------------------------------------- */

typedef struct weight_stream {
    const ir_module *m;
    const program *p;
    const cg_plan_options *o;
} weight_stream;

/* Weight data: each weight converted to its storage dtype, at its planned
 * offset (WEIGHT_ALIGNMENT apart). */
static bool stream_weights(void *context, plan_sink *sink) {
    const weight_stream *s = context;
    static const uint8_t zeros[WEIGHT_ALIGNMENT];
    uint64_t written = 0;
    const ir_module *m = s->m;
    for (uint32_t op = 0; op < m->op_count; op++) {
        if (m->ops[op].dead || m->ops[op].result_count != 1) continue;
        const ir_buffer *buffer = &m->values[m->ops[op].results[0]].buffer;
        if (buffer->kind != IR_BUFFER_WEIGHT) continue;
        const prog_weight *w = &s->p->weights[buffer->offset];
        if (!plan_sink_write(sink, zeros, w->data_offset - written)) return false;
        if (w->quant.kind != PROG_QUANT_NONE) { /* the packed layout, from the driver's quantizer */
            uint8_t *packed = calloc(w->bytes, 1);
            bool ok = packed && s->o->read_packed_weight &&
                      s->o->read_packed_weight(s->o->weight_context, op, packed, w->bytes);
            if (!ok) plan_sink_fail(sink, "cannot quantize weight '%s'", w->name);
            ok = ok && plan_sink_write(sink, packed, w->bytes);
            free(packed);
            if (!ok) return false;
            written = w->data_offset + w->bytes;
            continue;
        }
        uint64_t count = w->bytes / smelt_dtype_element_bytes(w->dtype);
        float *values = malloc(count * sizeof *values + 1);
        bool half = w->dtype == SMELT_DTYPE_BF16 || w->dtype == SMELT_DTYPE_F16; /* 16-bit storage */
        uint16_t *narrowed = half ? malloc(count * sizeof *narrowed + 1) : NULL;
        if (!values || (half && !narrowed)) {
            free(values);
            free(narrowed);
            plan_sink_fail(sink, "out of memory converting weight '%s'", w->name);
            return false;
        }
        bool ok = true;
        if (w->part_count == 0) {
            ok = s->o->read_weight(s->o->weight_context, op, values, count);
        } else { /* a concat of weights (passes/fuse.c): each part into its rows */
            uint64_t at = 0, row = count / (uint64_t)w->shape[0];
            for (uint32_t k = 0; k < w->part_count && ok; k++) {
                uint32_t part = m->values[m->ops[op].operands[k]].def_op;
                uint64_t part_count = (uint64_t)w->parts[k].rows * row;
                ok = s->o->read_weight(s->o->weight_context, part, values + at, part_count);
                at += part_count;
            }
        }
        if (!ok) plan_sink_fail(sink, "cannot read weight '%s'", w->name);
        if (ok && narrowed)
            for (uint64_t i = 0; i < count; i++) /* f16 above 65504 is infinite: docs/quantization.md */
                narrowed[i] =
                    w->dtype == SMELT_DTYPE_F16 ? plan_f32_to_f16(values[i]) : plan_f32_to_bf16(values[i]);
        ok = ok && plan_sink_write(sink, narrowed ? (const void *)narrowed : (const void *)values, w->bytes);
        free(values);
        free(narrowed);
        if (!ok) return false;
        written = w->data_offset + w->bytes;
    }
    return true;
}

static uint64_t place_weights(program *p) {
    uint64_t offset = 0;
    for (uint32_t i = 0; i < p->weight_count; i++) {
        offset = (offset + WEIGHT_ALIGNMENT - 1) / WEIGHT_ALIGNMENT * WEIGHT_ALIGNMENT;
        p->weights[i].data_offset = offset;
        offset += p->weights[i].bytes;
    }
    return offset;
}

/* ---- manifest and memory plan ------------------------------------------------ */

/* The manifest as JSON text (malloc'd); NULL when out of memory. */
static char *manifest_json(const ir_module *m, const cg_plan_options *o, const cg_lowered *l) {
    json_t *root = json_object(), *targets = json_array(), *dims = json_object(), *params = json_object();
    json_object_set_new(root, "model", json_string(m->name));
    if (m->source_path) json_object_set_new(root, "source", json_string(m->source_path));
    json_object_set_new(root, "precision", json_string(m->precision));
    for (uint32_t j = 0; j < o->arch_count; j++) {
        char arch[16];
        snprintf(arch, sizeof arch, "sm_%d", o->archs[j]);
        json_array_append_new(targets, json_string(arch));
    }
    if (o->host) json_array_append_new(targets, json_string("host"));
    json_object_set_new(root, "targets", targets);
    json_object_set_new(root, "max_tokens", json_integer(l->program.max_tokens));
    for (uint32_t i = 0; i < m->symbol_count; i++)
        json_object_set_new(dims, m->symbols[i].name, json_integer(m->symbols[i].bound));
    json_object_set_new(root, "dims", dims);
    for (uint32_t i = 0; i < m->param_count; i++) {
        const ir_param *p = &m->params[i];
        json_t *v = p->type == IR_PARAM_INT     ? json_integer(p->value.i)
                    : p->type == IR_PARAM_FLOAT ? json_real(p->value.f)
                    : p->type == IR_PARAM_BOOL  ? json_boolean(p->value.b)
                                                : json_string(p->value.s);
        json_object_set_new(params, p->name, v);
    }
    json_object_set_new(root, "params", params);
    /* What binding a checkpoint at run time may leave unused (`ignore`). */
    json_t *ignored = json_array();
    for (uint32_t i = 0; i < m->ignored_tensor_count; i++)
        json_array_append_new(ignored, json_string(m->ignored_tensors[i]));
    json_object_set_new(root, "ignored_tensors", ignored);
    json_object_set_new(root, "weights_in_plan", json_boolean(o->read_weight != NULL));
    json_t *gate = o->accuracy_gate_json ? json_loads(o->accuracy_gate_json, 0, NULL) : NULL;
    if (gate) json_object_set_new(root, "accuracy_gate", gate);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return text;
}

/* The memory plan as a table people read (smelt inspect prints it);
 * malloc'd, NULL when out of memory. */
static char *memory_table(const ir_module *m, const cg_lowered *l, size_t *size) {
    uint32_t *numbers = ir_value_numbers(m); /* first: it may unwind (arena.h) */
    char *text = NULL;
    FILE *f = open_memstream(&text, size);
    if (!f) {
        free(numbers);
        return NULL;
    }
    fprintf(f, "arena: %llu bytes for %lld tokens per step\n", (unsigned long long)l->program.arena_bytes,
            (long long)l->program.max_tokens);
    for (uint32_t i = 0; i < l->program.state_count; i++)
        fprintf(f, "state %u: %llu bytes\n", i, (unsigned long long)l->program.state_bytes[i]);
    fprintf(f, "%-8s %-12s %-28s %14s\n", "value", "op", "type", "arena offset");
    for (uint32_t op = 0; op < m->op_count; op++) {
        const ir_op *o = &m->ops[op];
        if (o->dead) continue;
        for (uint32_t r = 0; r < o->result_count; r++) {
            ir_value_id v = o->results[r];
            /* the buffers plan-memory placed; a view shares its operand's */
            if (m->values[v].buffer.kind != IR_BUFFER_ARENA || (ir_op_info_of(o->kind)->flags & IR_OPF_VIEW))
                continue;
            char type[IR_TYPE_TEXT_MAX], name[16];
            snprintf(name, sizeof name, "%%%u", numbers[v]);
            fprintf(f, "%-8s %-12s %-28s %14llu\n", name, ir_op_info_of(o->kind)->name,
                    ir_format_type(m, &m->values[v].type, type, sizeof type),
                    (unsigned long long)m->values[v].buffer.offset);
        }
    }
    free(numbers);
    /* fclose makes the buffer, and may run out of memory doing so */
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* ---- the whole ---------------------------------------------------------------- */

bool cg_compile_plan(const ir_module *m, const cg_plan_options *o, const char *path, cg_plan_report *report,
                     diag_engine *d) {
    double start = seconds_now();
    memset(report, 0, sizeof *report);
    cg_lowered l;
    memset(&l, 0, sizeof l);
    compiled_kernels c = {0};
    plan_writer w;
    plan_writer_init(&w, SMELT_VERSION_TEXT);
    arena scratch;
    arena_init(&scratch);
    cg_cache *cache = o->no_cache ? NULL : cg_cache_open(NULL);
    /* Set after the recovery point and freed after it: volatile (arena.h). */
    uint8_t *volatile program_bytes = NULL;
    char *volatile manifest = NULL, *volatile memory = NULL;

    size_t program_size = 0, memory_size = 0;
    volatile bool ok = false;
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
        goto done;
    }
    ok = cg_lower_module(m, &l, d);
    if (ok && o->eos_token_count > PROG_MAX_EOS) {
        diag_error(d, SMELT_NO_LOC, "%u EOS ids; a plan keeps at most %d", o->eos_token_count, PROG_MAX_EOS);
        ok = false;
    }
    if (ok) {
        l.program.eos_count = o->eos_token_count;
        for (uint32_t i = 0; i < o->eos_token_count; i++)
            l.program.eos[i] = o->eos_tokens[i];
    }
    ok = ok && compile_kernels(&l, o, cache, &c, report, d);
    if (ok) {
        if (o->read_weight) report->weight_bytes = place_weights(&l.program);
        uint8_t *encoded = NULL;
        ok = program_encode(&l.program, &encoded, &program_size);
        program_bytes = encoded; /* the program is valid: only memory can fail */
        if (ok) manifest = manifest_json(m, o, &l);
        if (manifest) memory = memory_table(m, &l, &memory_size);
        if (!memory) {
            diag_error(d, SMELT_NO_LOC, "out of memory");
            ok = false;
        }
    }
    if (ok) {
        plan_writer_add_section(&w, PLAN_SECTION_MANIFEST, manifest, strlen(manifest));
        add_kernel_table(&l, o, &c, &w, &scratch);
        if (o->host) plan_writer_add_section(&w, PLAN_SECTION_HOST_KERNELS, c.host.bytes, c.host.size);
        plan_writer_add_section(&w, PLAN_SECTION_PROGRAM, program_bytes, program_size);
        plan_writer_add_section(&w, PLAN_SECTION_MEMORY, memory, memory_size);
        weight_stream weights = {m, &l.program, o};
        if (o->read_weight) plan_writer_add_stream(&w, PLAN_SECTION_WEIGHT_DATA, stream_weights, &weights);
        if (o->tokenizer_json)
            plan_writer_add_section(&w, PLAN_SECTION_TOKENIZER, o->tokenizer_json, strlen(o->tokenizer_json));
        plan_write_summary summary;
        char error[1024];
        ok = plan_write_file(&w, path, &summary, error, sizeof error);
        if (!ok) diag_error(d, SMELT_NO_LOC, "%s", error);
        report->file_size = summary.file_size;
        snprintf(report->content_hash, sizeof report->content_hash, "%016llx%016llx",
                 (unsigned long long)summary.content_hash_high, (unsigned long long)summary.content_hash_low);
    }
    arena_recovery_leave(&recovery);
done:
    report->kernel_count = l.kernel_count;
    report->launches_per_step = l.launches_per_step;
    report->arena_bytes = l.program.arena_bytes;
    if (cache) {
        const char *warning = cg_cache_warning(cache);
        if (warning) diag_warning(d, SMELT_NO_LOC, "%s", warning);
        cg_cache_close(cache);
    }
    free(program_bytes);
    free(manifest);
    free(memory);
    cg_host_object_free(&c.host);
    if (c.results) cg_compile_results_free(c.results, c.job_count);
    free(c.results);
    free(c.jobs);
    free(c.host_sources);
    plan_writer_free(&w);
    arena_free(&scratch);
    cg_lowered_free(&l);
    report->seconds = seconds_now() - start;
    return ok;
}
