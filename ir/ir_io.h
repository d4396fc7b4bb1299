/* ir_io.h - the IR's text form (its truth), and JSON and Graphviz dumps.
 *
 * Text form (print_text.c writes it, parse_text.c reads it; they round-trip
 * byte for byte):
 *
 *   module llama {
 *     source "examples/llama.smelt"
 *     param hidden_size: int = 64
 *     param rms_norm_eps: float = 1e-05
 *     dim tokens <= 8192
 *     %0 = input() {name = "ids"} : i32[tokens] loc(14:3)
 *     %1 = weight() {name = "model.embed_tokens.weight"} : f32[97, 64] loc(16:3)
 *     %2 = embedding(%1, %0) : f32[tokens, 64] loc(17:11)
 *     %3, %4 = split(%2) {axis = 1, sizes = [32, 32]} : f32[tokens, 32], f32[tokens, 32]
 *     output(%3) {name = "logits"} loc(40:3)
 *   }
 *
 * Values are numbered in order of definition. Attributes equal to their
 * schema default are omitted (the parser fills them back in). `?` is a
 * type not inferred yet. `#` starts a comment.
 */
#ifndef SMELT_IR_IO_H
#define SMELT_IR_IO_H

#include "ir.h"

#include <stdio.h>

void ir_print_text(const ir_module *m, FILE *out);
/* Parses text IR; `path` names it in diagnostics. Reports every error. */
bool ir_parse_text(const char *path, const char *text, size_t length, diag_engine *d, ir_module *out);

/* One op as the text form writes it, without indentation, loc or newline:
 * `%9 = rms_norm(%3, %4) {eps = 1e-05} : f32[tokens, 64]`. */
void ir_print_op(const ir_module *m, uint32_t op, FILE *out);
/* The op's signature: operands as their types, no results:
 * `rms_norm(f32[tokens, 64], f32[64]) {eps = 1e-05} : f32[tokens, 64]`;
 * equal for every op of the same specialisation (the layers of a model). */
void ir_print_op_signature(const ir_module *m, uint32_t op, FILE *out);

/* The module as a flat program in smelt's JSON model language
 * (docs/json.md): `smelt ir X.json` on the output prints the same text IR. */
void ir_print_json(const ir_module *m, FILE *out);
/* Graphviz: one node per op, one edge per operand. */
void ir_print_dot(const ir_module *m, FILE *out);

/* Shortest "%.*g" text that reads back as the same double, with ".0" added
 * when it would otherwise look like an integer. buffer >= 32 bytes. */
const char *ir_format_float(double v, char *buffer, size_t size);

/* The %N each value prints as: numbers[id] counts results of live ops in
 * program order; UINT32_MAX for a value no live op defines. Caller frees. */
uint32_t *ir_value_numbers(const ir_module *m);

#endif
