/* interface.h - the model interface: the inputs and outputs through which
 * every backend (reference, codegen, the runtime's step) talks to a model,
 * declared once here.
 *
 *   role     op                    type                       at run time
 *   ids      input  {name = "ids"}  integer [tokens]           token ids of the step
 *   pos      input  {name = "pos"}  integer [tokens]           their positions
 *   logits   output {name = "logits"} float [..., vocab]       what the step returns
 *
 * The token symbol is dim 0 of ids: the one dynamic dim of generated code.
 * A future input (a block table, sequence offsets) is one more row of the
 * role table in interface.c.
 *
 * Rows. A step runs T tokens; the rows of a value are its dim 0 when that is
 * the token symbol. Not every row of logits is wanted: scoring (`smelt eval`)
 * wants all T, generation only the last. The ops marked rows(wanted) by the
 * wanted-rows pass (passes/wanted_rows.c) are the output head, which computes
 * the wanted rows alone; they must be row-wise (ir_op_row_wise).
 */
#ifndef SMELT_IR_INTERFACE_H
#define SMELT_IR_INTERFACE_H

#include "ir.h"

typedef enum ir_role { IR_ROLE_IDS, IR_ROLE_POS, IR_ROLE_LOGITS, IR_ROLE_COUNT } ir_role;

typedef struct ir_role_info {
    const char *name;    /* the op's name attribute: "ids" */
    ir_op_kind kind;     /* IR_OP_INPUT or IR_OP_OUTPUT */
    const char *summary; /* "input 'ids'", for messages */
} ir_role_info;

const ir_role_info *ir_role_info_of(ir_role role);
/* The role of live input/output op `op`, or IR_ROLE_COUNT when it plays none. */
ir_role ir_op_role(const ir_module *m, uint32_t op);
/* The first live op playing `role`, or IR_NONE. */
uint32_t ir_role_op(const ir_module *m, ir_role role);
/* The value of `role`: the input's result or the output's operand; IR_NO_VALUE when absent. */
ir_value_id ir_role_value(const ir_module *m, ir_role role);
/* The token symbol: the symbolic dim 0 of ids, or -1 when there is none. */
int32_t ir_token_symbol(const ir_module *m);
/* Is live op `op` row-wise: does row t of each result depend on row t of its
 * operands alone? Every result has the token symbol as dim 0 (and nowhere
 * else); every operand either has it as dim 0 (a row-indexed operand) or has
 * no token dim at all (a weight, a constant: read whole by every row); and
 * the op mixes no rows (a matmul's weight is not row-indexed, its x and
 * act_codes' codes and scales are; a quantize codes each row alone; an axis
 * is not 0). Attention (it reads the cache and writes it), moe (its kernels
 * may group the step's tokens by expert) and declarations are not. Safe on
 * a module that does not verify. */
bool ir_op_row_wise(const ir_module *m, uint32_t op);

#endif
