/* kernel_lab_gpu.c - the GPU half of kernel_lab.c (#included there): the
 * CUDA driver API opened with dlopen, as runtime/device/device_cuda.c opens
 * it (so the lab builds and runs where there is no driver; $SMELT_CUDA_DRIVER
 * names another library), the peaks it measures, and the timing of each
 * family's kernels (and the check of their results, for a family with one). */

typedef int lab_cu_result;
typedef unsigned long long lab_cu_ptr;
typedef void *lab_handle; /* CUcontext, CUmodule, CUfunction, CUstream, CUevent, CUgraph, CUgraphExec */

#define LAB_DRIVER_FUNCTIONS(X)                                                                              \
    X(cuInit, "cuInit", (unsigned int flags))                                                                \
    X(cuDeviceGet, "cuDeviceGet", (int *device, int ordinal))                                                \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", (int *value, int attribute, int device))                 \
    X(cuDeviceGetName, "cuDeviceGetName", (char *name, int length, int device))                              \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (lab_handle * context, int device))              \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", (lab_handle context))                                              \
    X(cuStreamCreate, "cuStreamCreate", (lab_handle * stream, unsigned int flags))                           \
    X(cuStreamSynchronize, "cuStreamSynchronize", (lab_handle stream))                                       \
    X(cuModuleLoadData, "cuModuleLoadData", (lab_handle * module, const void *image))                        \
    X(cuModuleGetFunction, "cuModuleGetFunction", (lab_handle * function, lab_handle module, const char *n)) \
    X(cuFuncSetAttribute, "cuFuncSetAttribute", (lab_handle function, int attribute, int value))             \
    X(cuMemAlloc, "cuMemAlloc_v2", (lab_cu_ptr * pointer, size_t bytes))                                     \
    X(cuMemFree, "cuMemFree_v2", (lab_cu_ptr pointer))                                                       \
    X(cuMemcpyHtoD, "cuMemcpyHtoD_v2", (lab_cu_ptr destination, const void *source, size_t bytes))           \
    X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", (void *destination, lab_cu_ptr source, size_t bytes))                 \
    X(cuMemsetD8, "cuMemsetD8_v2", (lab_cu_ptr destination, unsigned char value, size_t bytes))              \
    X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2",                                                             \
      (lab_cu_ptr destination, lab_cu_ptr source, size_t bytes, lab_handle stream))                          \
    X(cuLaunchKernel, "cuLaunchKernel",                                                                      \
      (lab_handle f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,           \
       unsigned shared, lab_handle stream, void **params, void **extra))                                     \
    X(cuEventCreate, "cuEventCreate", (lab_handle * event, unsigned int flags))                              \
    X(cuEventRecord, "cuEventRecord", (lab_handle event, lab_handle stream))                                 \
    X(cuEventSynchronize, "cuEventSynchronize", (lab_handle event))                                          \
    X(cuEventElapsedTime, "cuEventElapsedTime", (float *ms, lab_handle start, lab_handle end))               \
    X(cuStreamBeginCapture, "cuStreamBeginCapture_v2", (lab_handle stream, int mode))                        \
    X(cuStreamEndCapture, "cuStreamEndCapture", (lab_handle stream, lab_handle * graph))                     \
    X(cuGraphInstantiate, "cuGraphInstantiateWithFlags",                                                     \
      (lab_handle * exec, lab_handle graph, unsigned long long flags))                                       \
    X(cuGraphLaunch, "cuGraphLaunch", (lab_handle exec, lab_handle stream))

typedef struct lab_driver {
    void *library;
#define X(member, symbol, params) lab_cu_result(*member) params;
    LAB_DRIVER_FUNCTIONS(X)
#undef X
    int device, arch, sms;
    lab_handle context, stream, start, end;
    double copy_gbps, tensor_tflops;
} lab_driver;

enum {
    LAB_ATTRIBUTE_SMS = 16,
    LAB_ATTRIBUTE_MAJOR = 75,
    LAB_ATTRIBUTE_MINOR = 76,
    LAB_STREAM_NON_BLOCKING = 1,
    LAB_FUNCTION_MAX_DYNAMIC_SHARED = 8, /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
    LAB_STATIC_SHARED_LIMIT = 48 * 1024, /* dynamic shared bytes a launch gets without asking */
};

#define LAB_CHECK(d, call)                                                                                   \
    do {                                                                                                     \
        lab_cu_result lab_status = (d)->call;                                                                \
        if (lab_status != 0) fail_msg("%s: CUDA error %d", #call, lab_status);                               \
    } while (0)

static bool lab_open_driver(lab_driver *d) {
    const char *path = getenv("SMELT_CUDA_DRIVER");
    d->library = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!d->library) return false;
#define X(member, symbol, params)                                                                            \
    *(void **)&d->member = dlsym(d->library, symbol);                                                        \
    if (!d->member) return false;
    LAB_DRIVER_FUNCTIONS(X)
#undef X
    if (d->cuInit(0) != 0 || d->cuDeviceGet(&d->device, 0) != 0) return false;
    int major = 0, minor = 0;
    LAB_CHECK(d, cuDeviceGetAttribute(&major, LAB_ATTRIBUTE_MAJOR, d->device));
    LAB_CHECK(d, cuDeviceGetAttribute(&minor, LAB_ATTRIBUTE_MINOR, d->device));
    LAB_CHECK(d, cuDeviceGetAttribute(&d->sms, LAB_ATTRIBUTE_SMS, d->device));
    d->arch = major * 10 + minor;
    LAB_CHECK(d, cuDevicePrimaryCtxRetain(&d->context, d->device));
    LAB_CHECK(d, cuCtxSetCurrent(d->context));
    LAB_CHECK(d, cuStreamCreate(&d->stream, LAB_STREAM_NON_BLOCKING));
    LAB_CHECK(d, cuEventCreate(&d->start, 0));
    LAB_CHECK(d, cuEventCreate(&d->end, 0));
    return true;
}

/* Milliseconds between the events around what ran on the stream. */
static double lab_elapsed(lab_driver *d) {
    float ms = 0.0f;
    LAB_CHECK(d, cuEventSynchronize(d->end));
    LAB_CHECK(d, cuEventElapsedTime(&ms, d->start, d->end));
    return (double)ms;
}

/* One kernel of `source` for the device, by NVRTC, allowed `dynamic_shared`
 * bytes of dynamic shared memory (past 48 KiB a kernel must opt in, as
 * runtime/device/device_cuda.c does). */
static lab_handle lab_load(lab_driver *d, const char *source, const char *name, uint32_t dynamic_shared) {
    cg_header header = {"smelt_kernel.h", harness_header_text};
    cg_compile_request request = {.source = source,
                                  .kernel_name = name,
                                  .headers = &header,
                                  .header_count = 1,
                                  .arch = d->arch,
                                  .want_cubin = true};
    cg_compiled compiled;
    char error[4096];
    if (!cg_compile_kernel(&request, &compiled, error, sizeof error)) fail_msg("NVRTC: %s", error);
    lab_handle module, function;
    LAB_CHECK(d, cuModuleLoadData(&module, compiled.cubin));
    LAB_CHECK(d, cuModuleGetFunction(&function, module, name));
    if (dynamic_shared > LAB_STATIC_SHARED_LIMIT)
        LAB_CHECK(d, cuFuncSetAttribute(function, LAB_FUNCTION_MAX_DYNAMIC_SHARED, (int)dynamic_shared));
    cg_compiled_free(&compiled);
    return function;
}

static const char lab_probe_source[] =
    "#include \"smelt_kernel.h\"\n"
    "/* Nothing: the cost of a launch. */\n"
    "SMELT_KERNEL void lab_empty(int unused) {}\n"
    "/* The bf16 tensor-core rate: every warp issues `rounds` x 8 independent\n"
    " * mma.sync m16n8k16 (4096 flops each) on register operands. */\n"
    "SMELT_KERNEL void lab_mma(float *out, int rounds) {\n"
    "    uint32_t a[4] = {threadIdx.x, 1u, 2u, 3u}, b[2] = {threadIdx.x, 5u};\n"
    "    float acc[8][4];\n"
    "    for (int j = 0; j < 8; j++)\n"
    "        for (int i = 0; i < 4; i++)\n"
    "            acc[j][i] = 0.0f;\n"
    "    for (int r = 0; r < rounds; r++)\n"
    "        for (int j = 0; j < 8; j++)\n"
    "            smelt_mma_m16n8k16_bf16_f32(acc[j], a, b, acc[j]);\n"
    "    float sum = 0.0f;\n"
    "    for (int j = 0; j < 8; j++)\n"
    "        sum += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];\n"
    "    if (sum == 1234.5f)\n"
    "        out[0] = sum; /* keeps the loop */\n"
    "}\n";

static void lab_measure_peaks(lab_driver *d) {
    /* Copy bandwidth: 512 MiB device to device, bytes read + written. */
    size_t bytes = 512u << 20;
    lab_cu_ptr a, b;
    LAB_CHECK(d, cuMemAlloc(&a, bytes));
    LAB_CHECK(d, cuMemAlloc(&b, bytes));
    LAB_CHECK(d, cuMemsetD8(a, 1, bytes));
    LAB_CHECK(d, cuMemcpyDtoDAsync(b, a, bytes, d->stream));
    LAB_CHECK(d, cuEventRecord(d->start, d->stream));
    enum { COPIES = 10 };
    for (int i = 0; i < COPIES; i++)
        LAB_CHECK(d, cuMemcpyDtoDAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, d->stream));
    LAB_CHECK(d, cuEventRecord(d->end, d->stream));
    double ms = lab_elapsed(d);
    d->copy_gbps = 2.0 * (double)bytes * COPIES / (ms * 1e-3) / 1e9;
    printf("gpu d2d_copy_bandwidth_GBps %.1f\n", d->copy_gbps);

    lab_handle empty = lab_load(d, lab_probe_source, "lab_empty", 0);
    lab_handle mma = lab_load(d, lab_probe_source, "lab_mma", 0);
    int unused = 0;
    void *empty_args[] = {&unused};
    enum { LAUNCHES = 2000 };
    for (int i = 0; i < 10; i++)
        LAB_CHECK(d, cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, d->stream, empty_args, NULL));
    LAB_CHECK(d, cuEventRecord(d->start, d->stream));
    for (int i = 0; i < LAUNCHES; i++)
        LAB_CHECK(d, cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, d->stream, empty_args, NULL));
    LAB_CHECK(d, cuEventRecord(d->end, d->stream));
    printf("gpu empty_launch_us %.3f\n", lab_elapsed(d) * 1e3 / LAUNCHES);

    lab_handle graph, exec;
    LAB_CHECK(d, cuStreamBeginCapture(d->stream, 1 /* thread local */));
    for (int i = 0; i < LAUNCHES; i++)
        LAB_CHECK(d, cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, d->stream, empty_args, NULL));
    LAB_CHECK(d, cuStreamEndCapture(d->stream, &graph));
    LAB_CHECK(d, cuGraphInstantiate(&exec, graph, 0));
    LAB_CHECK(d, cuGraphLaunch(exec, d->stream));
    LAB_CHECK(d, cuEventRecord(d->start, d->stream));
    LAB_CHECK(d, cuGraphLaunch(exec, d->stream));
    LAB_CHECK(d, cuEventRecord(d->end, d->stream));
    printf("gpu graph_node_us %.3f\n", lab_elapsed(d) * 1e3 / LAUNCHES);

    int rounds = 4096;
    void *mma_args[] = {&a, &rounds};
    unsigned blocks = (unsigned)d->sms * 8, threads = 256;
    LAB_CHECK(d, cuLaunchKernel(mma, blocks, 1, 1, threads, 1, 1, 0, d->stream, mma_args, NULL));
    LAB_CHECK(d, cuEventRecord(d->start, d->stream));
    LAB_CHECK(d, cuLaunchKernel(mma, blocks, 1, 1, threads, 1, 1, 0, d->stream, mma_args, NULL));
    LAB_CHECK(d, cuEventRecord(d->end, d->stream));
    ms = lab_elapsed(d);
    double flops = (double)blocks * (threads / 32) * rounds * 8 * 4096.0;
    d->tensor_tflops = flops / (ms * 1e-3) / 1e12;
    printf("gpu gemm_mma_bf16_TFLOPs %.1f\n", d->tensor_tflops);
    LAB_CHECK(d, cuMemFree(a));
    LAB_CHECK(d, cuMemFree(b));
}

/* Random floats in the storage dtype (f32, bf16, f16), small integers for
 * i32, random bytes for the rest: 8-bit codes and the packed layout of a
 * quantized weight (codes and scales alike: right for timing alone). */
static void *lab_random_bytes(smelt_dtype dtype, uint64_t bytes, uint64_t *seed) {
    uint8_t *data = calloc(1, bytes ? bytes : 1);
    assert_non_null(data);
    size_t element = smelt_dtype_element_bytes(dtype);
    bool floats = dtype == SMELT_DTYPE_F32 || dtype == SMELT_DTYPE_BF16 || dtype == SMELT_DTYPE_F16;
    if (!floats && dtype != SMELT_DTYPE_I32) element = 1;
    for (uint64_t i = 0; i + element <= bytes; i += element) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        float value = (float)((*seed >> 40) & 0xffff) / 32768.0f - 1.0f;
        if (dtype == SMELT_DTYPE_I32) {
            int32_t small = (int32_t)((*seed >> 40) % 16);
            memcpy(data + i, &small, 4);
        } else if (dtype == SMELT_DTYPE_BF16 || dtype == SMELT_DTYPE_F16) {
            uint16_t h = dtype == SMELT_DTYPE_F16 ? plan_f32_to_f16(value) : plan_f32_to_bf16(value);
            memcpy(data + i, &h, 2);
        } else if (dtype == SMELT_DTYPE_F32) {
            memcpy(data + i, &value, 4);
        } else {
            data[i] = (uint8_t)(*seed >> 40);
        }
    }
    return data;
}

/* The bytes of value v's data at T as fill_operand made them for the
 * kernels: a quantized weight's packed layout, else its elements in the
 * storage dtype. */
static uint64_t lab_filled_bytes(emit_case *c, ir_value_id v, int64_t tokens) {
    quant_format format;
    const ir_type *t = &c->m.values[v].type;
    if (ir_weight_quant(&c->m, c->m.values[v].def_op, &format)) {
        quant_layout layout;
        uint64_t matrices = t->rank == 3 ? (uint64_t)t->dims[0].size : 1, stride, total;
        assert_null(quant_stack_layout_of(&format, matrices, (uint64_t)t->dims[t->rank - 2].size,
                                          (uint64_t)t->dims[t->rank - 1].size, &layout, &stride, &total));
        return total;
    }
    uint64_t dims[IR_MAX_DIMS];
    return dims_at(c, v, tokens, dims) * smelt_dtype_element_bytes(cg_storage_dtype(&c->m, v));
}

/* One family's op at shape s on the GPU: every kernel of it that serves a
 * step of s->tokens tokens, in order. When `checked` (the family has a
 * check), the op's operands get the harness's data and its result is
 * checked; returns false when that check fails (after printing the timing). */
static bool lab_time(lab_driver *d, const lab_family *f, const lab_shape *s, const char *precision,
                     bool checked) {
    uint32_t op;
    emit_case *c = lab_case(f, s, precision, &op);
    arena strings;
    arena_init(&strings);
    cg_group_lowering l;
    if (!cg_emit_op(&c->m, op, &strings, &l, &c->d)) fail_msg("emit failed:\n%s", case_log(c));
    if (l.kind != CG_LOWER_KERNELS) {
        arena_free(&strings);
        case_free(c);
        return true;
    }
    const ir_op *o = &c->m.ops[op];
    if (checked) /* the data the host checks with: weights quantized, x rounded to its storage */
        for (uint32_t i = 0; i < o->operand_count; i++)
            fill_operand(c, o->operands[i], s->tokens);
    uint64_t seed = 42;
    lab_cu_ptr states[CG_MAX_STATES] = {0}, values[CASE_MAX_VALUES] = {0};
    for (uint32_t i = 0; i < l.state_count; i++) {
        LAB_CHECK(d, cuMemAlloc(&states[i], l.state_bytes[i] ? l.state_bytes[i] : 1));
        LAB_CHECK(d, cuMemsetD8(states[i], 0, l.state_bytes[i] ? l.state_bytes[i] : 1));
    }
    lab_handle functions[CG_MAX_KERNELS];
    bool runs[CG_MAX_KERNELS];
    void *args[CG_MAX_KERNELS][PROG_MAX_ARGS];
    lab_cu_ptr pointers[CG_MAX_KERNELS][PROG_MAX_ARGS];
    int tokens = (int)s->tokens;
    double read = 0, written = 0, weights = 0, flops = 0;
    uint32_t ran = 0;
    char names[512] = "";
    size_t names_used = 0;
    for (uint32_t k = 0; k < l.kernel_count; k++) {
        const cg_kernel *kernel = &l.kernels[k];
        const prog_launch_rule *rule = &kernel->rule;
        runs[k] = kernel_serves(kernel, s->tokens) && prog_affine_eval(rule->grid[0], s->tokens) > 0 &&
                  prog_affine_eval(rule->grid[1], s->tokens) > 0 &&
                  prog_affine_eval(rule->grid[2], s->tokens) > 0;
        if (!runs[k]) continue; /* the executor skips it at this T */
        ran++;
        if (names_used < sizeof names)
            names_used += (size_t)snprintf(names + names_used, sizeof names - names_used, "%s%s",
                                           names_used ? ", " : "", kernel->name);
        functions[k] = lab_load(d, kernel->source, kernel->name, rule->dynamic_shared_bytes);
        for (uint32_t p = 0; p < kernel->param_count; p++) {
            const cg_param *param = &kernel->params[p];
            if (param->kind == CG_PARAM_TOKENS) {
                args[k][p] = &tokens;
                continue;
            }
            if (param->kind == CG_PARAM_STATE) {
                pointers[k][p] = states[param->state];
            } else {
                uint64_t bytes = (uint64_t)prog_affine_eval(param->extent, s->tokens);
                if (!values[param->value]) {
                    LAB_CHECK(d, cuMemAlloc(&values[param->value], bytes ? bytes : 1));
                    const value_data *filled = &c->values[param->value];
                    if (!param->writes && filled->buffer && filled->tokens == s->tokens) {
                        if (lab_filled_bytes(c, param->value, s->tokens) != bytes)
                            fail_msg("%s: value %u has %llu bytes of data for an extent of %llu",
                                     kernel->name, param->value,
                                     (unsigned long long)lab_filled_bytes(c, param->value, s->tokens),
                                     (unsigned long long)bytes);
                        LAB_CHECK(d, cuMemcpyHtoD(values[param->value], filled->buffer, bytes));
                    } else if (!param->writes && filled->i && filled->tokens == s->tokens &&
                               bytes == filled->count * sizeof(int32_t)) { /* ids, positions as set */
                        LAB_CHECK(d, cuMemcpyHtoD(values[param->value], filled->i, bytes));
                    } else {
                        void *data = lab_random_bytes(cg_storage_dtype(&c->m, param->value), bytes, &seed);
                        LAB_CHECK(d, cuMemcpyHtoD(values[param->value], data, bytes));
                        free(data);
                    }
                }
                pointers[k][p] = values[param->value];
                if (!kernel->cost) *(param->writes ? &written : &read) += (double)bytes;
                if (!param->writes && c->m.ops[c->m.values[param->value].def_op].kind == IR_OP_WEIGHT)
                    weights += (double)bytes;
            }
            args[k][p] = &pointers[k][p];
        }
        if (kernel->cost) {
            read += prog_poly_eval(kernel->cost->read, (double)s->tokens, 0);
            written += prog_poly_eval(kernel->cost->written, (double)s->tokens, 0);
            flops += prog_poly_eval(kernel->cost->flops, (double)s->tokens, 0);
        } else {
            flops += prog_poly_eval(kernel->flops, (double)s->tokens, 0);
        }
    }
    enum { REPEATS = 20 };
    for (int r = -2; r < REPEATS; r++) {
        if (r == 0) LAB_CHECK(d, cuEventRecord(d->start, d->stream));
        for (uint32_t k = 0; k < l.kernel_count; k++) {
            if (!runs[k]) continue;
            const prog_launch_rule *rule = &l.kernels[k].rule;
            LAB_CHECK(d, cuLaunchKernel(functions[k], (unsigned)prog_affine_eval(rule->grid[0], s->tokens),
                                        (unsigned)prog_affine_eval(rule->grid[1], s->tokens),
                                        (unsigned)prog_affine_eval(rule->grid[2], s->tokens), rule->block[0],
                                        rule->block[1], rule->block[2], rule->dynamic_shared_bytes, d->stream,
                                        args[k], NULL));
        }
    }
    LAB_CHECK(d, cuEventRecord(d->end, d->stream));
    double seconds = lab_elapsed(d) * 1e-3 / REPEATS;
    double gbps = (read + written) / seconds / 1e9, tflops = flops / seconds / 1e12;
    printf(
        "gpu %-12s %-5s shape (%lld, %lld, %lld) T=%-3lld %u kernels %9.2f us  %8.1f GB/s (%5.1f%% of copy)"
        "  %7.2f TFLOP/s (%5.1f%% of mma)",
        f->name, precision, (long long)s->a, (long long)s->b, (long long)s->c, (long long)s->tokens, ran,
        seconds * 1e6, gbps, 100.0 * gbps / d->copy_gbps, tflops, 100.0 * tflops / d->tensor_tflops);
    if (f->report == LAB_REPORT_WEIGHTS) printf("  weights %7.1f GB/s [%s]", weights / seconds / 1e9, names);
    if (f->report == LAB_REPORT_WRITTEN) printf("  written %7.1f GB/s", written / seconds / 1e9);
    bool passed = true;
    ir_value_id result = o->results[0];
    if (checked && values[result]) {
        uint64_t bytes = lab_filled_bytes(c, result, s->tokens);
        void *host = malloc(bytes ? bytes : 1);
        assert_non_null(host);
        LAB_CHECK(d, cuMemcpyDtoH(host, values[result], bytes));
        double worst = f->check(c, op, s->tokens, host, f->tolerance);
        passed = worst <= 1.0;
        printf(passed ? "  checked: within %.0f%%" : "  FAILED its check: %.3g of the tolerance",
               passed ? worst * 100.0 : worst);
        free(host);
    }
    printf("\n");
    for (uint32_t i = 0; i < CASE_MAX_VALUES; i++)
        if (values[i]) LAB_CHECK(d, cuMemFree(values[i]));
    for (uint32_t i = 0; i < l.state_count; i++)
        LAB_CHECK(d, cuMemFree(states[i]));
    arena_free(&strings);
    case_free(c);
    return passed;
}

static void lab_gpu_run(void **state) {
    (void)state;
    static lab_driver d;
    if (!harness_have_nvrtc || !lab_open_driver(&d)) {
        printf("note: no CUDA driver or NVRTC here: the GPU half is skipped\n");
        skip();
        return;
    }
    char name[128] = "";
    LAB_CHECK(&d, cuDeviceGetName(name, sizeof name, d.device));
    printf("gpu device %s sm_%d, %d SMs\n", name, d.arch, d.sms);
    lab_measure_peaks(&d);
    int failed = 0; /* checks that failed: every timing is printed first */
    for (size_t i = 0; i < FAMILY_COUNT; i++) {
        if (lab_only && strcmp(lab_only, families[i].name) != 0) continue;
        const lab_family *f = &families[i];
        int gpu_shapes = 0;
        for (int j = 0; j < f->shape_count; j++) {
            if (lab_quick && !f->shapes[j].gpu_only) continue;
            bool checked = f->check && f->shapes[j].gpu_only && gpu_shapes++ < f->gpu_checks;
            failed += !lab_time(&d, f, &f->shapes[j], "bf16", checked);
        }
    }
    LAB_CHECK(&d, cuStreamSynchronize(d.stream));
    if (failed) fail_msg("%d of the GPU's results failed their checks", failed);
}
