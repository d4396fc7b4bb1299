/* elaborate.h - the elaborator's state, shared by its files (internal to frontend/).
 *
 *   elaborate.c       statements: params, dims, inputs, weights, let, for, if, output
 *   elaborate_expr.c  expressions: names, literals, arithmetic, scalar functions
 *   elaborate_call.c  op calls: operands, attributes, result values
 *   elaborate_env.c   the environment (name -> value) and error reporting
 *
 * Elaboration walks the AST once, in order, with a flat environment (like
 * Python's: a name bound in a loop body stays bound after it). A value that
 * could not be computed is the poison value FE_VALUE_ERROR: its error was
 * reported once, and everything computed from it is poison too, silently.
 */
#ifndef SMELT_FE_ELABORATE_H
#define SMELT_FE_ELABORATE_H

#include "config.h"
#include "frontend.h"

/* Guards against models that would hang or exhaust memory. */
enum {
    FE_MAX_LOOP_ITERATIONS = 1000000,
    FE_MAX_OPS = 1000000,  /* Llama-3-70B has ~2,500; a runaway loop hits this in ~1 s */
    FE_MAX_NESTING = 1000, /* statements and expressions, together */
};
/* Statements and expression nodes evaluated, over all loop iterations. */
#define FE_MAX_WORK 100000000ull

typedef enum fe_value_kind {
    FE_VALUE_ERROR, /* poison: its error has been reported */
    FE_VALUE_INT,
    FE_VALUE_FLOAT,
    FE_VALUE_BOOL,
    FE_VALUE_STRING,
    FE_VALUE_TENSOR,  /* an IR value */
    FE_VALUE_DIM,     /* a symbolic dim (`dim tokens <= 8192`) */
    FE_VALUE_LIST,    /* [a, b, c] */
    FE_VALUE_RESULTS, /* the results of a multi-result op, for `let a, b = split(...)` */
    FE_VALUE_NULL,    /* null: an object param bound to nothing */
    FE_VALUE_OBJECT,  /* a config.json object (an object param's value) */
} fe_value_kind;

typedef struct fe_value fe_value;
struct fe_value {
    fe_value_kind kind;
    union {
        int64_t i;
        double f;
        bool b;
        const char *s;
        ir_value_id tensor;
        int32_t dim; /* index into ir_module.symbols */
        struct {
            fe_value *items; /* in the scratch arena */
            uint32_t count;
        } list;
        struct {
            uint32_t op; /* the op whose results these are */
            uint32_t count;
        } results;
        struct {
            const struct json_t *json; /* owned by the elaborator's config */
            const char *key;           /* the config key it is the value of, for locations */
        } object;
    } as;
};

static inline fe_value fe_error_value(void) { return (fe_value){.kind = FE_VALUE_ERROR}; }
static inline fe_value fe_int_value(int64_t i) { return (fe_value){.kind = FE_VALUE_INT, .as.i = i}; }
static inline fe_value fe_float_value(double f) { return (fe_value){.kind = FE_VALUE_FLOAT, .as.f = f}; }
static inline fe_value fe_bool_value(bool b) { return (fe_value){.kind = FE_VALUE_BOOL, .as.b = b}; }

/* "an int", "a tensor", ...: for messages. */
const char *fe_value_kind_text(fe_value_kind kind);

/* How a name came to be bound; declarations (param, dim, input) may not be
 * repeated, everything else may be rebound. */
typedef enum fe_binding_origin {
    FE_ORIGIN_PARAM,
    FE_ORIGIN_DIM,
    FE_ORIGIN_INPUT,
    FE_ORIGIN_WEIGHT,
    FE_ORIGIN_LET,
    FE_ORIGIN_LOOP,
    FE_ORIGIN_OUTPUT, /* only in the table of output names */
} fe_binding_origin;

typedef struct fe_binding_entry {
    const char *name; /* NULL: empty slot; names are the AST's, not copied */
    uint64_t hash;
    bool bound; /* false: the name was unbound again (a finished loop variable) */
    fe_value value;
    fe_binding_origin origin;
    smelt_loc loc; /* where the current binding was made */
} fe_binding_entry;

/* Open-addressing hash map name -> binding. */
typedef struct fe_name_map {
    fe_binding_entry *slots;
    uint32_t capacity; /* a power of two, or 0 */
    uint32_t used;     /* slots with a name */
} fe_name_map;

void fe_name_map_free(fe_name_map *map);
/* The binding of `name`, or NULL when unbound. */
fe_binding_entry *fe_name_map_get(const fe_name_map *map, const char *name);
/* The same for a name of `length` bytes that need not end in '\0'. */
fe_binding_entry *fe_name_map_get_bytes(const fe_name_map *map, const char *name, size_t length);
/* Binds (or rebinds) `name`; returns its entry. */
fe_binding_entry *fe_name_map_bind(fe_name_map *map, const char *name, fe_value value,
                                   fe_binding_origin origin, smelt_loc loc);
void fe_name_map_unbind(fe_name_map *map, const char *name);

typedef struct fe_elaborator {
    const ast_model *model;
    const fe_options *options;
    diag_engine *diag;
    ir_module *module;
    arena scratch;       /* lists, strings and other values; freed at the end */
    fe_name_map names;   /* the environment */
    fe_name_map outputs; /* output names, to refuse duplicates */
    fe_config config;
    uint64_t work;     /* statements and expression nodes evaluated */
    unsigned depth;    /* nesting of statements and expressions being evaluated */
    bool failed;       /* an error was found (reported or a duplicate of one) */
    bool stopped;      /* a guard tripped or the diag engine gave up: unwind */
    bool skipped_code; /* a block was skipped after an error: undefined names are
                          then poison rather than errors, to avoid cascades */
    bool last_error_shown;
    uint32_t reported_count;
    uint64_t reported[64]; /* hashes of (loc, message) shown, so that an error in a
                              loop body is reported once, not once per iteration */
} fe_elaborator;

/* Reports an error unless the same message was reported at the same loc. */
void fe_error(fe_elaborator *el, smelt_loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A note to the error just reported (dropped when that error was). */
void fe_note(fe_elaborator *el, smelt_loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Counts `units` of work (one per statement or expression node, and one per
 * 16 bytes of a name or string handled, so that huge names cannot make a loop
 * slow); false (after reporting once) when the budget is spent or elaboration
 * must stop. */
bool fe_spend_work(fe_elaborator *el, smelt_loc loc, uint64_t units);
/* The work units of handling a name or string of `length` bytes. */
static inline uint64_t fe_text_work(size_t length) { return 1 + length / 16; }
/* Enters one level of nesting (a block or an expression); false (after
 * reporting once) when too deep. Leave with el->depth--. */
bool fe_enter(fe_elaborator *el, smelt_loc loc);
/* Room for one more op; false (after reporting once) when the model is too big. */
bool fe_room_for_op(fe_elaborator *el, smelt_loc loc);

/* elaborate_expr.c */
fe_value fe_eval_expr(fe_elaborator *el, const ast_expr *e);
/* The name of a symbolic dim, for messages. */
const char *fe_dim_name(const fe_elaborator *el, const fe_value *v);

/* elaborate_call.c */
fe_value fe_eval_op_call(fe_elaborator *el, const ast_expr *call);

#endif
