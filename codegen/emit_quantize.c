/* emit_quantize.c - the quantize op (ir/ops.def): each row of x (its last
 * dim) becomes codes with one f32 scale, what an act_codes matmul's scaled
 * GEMM and its fallback kernel read in the steps above the fused GEMV's
 * (codegen/lower.c):
 *
 *   quantize(x[..., K]) {dtype, act_scale} -> codes[..., K] of dtype, scales f32[...]
 *
 *   s        act_scale token: max_k |x[k]| / 448 (f8e4m3) or / 127 (i8), 1
 *            for a row of zeros (a NaN is no maximum: fmaxf, as the
 *            reference's comparison); tensor: act_scale_value for every row;
 *   code     activation_byte(x[k] / s) (cg_write_activation_code): E4M3
 *            rounded to nearest even, saturating, or int8 rint clamped to
 *            +-127; the division as the reference has it (a product by 1 / s
 *            can differ in the last bit), so that the codes are bit for bit
 *            those the fused GEMV and the W8A8 dequantize-GEMM compute in
 *            registers from the same x, and the reference's.
 *
 * One block per row: the threads stride over the row VECTOR (16) elements at
 * a time when K allows (two 128-bit loads of bf16 or f16 x, four of f32, and
 * one 128-bit store of 16 codes), else one; a block-wide max (warp shuffles
 * and 32 floats of shared memory) gives the row's scale, then a second pass
 * over the row, from L1 or L2 (a row is a few KB), writes the codes, and
 * thread 0 the scale. With a static scale there is one pass. The modeled
 * cost is the default one: x read once, codes and scales written once.
 *
 * A norm followed by the quantize of its output runs as one kernel instead
 * (emit_norm.c, cg_emit_norm_quantize).
 */
#include "emit_internal.h"

#include <string.h>

enum { QUANTIZE_MAX_THREADS = 256, QUANTIZE_VECTOR = 16 };

/* The loader of VECTOR elements of x's row from column c * VECTOR, as
 * floats: 128-bit loads (8 bf16 or f16, 4 f32 each), or one element. */
static void write_row_loader(cg_text *t, smelt_dtype x, int vector) {
    const char *ctype = cg_dtype_ctype(x), *name = cg_dtype_name(x);
    cg_line(t, "/* VECTOR elements of a row of x from column c * VECTOR, as floats%s. */",
            vector > 1 ? ": 128-bit loads" : "");
    cg_line(t, "SMELT_DEVICE void load_x(const %s *row, int c, float v[VECTOR])", ctype);
    cg_line(t, "{");
    if (vector > 1) {
        int per_load = x == SMELT_DTYPE_F32 ? 4 : 8;
        cg_line(t, "const uint4 *chunks = (const uint4 *)(row + (long long)c * VECTOR);");
        cg_line(t, "for (int i = 0; i < VECTOR / %d; i++)", per_load);
        cg_line(t, "    smelt_unpack_%sx%d(chunks[i], v + i * %d);", name, per_load, per_load);
    } else if (x == SMELT_DTYPE_F32) {
        cg_line(t, "v[0] = row[c];");
    } else {
        cg_line(t, "v[0] = smelt_%s_to_f32(row[c]);", name);
    }
    cg_line(t, "}");
    cg_blank(t);
}

/* The store of VECTOR codes of v / s to column c * VECTOR of a row of codes. */
static void write_code_store(cg_text *t, int vector) {
    cg_line(t, "/* The codes of v / s to column c * VECTOR of a row of codes%s. */",
            vector > 1 ? ": one 128-bit store" : "");
    cg_line(t, "SMELT_DEVICE void store_codes(uint8_t *row, int c, const float v[VECTOR], float s)");
    cg_line(t, "{");
    if (vector > 1) {
        cg_line(t, "uint32_t words[4] = {0u, 0u, 0u, 0u};");
        cg_line(t, "for (int i = 0; i < VECTOR; i++)");
        cg_line(t, "    words[i / 4] |= (uint32_t)activation_byte(v[i] / s) << (i %% 4 * 8);");
        cg_line(t, "uint4 chunk = {words[0], words[1], words[2], words[3]};");
        cg_line(t, "*(uint4 *)(row + (long long)c * VECTOR) = chunk;");
    } else {
        cg_line(t, "row[c] = activation_byte(v[0] / s);");
    }
    cg_line(t, "}");
    cg_blank(t);
}

bool cg_emit_quantize(cg_emit *e) {
    ir_value_id xv = cg_operand(e, 0), codes_v = cg_result(e, 0), scales_v = cg_result(e, 1);
    smelt_dtype xd = cg_storage_dtype(e->m, xv), cd = cg_storage_dtype(e->m, codes_v);
    cg_shape x = cg_shape_of(e, xv), codes = cg_shape_of(e, codes_v), scales = cg_shape_of(e, scales_v);
    bool int8 = cd == SMELT_DTYPE_I8;
    if (!cg_expect(e, smelt_dtype_is_float(xd) && cd == (int8 ? SMELT_DTYPE_I8 : SMELT_DTYPE_F8E4M3),
                   "float x and codes of f8e4m3 or i8") ||
        !cg_expect(e, cg_storage_dtype(e->m, scales_v) == SMELT_DTYPE_F32, "f32 scales") ||
        !cg_expect(e, x.rank >= 1 && cg_same_shape(&x, &codes), "codes of the shape of x") ||
        !cg_expect(e, scales.rank + 1 == x.rank && scales.token0 == (x.token0 && x.rank > 1),
                   "one scale per row of x"))
        return false;
    for (unsigned i = 0; i + 1 < x.rank; i++)
        if (!cg_expect(e, (i == 0 && x.token0) || scales.dims[i] == x.dims[i], "one scale per row of x"))
            return false;
    const char *act_scale = cg_attr_string(e, "act_scale", "token");
    bool per_tensor = strcmp(act_scale, "tensor") == 0;
    double static_scale = per_tensor ? cg_attr_float(e, "act_scale_value", 0.0) : 0.0;
    if (!cg_expect(e, !per_tensor || (float)static_scale > 0.0f, "act_scale_value > 0 for act_scale tensor"))
        return false;

    int64_t k = x.dims[x.rank - 1];
    int vector = k % QUANTIZE_VECTOR == 0 ? QUANTIZE_VECTOR : 1;
    int64_t chunks = k / vector;
    uint32_t threads =
        chunks >= QUANTIZE_MAX_THREADS ? QUANTIZE_MAX_THREADS : (uint32_t)((chunks + 31) / 32 * 32);
    cg_shape rows = x;
    rows.rank = (uint8_t)(x.rank - 1);
    const char *rows_tag =
        rows.rank == 1 && rows.token0
            ? ""
            : arena_printf(&e->scratch, "_rows%s", rows.rank == 0 ? "1" : cg_shape_tag(e, &rows));
    const char *scale_tag =
        per_tensor ? arena_printf(&e->scratch, "tensor%s", cg_float_name(e, static_scale)) : "token";
    const char *name = arena_printf(&e->scratch, "quantize_%s_%s_k%lld_%s%s", cg_dtype_name(xd),
                                    cg_dtype_name(cd), (long long)k, scale_tag, rows_tag);
    cg_kernel_builder b;
    cg_kernel_begin(&b, e, name,
                    per_tensor ? "One block per row: codes = code(x / s) with the static scale s of every "
                                 "row (act_scale tensor), rounded as the W8A8 kernels and the reference "
                                 "round; scales[row] = s."
                               : "One block per row: s = max |x| / CODE_MAX (1 for a row of zeros) by a "
                                 "block-wide max, then codes = code(x / s), rounded as the W8A8 kernels "
                                 "and the reference round; scales[row] = s.");
    uint32_t px = cg_param_value(&b, "x", xv, true);
    cg_param_value(&b, "codes", codes_v, false);
    cg_param_value(&b, "scales", scales_v, false);
    cg_kernel_launch(&b, cg_count_blocks(cg_shape_count(&x, 0, x.rank - 1u), 1), (prog_affine){0, 1, 1},
                     threads);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(
        t, "enum { K = %lld, THREADS = %u, VECTOR = %d, CHUNKS = K / VECTOR }; /* a row, VECTOR at a time */",
        (long long)k, threads, vector);
    if (per_tensor)
        cg_line(t, "#define ACTIVATION_SCALE %s /* act_scale tensor: every row's */",
                cg_float_literal(e, (float)static_scale));
    else
        cg_line(t, "#define CODE_MAX %s /* a row's scale: its absmax over CODE_MAX */",
                int8 ? "127.0f" : "448.0f");
    cg_blank(t);
    if (!per_tensor) cg_write_block_reductions(t, true);
    cg_write_activation_code(t, int8);
    cg_blank(t);
    write_row_loader(t, b.params[px].dtype, vector);
    write_code_store(t, vector);
    cg_kernel_signature(&b);
    cg_line(t, "long long row = blockIdx.x;");
    cg_line(t, "const %s *x_row = x + row * K;", cg_dtype_ctype(xd));
    cg_line(t, "uint8_t *code_row = (uint8_t *)codes + row * K;");
    if (per_tensor) {
        cg_line(t, "float s = ACTIVATION_SCALE;");
    } else {
        cg_line(t, "__shared__ float scratch[32];");
        cg_line(t, "/* the row's absmax (a NaN is no maximum, as in the reference) */");
        cg_line(t, "float absmax = 0.0f;");
        cg_line(t, "for (int c = threadIdx.x; c < CHUNKS; c += THREADS) {");
        cg_line(t, "float v[VECTOR];");
        cg_line(t, "load_x(x_row, c, v);");
        cg_line(t, "for (int j = 0; j < VECTOR; j++)");
        cg_line(t, "    absmax = fmaxf(absmax, fabsf(v[j]));");
        cg_line(t, "}");
        cg_line(t, "absmax = block_max(absmax, scratch);");
        cg_line(t, "float s = absmax > 0.0f ? absmax / CODE_MAX : 1.0f; /* 1 for a row of zeros */");
    }
    cg_line(t, "for (int c = threadIdx.x; c < CHUNKS; c += THREADS) {");
    cg_line(t, "float v[VECTOR];");
    cg_line(t, "load_x(x_row, c, v);");
    cg_line(t, "store_codes(code_row, c, v, s);");
    cg_line(t, "}");
    cg_line(t, "if (threadIdx.x == 0)");
    cg_line(t, "    scales[row] = s;");
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}
