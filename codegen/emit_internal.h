/* emit_internal.h - what the kernel emitters share (emit.c): the text
 * builder, the view of an op's shapes with the token dim, the kernel builder
 * that writes a kernel's comment, parameters, signature and host entry, and
 * the load/store snippets for each storage dtype. One emitter per family
 * (emit_<family>.c) declares its entry points here; emit.c dispatches to
 * them through a table indexed by op kind.
 */
#ifndef SMELT_CG_EMIT_INTERNAL_H
#define SMELT_CG_EMIT_INTERNAL_H

#include "emit.h"

#include <stdarg.h>

/* ---- text builder ------------------------------------------------------------------ */

/* A growing NUL-terminated string. cg_line indents by braces: a line that
 * starts with '}' is dedented, one that ends with '{' indents what follows. */
typedef struct cg_text {
    char *data;
    size_t length, capacity;
    int indent;   /* levels of 4 spaces */
    arena *arena; /* where data grows: the emitter's scratch arena while
                     cg_emit_group runs (so that out of memory, which unwinds
                     past every text, leaks none), else NULL: malloc */
} cg_text;

void cg_text_init(cg_text *t);
void cg_text_free(cg_text *t);
void cg_text_printf(cg_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_text_vprintf(cg_text *t, const char *fmt, va_list args);
/* One line of code, indented. */
void cg_line(cg_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_blank(cg_text *t); /* an empty line */
/* Text that goes inside a C comment: every "*" "/" pair broken, no newlines. */
void cg_text_comment_safe(cg_text *t, const char *s);

/* ---- the op being emitted ------------------------------------------------------------- */

/* A value's shape as kernels see it: dims are constants, and dim 0 may be
 * the token count T (token0), whose size is then unknown at compile time. */
typedef struct cg_shape {
    uint8_t rank;
    bool token0;               /* dims[0] is T */
    int64_t dims[IR_MAX_DIMS]; /* dims[0] is the token bound when token0 */
} cg_shape;

/* A count affine in T: per_token * T + constant (elements, rows, ...). */
typedef struct cg_count {
    int64_t per_token, constant;
} cg_count;

typedef struct cg_emit {
    const ir_module *m;
    uint32_t op;
    const ir_op *ir;
    arena *a;      /* where the kernels' strings go */
    arena scratch; /* snippets while emitting; freed after the op */
    diag_engine *d;
    int32_t token_symbol;
    cg_group_lowering *out;
    const cg_group *group; /* the group being emitted (its comment lists every op) */
    bool gemm_epilogue;    /* emit the GEMM epilogue of a GEMV group (cg_emit_gemm_epilogue) */
    bool dequant_epilogue; /* the group is a dequantize-GEMM and its adds (cg_emit_dequant_gemm_epilogue) */
} cg_emit;

/* The family emitters. Each fills e->out (kind, kernels, states) or reports
 * at the op and returns false. */
typedef bool (*cg_family_emitter)(cg_emit *e);
bool cg_emit_add_mul(cg_emit *e);    /* emit_elementwise.c */
bool cg_emit_activation(cg_emit *e); /* emit_elementwise.c: silu, gelu, tanh, sigmoid */
bool cg_emit_rms_norm(cg_emit *e);   /* emit_norm.c */
bool cg_emit_layer_norm(cg_emit *e); /* emit_norm.c */
bool cg_emit_rope(cg_emit *e);       /* emit_rope.c */
bool cg_emit_rope_table(cg_emit *e); /* emit_rope.c */
bool cg_emit_softmax(cg_emit *e);    /* emit_softmax.c */
bool cg_emit_embedding(cg_emit *e);  /* emit_embedding.c */
bool cg_emit_attention(cg_emit *e);  /* emit_attention.c */
bool cg_emit_moe(cg_emit *e);        /* emit_moe.c */
bool cg_emit_transpose(cg_emit *e);  /* emit_layout.c */
bool cg_emit_concat(cg_emit *e);     /* emit_layout.c */
bool cg_emit_split(cg_emit *e);      /* emit_layout.c */
bool cg_emit_slice(cg_emit *e);      /* emit_layout.c */
bool cg_emit_argmax(cg_emit *e);     /* emit_argmax.c */
bool cg_emit_quantize(cg_emit *e);   /* emit_quantize.c */
/* A fused group of several ops; e->op is its first. */
bool cg_emit_gemv_group(cg_emit *e, const cg_group *g); /* emit_gemv.c */
/* The tensor-core dequantize-GEMM of the quantized matmul e->group->ops[0]
 * for prefill steps (emit_dequant_gemm.c; cg_dequant_gemm_fits, emit.h,
 * says whether it takes it), with the group's adds after it in its
 * epilogue: its kernel, appended to e->out (it runs in steps of more than
 * IR_GEMV_MAX_TOKENS). */
bool cg_emit_dequant_gemm(cg_emit *e);
bool cg_emit_elementwise_chain(cg_emit *e, const cg_group *g); /* emit_elementwise.c */
bool cg_emit_add_norm(cg_emit *e, const cg_group *g);          /* emit_norm.c: {add, rms_norm | layer_norm} */
/* emit_norm.c: {rms_norm | layer_norm, quantize of its result}: the norm's
 * kernel that also writes the codes and scales of its stored output. */
bool cg_emit_norm_quantize(cg_emit *e, const cg_group *g);

/* emit_argmax.c: the plan's greedy kernel; the op is the logits' output (cg_emit_greedy). */
bool cg_emit_greedy_argmax(cg_emit *e);

/* Operand i / result i of the op. */
ir_value_id cg_operand(const cg_emit *e, uint32_t i);
ir_value_id cg_result(const cg_emit *e, uint32_t i);
/* The shape of value v; the token dim rule is checked by cg_emit_op for
 * every operand and result before an emitter runs. */
cg_shape cg_shape_of(const cg_emit *e, ir_value_id v);
/* Equal shapes (the token dim counting as one size); equal but for dim
 * `axis` (-1: none). */
bool cg_same_shape(const cg_shape *a, const cg_shape *b);
bool cg_same_shape_except(const cg_shape *a, const cg_shape *b, int axis);
/* When !ok, reports "<op>: expected <fmt...>" at the op. Returns ok. For the
 * shapes an emitter relies on: infer-shapes makes them so, and a kernel
 * would read out of bounds if they were not. */
bool cg_expect(cg_emit *e, bool ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Product of dims [from, to) of s, affine in T. */
cg_count cg_shape_count(const cg_shape *s, unsigned from, unsigned to);
/* C expression of a count: "64", "tokens", "tokens * 64", "tokens * 64 + 3". */
const char *cg_count_text(cg_emit *e, cg_count c);
/* The grid rule ceil(c / per_block) along one axis. */
prog_affine cg_count_blocks(cg_count c, int64_t per_block);

/* Name parts: a shape as its dims joined by 'x', T as 't' ("tx4x64", "64",
 * "scalar"); a count as "t64" (64 per token), "4096" or "t64p3". */
const char *cg_shape_tag(cg_emit *e, const cg_shape *s);
const char *cg_count_tag(cg_emit *e, cg_count c);
/* Declares `long long <prefix>0 .. <prefix>{rank-1}`: the coordinates of
 * the row-major element `index` of shape s (dim 0 needs no bound). */
void cg_write_coordinates(cg_text *t, const char *index, const cg_shape *s, const char *prefix);

/* Attributes, with the schema default when the op leaves one out. */
int64_t cg_attr_int(const cg_emit *e, const char *name, int64_t fallback);
double cg_attr_float(const cg_emit *e, const char *name, double fallback);
bool cg_attr_bool(const cg_emit *e, const char *name, bool fallback);
const char *cg_attr_string(const cg_emit *e, const char *name, const char *fallback);

/* The const op defining v, or UINT32_MAX when v is no constant. */
uint32_t cg_const_op(const cg_emit *e, ir_value_id v);
/* The value of const op `const_op` (0 when it has none). */
double cg_const_value(const cg_emit *e, uint32_t const_op);
/* A float literal that reads back as exactly (float)value: "0.5f",
 * "0x1.99999ap-4f", or an infinity / NaN expression. */
const char *cg_float_literal(cg_emit *e, double value);
/* A double as a name part: 1e-05 -> "1em05", 0.5 -> "0p5", -2.0 -> "m2". */
const char *cg_float_name(cg_emit *e, double value);

/* -infinity in kernel text (smelt_kernel.h has no INFINITY on the device). */
#define CG_NEGATIVE_INFINITY "__uint_as_float(0xff800000u)"

/* "f32", "bf16", "f16", "i32". */
const char *cg_dtype_name(smelt_dtype t);
/* The C element type: "float", "smelt_bf16", "smelt_f16", "int". */
const char *cg_dtype_ctype(smelt_dtype t);
/* The name part for the storage dtypes of the buffers given: one name when
 * they all agree ("f32", "bf16", "i32"), else each in order joined by '_'
 * ("bf16_bf16_f32"). */
const char *cg_dtype_tag(cg_emit *e, const ir_value_id *values, uint32_t count);

/* ---- kernel builder ----------------------------------------------------------------- */

typedef struct cg_kernel_param {
    const char *name;  /* C name of the argument */
    smelt_dtype dtype; /* element type (pointers) */
    bool is_const;     /* read only */
} cg_kernel_param;

typedef struct cg_kernel_builder {
    cg_emit *e;
    cg_kernel *k; /* the slot in e->out being filled */
    cg_kernel_param params[PROG_MAX_ARGS];
    cg_text text;
    const char *summary; /* one line on how the work is split */
    /* Where the text spells the kernel's name (comment, signature, host
     * entry): cg_kernel_end appends the source's hash there. */
    size_t name_at[4];
    uint32_t name_count;
} cg_kernel_builder;

/* Starts kernel `name` of the op in the next slot of e->out (at most
 * CG_MAX_KERNELS); summary is a sentence for the opening comment. `name` is
 * the specialisation (`rms_norm_f32_d64_eps1em05`), for people to read;
 * cg_kernel_end appends a hash of the source (`_3fa9c2d1`), so that the
 * final name is a function of the whole source and two kernels of one name
 * are one kernel (docs/design.md §4). */
void cg_kernel_begin(cg_kernel_builder *b, cg_emit *e, const char *name, const char *summary);
/* Parameters, in argument order; each returns its index. */
uint32_t cg_param_value(cg_kernel_builder *b, const char *name, ir_value_id v, bool is_const);
uint32_t cg_param_state(cg_kernel_builder *b, const char *name, uint32_t state, smelt_dtype dtype);
uint32_t cg_param_tokens(cg_kernel_builder *b);
/* State buffer `state` of op `op` of another group (its emitter's numbering). */
uint32_t cg_param_op_state(cg_kernel_builder *b, const char *name, uint32_t op, uint32_t state,
                           smelt_dtype dtype);
/* The launch: grid along x, y, z and block threads along x (y = z = 1). */
void cg_kernel_launch(cg_kernel_builder *b, prog_affine grid_x, prog_affine grid_y, uint32_t block_x);
/* Writes the opening comment and the #include; then the emitter writes its
 * constants, then cg_kernel_signature opens the body (one level indented),
 * and cg_kernel_end closes it, adds the host entry and stores the kernel. */
void cg_kernel_open(cg_kernel_builder *b);
void cg_kernel_signature(cg_kernel_builder *b);
void cg_kernel_end(cg_kernel_builder *b);

/* Snippets for parameter p: the element at `index` (a C expression) read as
 * a float (or an int for i32; an f8e4m3 KV cache state gives the code, not
 * yet times its row's scale), and a statement storing float `value` there
 * (not for f8e4m3, whose rows are quantized with their scale as a whole). */
const char *cg_load(cg_kernel_builder *b, uint32_t p, const char *index);
const char *cg_store(cg_kernel_builder *b, uint32_t p, const char *index, const char *value);
/* A statement copying element src_index of parameter src to dst_index of
 * dst: raw when the dtypes agree, converted otherwise. */
const char *cg_copy(cg_kernel_builder *b, uint32_t dst, const char *dst_index, uint32_t src,
                    const char *src_index);

/* Writes the device helpers for block-wide reductions over a block of a
 * multiple of 32 threads: warp_sum(v) and block_sum(v, scratch), and with
 * with_max warp_max and block_max; scratch is a __shared__ float[32] of the
 * caller's kernel. */
void cg_write_block_reductions(cg_text *t, bool with_max);
/* warp_max(v): the max over the 32 lanes of a warp, in every lane. */
void cg_write_warp_max(cg_text *t);
/* Writes warp_sum(v) alone: the sum over a warp's 32 lanes, in every lane. */
void cg_write_warp_sum(cg_text *t);

/* Writes a quantized weight's row reader (emit_gemv.c): the struct
 * quant_row, quant_row_at(w, row, scales, zeros, column_scales,
 * group_index) and load_weight(r, c, v[VECTOR]), which dequantizes VECTOR
 * codes from column c * VECTOR as quant_value does (one 128-bit load when
 * `vector` > 1). The kernel defines K, VECTOR, GROUP and GROUPS. */
struct quant_format;
void cg_write_quant_loader(cg_text *t, const struct quant_format *f, int vector, bool codes_only);
/* W8A8 (emit_gemv.c; the moe kernels' too): load_codes and row_scale of a
 * weight row's int8 / E4M3 codes, and activation_code. */
void cg_write_w8a8_weight_codes(cg_text *t, bool int8, int vector);
/* activation_code(v) (the code's value: an int for int8, a float for E4M3)
 * and activation_byte(v) (the code as the byte a quantize stores) of v = x / s,
 * rounded as the reference rounds it: one copy for every kernel. */
void cg_write_activation_code(cg_text *t, bool int8);

#endif
