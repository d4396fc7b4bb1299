/* plan_print.h - what `smelt inspect` prints for a plan: the container
 * (format and smelt versions, the content hash to pin, the section table)
 * and then each section's contents, by a printer per section kind.
 *
 *   plan_print(stdout, &plan, &(plan_print_options){0}, error, sizeof error);
 *
 * Section printers live in a table indexed by kind (plan_print.c). The
 * manifest and the kernel table are printed here; a section whose printer is
 * not written yet (launch program, memory plan, weights, tokenizer) is shown
 * by its size only, until its decoder adds a printer to the table.
 */
#ifndef SMELT_PLAN_PRINT_H
#define SMELT_PLAN_PRINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "plan_read.h"

typedef struct plan_print_options {
    bool kernel_source; /* print every kernel's full CUDA C source */
} plan_print_options;

/* Prints one section's contents (data[size], already checksum-verified but
 * not decoded). False, with a message into error, when the contents cannot
 * be decoded; whatever could be printed has been. */
typedef bool (*plan_section_printer)(FILE *out, const plan_file *plan, const uint8_t *data, uint64_t size,
                                     const plan_print_options *options, char *error, size_t error_size);

/* The whole plan: header, section table, every section in kind order. False
 * when some section could not be decoded (error holds the first such
 * message) or the output could not be written; the rest is still printed. */
/* Text from a plan as the printers write it: control bytes (and DEL) as
 * \xNN, so that a hostile name cannot drive the terminal; line breaks kept
 * only when `newlines`. Every name or text a printer takes from a plan goes
 * through it. */
void plan_print_escaped(FILE *out, const char *data, uint64_t length, bool newlines);

bool plan_print(FILE *out, const plan_file *plan, const plan_print_options *options, char *error,
                size_t error_size);

/* The header and section table alone. */
void plan_print_header(FILE *out, const plan_file *plan);

bool plan_print_manifest(FILE *out, const plan_file *plan, const uint8_t *data, uint64_t size,
                         const plan_print_options *options, char *error, size_t error_size);
bool plan_print_kernels(FILE *out, const plan_file *plan, const uint8_t *data, uint64_t size,
                        const plan_print_options *options, char *error, size_t error_size);

/* program_print.c: the launch program (with its weight table) and the
 * memory plan. */
bool plan_print_program(FILE *out, const plan_file *plan, const uint8_t *data, uint64_t size,
                        const plan_print_options *options, char *error, size_t error_size);
bool plan_print_memory(FILE *out, const plan_file *plan, const uint8_t *data, uint64_t size,
                       const plan_print_options *options, char *error, size_t error_size);
/* "ceil(T * 4 / 1)", "ceil((T * 4 + 3) / 8)", or "256" for a constant,
 * into text[size]. */
void plan_affine_format(plan_affine rule, char *text, size_t size);

#endif
