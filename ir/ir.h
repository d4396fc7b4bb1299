/* ir.h - smelt's intermediate representation (docs/design.md §3).
 *
 * A module is a straight-line list of ops; every tensor is the result of an
 * op (inputs, weights and constants are ops too), so a pass that inserts or
 * removes work edits one list. Values are index handles (ir_value_id) into
 * the module's value table: they print as %N and survive table growth.
 * All memory of a module lives in its arena and is freed by ir_module_free.
 *
 *   ir_module_init(&m, "llama");
 *   uint32_t ids = ir_append_op(&m, IR_OP_INPUT, NULL, 0, loc);
 *   ir_op_set_string(&m, ids, "name", "ids");
 *   ...
 *   pass_infer_shapes(&m, &diag);  // fills every result type
 *
 * Op facts (names, arity, attribute schema, flags) come from ops.def only.
 */
#ifndef SMELT_IR_H
#define SMELT_IR_H

#include "arena.h"
#include "diag.h"
#include "smelt_dtype.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- dtypes ------------------------------------------------------------ */

/* Value dtypes are smelt_dtype (plan/smelt_dtype.h), the one enum that the
 * IR, the plan format and the public API share. After `precision` a value's
 * dtype is its storage dtype. */

/* ---- shapes ------------------------------------------------------------ */

enum { IR_MAX_DIMS = 6, IR_MAX_OPERANDS = 256, IR_MAX_RESULTS = 256 };

/* A dim is a constant (symbol < 0, size >= 0) or a module symbol such as
 * `tokens` (symbol = index into ir_module.symbols; size unused). */
typedef struct ir_dim {
    int64_t size;
    int32_t symbol;
} ir_dim;

static inline ir_dim ir_dim_const(int64_t size) { return (ir_dim){size, -1}; }
static inline ir_dim ir_dim_symbol(int32_t symbol) { return (ir_dim){0, symbol}; }
static inline bool ir_dim_is_symbol(ir_dim d) { return d.symbol >= 0; }
static inline bool ir_dim_equal(ir_dim a, ir_dim b) {
    return a.symbol == b.symbol && (a.symbol >= 0 || a.size == b.size);
}

typedef struct ir_type {
    smelt_dtype dtype; /* SMELT_DTYPE_UNKNOWN: not inferred yet */
    uint8_t rank;
    ir_dim dims[IR_MAX_DIMS];
} ir_type;

bool ir_type_equal(const ir_type *a, const ir_type *b);
struct ir_module;
/* A value of type `actual` may be the result that the shape rule inferred as
 * `inferred`: the types are equal, or, once `precision` has made dtypes
 * storage dtypes, equal but for two float dtypes. */
bool ir_type_matches(const struct ir_module *m, const ir_type *actual, const ir_type *inferred);

/* A symbolic dim: `dim tokens <= 8192`. */
typedef struct ir_symbol {
    const char *name;
    int64_t bound; /* inclusive upper bound, >= 1 */
    smelt_loc loc;
} ir_symbol;

/* ---- params (the bound model parameters, kept for readers of the IR) --- */

/* IR_PARAM_OBJECT and IR_PARAM_LIST are frontend-only types: an object
 * param (a config.json object such as rope_scaling) is spread into op
 * attributes by the elaborator, a list param (layer_types) is read by the
 * model's expressions; neither is kept among the module's params. */
typedef enum ir_param_type {
    IR_PARAM_INT,
    IR_PARAM_FLOAT,
    IR_PARAM_BOOL,
    IR_PARAM_STRING,
    IR_PARAM_OBJECT,
    IR_PARAM_LIST,
} ir_param_type;

typedef struct ir_param {
    const char *name;
    ir_param_type type;
    union {
        int64_t i;
        double f;
        bool b;
        const char *s;
    } value;
} ir_param;

const char *ir_param_type_name(ir_param_type t);

/* ---- attributes -------------------------------------------------------- */

typedef enum ir_attr_kind {
    IR_ATTR_NONE = 0, /* absent */
    IR_ATTR_INT,
    IR_ATTR_FLOAT,
    IR_ATTR_BOOL,
    IR_ATTR_STRING,
    IR_ATTR_INTS,
    IR_ATTR_SHAPE,
    IR_ATTR_FLOATS,
} ir_attr_kind;

const char *ir_attr_kind_name(ir_attr_kind k);

typedef struct ir_attr {
    ir_attr_kind kind;
    union {
        int64_t i;
        double f;
        bool b;
        const char *s;
        struct {
            uint32_t count;
            int64_t *items;
        } ints;
        struct {
            uint32_t count;
            ir_dim *items;
        } shape;
        struct {
            uint32_t count;
            double *items;
        } floats;
    } as;
} ir_attr;

typedef struct ir_attr_schema {
    const char *name;
    ir_attr_kind kind;
    const char *default_text; /* NULL: required */
    const char *choices;      /* "a|b" for closed STRING sets, else NULL */
} ir_attr_schema;

/* ---- ops ----------------------------------------------------------------- */

typedef enum ir_op_flags {
    IR_OPF_PURE = 1u << 0,          /* no state: CSE may merge equal ops */
    IR_OPF_ELEMENTWISE = 1u << 1,   /* result[i] depends on operand[i] only */
    IR_OPF_DECLARES_TYPE = 1u << 2, /* result type is written, not inferred */
    IR_OPF_SIDE_EFFECT = 1u << 3,   /* never removed by DCE */
    IR_OPF_STATEFUL = 1u << 4,      /* reads/writes state (KV cache): no CSE */
    IR_OPF_VIEW = 1u << 5,          /* result is operand 0's buffer seen with another shape: no kernel */
} ir_op_flags;

typedef enum ir_op_kind {
#define OP(e, name, mn, mx, nres, flags, family, attrs) IR_OP_##e,
#include "ops.def"
#undef OP
    IR_OP_COUNT
} ir_op_kind;

typedef struct ir_op_info {
    ir_op_kind kind;
    const char *name;
    int min_operands, max_operands; /* max -1: variadic */
    int results;                    /* -1: from the `sizes` attribute */
    unsigned flags;
    const char *family;
    const ir_attr_schema *attrs;
    uint32_t attr_count;
} ir_op_info;

const ir_op_info *ir_op_info_of(ir_op_kind kind);
/* NULL when `name` names no op. */
const ir_op_info *ir_op_info_by_name(const char *name);
/* Index of attribute `name` in the schema of `kind`, or -1. */
int ir_attr_slot(ir_op_kind kind, const char *name);

typedef uint32_t ir_value_id;
#define IR_NO_VALUE UINT32_MAX
/* Steps of at most this many tokens run a GEMV group (passes/fuse.c) as its
 * one fused kernel (codegen/emit_gemv.c); larger ones run its ops one by one. */
enum { IR_GEMV_MAX_TOKENS = 4 };
/* ... and, in steps of up to this many (the GEMV over tiles of
 * IR_GEMV_MAX_TOKENS), either that kernel or its ops one by one: both are in
 * the plan, and the runtime picks the cheaper on its device (plan/program.h,
 * "Choices"). */
enum { IR_GEMV_CHOICE_MAX_TOKENS = 16 };

/* An op's kernel group (set by `fuse`) or launch step (set by `schedule`)
 * before it has one, and for ops that launch nothing. */
#define IR_NONE UINT32_MAX

typedef struct ir_op {
    ir_op_kind kind;
    uint32_t operand_count;
    ir_value_id *operands;
    uint32_t result_count;
    ir_value_id *results;
    ir_attr *attrs; /* one per schema slot, ir_op_info.attr_count entries */
    smelt_loc loc;
    bool dead;      /* removed; dropped by ir_module_compact */
    uint32_t group; /* fuse: the kernel group it belongs to (ops of one group are one kernel); IR_NONE */
    uint32_t step;  /* schedule: the launch step of its group, 0.. in launch order; IR_NONE */
    /* wanted-rows: the op computes only the rows whose logits the step wants
     * (the output head: all rows when scoring, the last one when generating);
     * printed `rows(wanted)` (passes/wanted_rows.c) */
    bool wanted_rows;
} ir_op;

/* Where a value lives at run time (set by `plan-memory`). */
typedef enum ir_buffer_kind {
    IR_BUFFER_NONE = 0, /* not planned, or needs no buffer (a constant baked into its users) */
    IR_BUFFER_ARENA,    /* the activation arena, at byte `offset` */
    IR_BUFFER_WEIGHT,   /* weight-table entry `offset` (the weights' order in the module) */
} ir_buffer_kind;

typedef struct ir_buffer {
    ir_buffer_kind kind;
    uint64_t offset; /* arena byte offset, or weight index */
} ir_buffer;

typedef struct ir_value {
    ir_type type;
    ir_buffer buffer;      /* plan-memory; a reshape's result shares its operand's buffer */
    uint32_t def_op;       /* index of the defining op in ir_module.ops */
    uint32_t result_index; /* which result of that op */
} ir_value;

/* ---- module -------------------------------------------------------------- */

typedef struct ir_module {
    arena arena;
    const char *name;
    const char *source_path; /* the DSL/JSON file ops' locations refer to, or NULL */
    int32_t source_file;     /* diag file id of source_path, or -1; only op locations
                                in this file are printed (as loc(line:col)) */
    ir_param *params;
    uint32_t param_count, param_capacity;
    ir_symbol *symbols;
    uint32_t symbol_count, symbol_capacity;
    ir_op *ops; /* program order */
    uint32_t op_count, op_capacity;
    ir_value *values;
    uint32_t value_count, value_capacity;
    /* Checkpoint tensors the model knowingly leaves unused (`ignore "glob"`;
     * '*' stands for a run of characters without a '.'): weight binding
     * refuses every other tensor no weight uses. */
    const char **ignored_tensors;
    uint32_t ignored_tensor_count, ignored_tensor_capacity;
    /* Set by the lowering passes and printed with the module: */
    const char *precision;  /* precision: the policy applied ("f32", "bf16"); then every dtype is a
                               storage dtype and float ops may mix float dtypes (arithmetic is f32);
                               NULL before */
    int64_t planned_tokens; /* plan-memory: the token count per step buffers are sized for; 0: not planned */
    uint64_t arena_bytes;   /* plan-memory: bytes of the activation arena at planned_tokens */
} ir_module;

/* With a name, allocates: under a recovery point (arena.h); NULL: "model". */
void ir_module_init(ir_module *m, const char *name);
void ir_module_free(ir_module *m);

ir_param *ir_add_param(ir_module *m, const char *name, ir_param_type type);
/* Returns the new symbol's index. */
int32_t ir_add_symbol(ir_module *m, const char *name, int64_t bound, smelt_loc loc);
/* Adds an `ignore` pattern (copied); a pattern already there is not added twice. */
void ir_add_ignored_tensor(ir_module *m, const char *pattern);
/* True when the tensor `name` matches `pattern`, where '*' stands for any run
 * (possibly empty) of characters, '.' included, and every other character
 * for itself: "model.layers.*.self_attn.rotary_emb.inv_freq", "*.down_proj".
 * The one semantics of every weight-name pattern: `ignore`,
 * --allow-unused-tensor and --keep. */
bool ir_tensor_pattern_matches(const char *pattern, const char *name);
/* True when `name` matches one of m's ignored_tensors. */
bool ir_tensor_is_ignored(const ir_module *m, const char *name);
int32_t ir_find_symbol(const ir_module *m, const char *name); /* -1: none */

/* Appends an op with `result_count` fresh results of unknown type (pass
 * UINT32_MAX to take the count from the op table); returns its index.
 * Attributes start absent; see ir_op_fill_defaults. */
uint32_t ir_append_op(ir_module *m, ir_op_kind kind, const ir_value_id *operands, uint32_t operand_count,
                      uint32_t result_count, smelt_loc loc);
/* Inserts before op index `before` (shifting later ops); returns its index. */
uint32_t ir_insert_op(ir_module *m, uint32_t before, ir_op_kind kind, const ir_value_id *operands,
                      uint32_t operand_count, uint32_t result_count, smelt_loc loc);

static inline ir_op *ir_op_at(const ir_module *m, uint32_t index) { return &m->ops[index]; }
static inline ir_value *ir_value_at(const ir_module *m, ir_value_id id) { return &m->values[id]; }
static inline ir_value_id ir_op_result(const ir_module *m, uint32_t op, uint32_t i) {
    return m->ops[op].results[i];
}
const ir_op_info *ir_op_info_at(const ir_module *m, uint32_t op);

/* Attribute access by name. Setters return false if `name` is not in the
 * op's schema or has another kind (the caller reports the error). */
const ir_attr *ir_op_attr(const ir_module *m, uint32_t op, const char *name);
bool ir_op_set_attr(ir_module *m, uint32_t op, const char *name, const ir_attr *value);
bool ir_op_set_int(ir_module *m, uint32_t op, const char *name, int64_t v);
bool ir_op_set_float(ir_module *m, uint32_t op, const char *name, double v);
bool ir_op_set_bool(ir_module *m, uint32_t op, const char *name, bool v);
bool ir_op_set_string(ir_module *m, uint32_t op, const char *name, const char *v);
/* Convenience getters for attributes that are present (die otherwise). */
int64_t ir_op_int(const ir_module *m, uint32_t op, const char *name);
double ir_op_float(const ir_module *m, uint32_t op, const char *name);
bool ir_op_bool(const ir_module *m, uint32_t op, const char *name);
const char *ir_op_string(const ir_module *m, uint32_t op, const char *name);

/* A matmul's operands by role (ops.def): its bias (IR_NO_VALUE: none) and,
 * with act_codes, the codes and scales of its quantized input (else both
 * IR_NO_VALUE). The only readers of operands past the weight. */
ir_value_id ir_matmul_bias(const ir_module *m, uint32_t op);
bool ir_matmul_act_codes(const ir_module *m, uint32_t op, ir_value_id *codes, ir_value_id *scales);

/* Sets every absent attribute that has a default in the schema. */
void ir_op_fill_defaults(ir_module *m, uint32_t op);

/* Replaces every use of `from` by `to` in every op. */
void ir_replace_uses(ir_module *m, ir_value_id from, ir_value_id to);
/* Removes dead ops and renumbers def_op; value ids are kept. */
void ir_module_compact(ir_module *m);
/* Number of ops (not dead) using each value; caller frees. */
uint32_t *ir_use_counts(const ir_module *m);

/* ---- checks and dumps (verify.c, shape_rules.c, print_*.c, parse_text.c) */

/* Infers the result types of op `op` into `out` (op.result_count entries)
 * from its operands' types and attributes; on bad input reports at the op's
 * location and returns false. Operand types must be known. */
bool ir_infer_op_types(const ir_module *m, uint32_t op, ir_type *out, diag_engine *d);
/* Element count of `t` with symbols at their bounds; false on overflow. */
bool ir_type_max_elements(const ir_module *m, const ir_type *t, uint64_t *out);
/* Bytes of a value of type `t` in its storage dtype (sub-byte dtypes
 * packed), with symbol `token_symbol` at `tokens` and any other symbol at its
 * bound: what plan-memory allocates and what a kernel may touch. False on
 * overflow, a negative dim or an unknown dtype. */
bool ir_type_bytes(const ir_module *m, const ir_type *t, int32_t token_symbol, int64_t tokens, uint64_t *out);
/* ---- quantized weights (quant.c; the attributes are ops.def's) ----------- */

struct quant_format;
/* The packed format (quant/quant.h) of weight op `op` from its attributes
 * quant, group, zero, method, act_order, column_scale: false when it is not
 * quantized (quant = "none", or no weight op). No checks beyond reading:
 * the verifier checks that the format fits the weight. */
bool ir_weight_quant(const ir_module *m, uint32_t op, struct quant_format *out);
/* Writes the format into weight op `op`'s attributes (method included). */
void ir_weight_set_quant(ir_module *m, uint32_t op, const struct quant_format *f);
/* Back to unquantized: every quantization attribute at its default. */
void ir_weight_clear_quant(ir_module *m, uint32_t op);
/* Bytes of value v in storage: a quantized weight's whole packed layout
 * (codes, scales, zeros, ...: quant_layout_of; an [E, N, K] stack of MoE
 * experts, quant_stack_layout_of), else ir_type_bytes. False
 * on overflow or a format that does not fit the weight's shape. */
bool ir_value_bytes(const ir_module *m, ir_value_id v, int32_t token_symbol, int64_t tokens, uint64_t *out);
/* Does op `op` launch work on a device (a kernel or a GEMM), so that it
 * belongs to a kernel group? Declarations (ops.def family "decl": input,
 * weight, const, output) and views (IR_OPF_VIEW: reshape) do not; nor do
 * dead ops. */
bool ir_op_launches(const ir_module *m, uint32_t op);
/* Is op `op` a concatenation of weights along dim 0 (concat {axis = 0} of
 * two or more values that weight ops declare)? The weight it makes is
 * assembled at compile time (or when the parts are bound by name) and
 * launches nothing: passes/fuse.c makes them for sibling matmuls. */
bool ir_op_is_weight_concat(const ir_module *m, uint32_t op);
/* Which ops have a weight-table entry (a buffer of their own, plan-memory):
 * every weight concat, and every weight op that something other than a
 * weight concat reads (or nothing reads); a weight op read only by weight
 * concats is a part of theirs. op_count entries, malloc'd (the caller
 * frees); NULL when out of memory. */
bool *ir_weight_table_ops(const ir_module *m);
/* The view root of every value: the value whose buffer it is — itself, or
 * the operand at the end of the chain of views (IR_OPF_VIEW: reshape) that
 * defines it. value_count entries, malloc'd (the caller frees); NULL when
 * out of memory. */
ir_value_id *ir_view_roots(const ir_module *m);

/* Checks the invariants of the module; reports every violation. */
bool ir_verify(const ir_module *m, diag_engine *d);

/* ---- type text and attribute comparison (types.c) ------------------------ */

/* Buffer size that holds any type written by ir_format_type. */
enum { IR_TYPE_TEXT_MAX = 640 };
/* Writes `t` as the text IR spells it (f32[tokens, 64], f32[] for a scalar,
 * `?` when unknown) for diagnostics: symbol names are cut like DIAG_NAME.
 * Returns buffer. */
const char *ir_format_type(const ir_module *m, const ir_type *t, char *buffer, size_t size);
/* One dim: its constant or its symbol's (cut) name. Returns buffer. */
const char *ir_format_dim(const ir_module *m, ir_dim d, char *buffer, size_t size);
/* Same kind and same value; floats compare by bit pattern (0.0 != -0.0). */
bool ir_attr_equal(const ir_attr *a, const ir_attr *b);

#endif
