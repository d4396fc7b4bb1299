/* quant_checkpoint.h - pre-quantized checkpoints: AWQ, GPTQ and FP8
 * safetensors, unpacked into quant.h's layout without re-quantizing.
 *
 *   qck_scheme s;
 *   if (!qck_scheme_of_config(&config, &s, &diag)) return false;    // reported
 *   qck_weight w;
 *   switch (qck_read_weight(&s, &checkpoint, "model.layers.0.self_attn.q_proj.weight", &w, &diag)) {
 *   case QCK_QUANTIZED: ... w.tensor (quant.h) ...; qck_weight_free(&w); break;
 *   case QCK_NOT_QUANTIZED: ... the plain float tensor of that name ...; break;
 *   case QCK_FAILED: return false;                                    // reported
 *   }
 *
 * What a checkpoint is comes from config.json's "quantization_config"
 * (docs/quantization.md, "Pre-quantized checkpoints"):
 *
 *   quant_method "awq"   AutoAWQ, version "gemm", 4 bits, zero points.
 *     Tensors of a Linear `P` (its weight is `P.weight`): P.qweight I32
 *     [in, out/8], P.qzeros I32 [in/group, out/8], each word holding 8
 *     output columns in AWQ's nibble order [0, 2, 4, 6, 1, 3, 5, 7];
 *     P.scales F16 [in/group, out].
 *   quant_method "gptq"  AutoGPTQ / gptqmodel, 4 bits (8 bits: 4 codes to
 *     a word in place of 8, symmetric only, read as quant.h's int8). P.qweight I32
 *     [in/8, out] (8 input rows a word, row 8r+i in nibble i); P.qzeros I32
 *     [groups, out/8] (column 8j+i in nibble i), holding zero - 1 when
 *     checkpoint_format is "gptq" (v1, the default) and the zero itself for
 *     "gptq_v2"; P.scales F16 [groups, out]; P.g_idx I32 [in], each input
 *     column's group (required with desc_act; without it it must be the
 *     trivial k / group when present).
 *   quant_method "fp8" (AutoFP8, transformers) or "compressed-tensors" with
 *     format "float-quantized": P.weight F8_E4M3 [out, in], P.weight_scale
 *     (F32, BF16 or F16) per tensor ([] or [1]) or per output channel
 *     ([out, 1] or [out]), P.input_scale ([] or [1]) exactly when the
 *     activations are quantized statically.
 *
 * Every key of quantization_config (and of compressed-tensors' nested
 * objects) is either read here, known to have no effect on the weights'
 * values (provenance such as damp_percent, kernel choices such as
 * use_exllama, and module lists that the tensors themselves answer), or
 * refused by name; values smelt cannot load exactly are refused too.
 *
 * The weight in quant.h's layout, rows = out, cols = in, method
 * QUANT_METHOD_CHECKPOINT, exactly the values the tool's own dequantization
 * computes in f32:
 *   AWQ, GPTQ   int4 codes; the f16 scales copied bit for bit; zero points
 *               as 4-bit codes (a GPTQ v1 zero that unpacks to 16 is
 *               refused); GPTQ with sym true stores no zeros (every zero
 *               must be 8: quant.h's symmetric int4); with desc_act its
 *               g_idx is the group_index section.
 *   GPTQ 8-bit  int8 codes q - 128 (every zero must be 128), f16 scales.
 *   FP8 channel the E4M3 bytes as codes, one f16 scale per row: a scale
 *               f16 cannot hold exactly is refused (bf16 and f16 scales
 *               always fit in f16's range of normal numbers).
 *   FP8 tensor  the E4M3 bytes, scales of 1 and the per-tensor f32 scale as
 *               the column scale of every column: (e4m3 * 1) * S is the
 *               f32 product e4m3 * S.
 * Each tensor's dtype and shape are checked against the others and the
 * config, each value range too (codes of NaN, g_idx past the groups, non-
 * finite scales); an error names the tensor and its file.
 */
#ifndef SMELT_FE_QUANT_CHECKPOINT_H
#define SMELT_FE_QUANT_CHECKPOINT_H

#include "checkpoint.h"
#include "config.h"
#include "quant.h"

typedef enum qck_method {
    QCK_METHOD_NONE = 0, /* no quantization_config: every weight is a float tensor */
    QCK_METHOD_AWQ,
    QCK_METHOD_GPTQ,
    QCK_METHOD_FP8,
} qck_method;

typedef struct qck_scheme {
    qck_method method;
    /* The format of every quantized weight of the checkpoint; group 0 means
     * one group per output channel (group_size -1, FP8), which a weight's
     * own format has as group = its input columns. */
    quant_format format;
    bool zeros_minus_one;  /* GPTQ v1: qzeros hold zero - 1 */
    bool fp8_per_channel;  /* weight_scale per output channel, else per tensor */
    bool fp8_static_input; /* input_scale tensors: static per-tensor activation scales */
} qck_scheme;

/* "none", "awq", "gptq", "fp8". */
const char *qck_method_name(qck_method m);

/* The scheme of c's "quantization_config" (QCK_METHOD_NONE when there is
 * none or it is null). False after reporting every problem, each at the
 * key in the config. */
bool qck_scheme_of_config(const fe_config *c, qck_scheme *out, diag_engine *d);

typedef enum qck_result {
    QCK_FAILED,        /* reported */
    QCK_NOT_QUANTIZED, /* the weight is a plain float tensor of its own name */
    QCK_QUANTIZED,     /* *out holds it */
} qck_result;

typedef struct qck_weight {
    quant_tensor tensor;  /* data malloc'd, layout.total bytes */
    bool has_input_scale; /* FP8 with static activations */
    float input_scale;    /* x is quantized as e4m3(x / input_scale) */
} qck_weight;

/* The largest number of checkpoint tensors one quantized weight reads. */
enum { QCK_MAX_TENSORS = 4 };

/* Checkpoint indices (into ck->tensors) of the tensors that hold weight
 * `weight_name` under scheme s, for marking them used: the quantized ones
 * when there are, else the plain tensor of that name when there is one.
 * Returns the count (0..QCK_MAX_TENSORS). */
uint32_t qck_weight_tensors(const qck_scheme *s, const st_checkpoint *ck, const char *weight_name,
                            uint32_t indices[QCK_MAX_TENSORS]);

/* Reads and unpacks weight `weight_name` (a Linear's "P.weight"). Errors at
 * the checkpoint's files. On QCK_QUANTIZED free *out with qck_weight_free. */
qck_result qck_read_weight(const qck_scheme *s, const st_checkpoint *ck, const char *weight_name,
                           qck_weight *out, diag_engine *d);
void qck_weight_free(qck_weight *w);

/* The checks of qck_read_weight without reading any data: on
 * QCK_QUANTIZED, *rows x *cols is the weight's [out, in]. */
qck_result qck_weight_shape(const qck_scheme *s, const st_checkpoint *ck, const char *weight_name,
                            uint64_t *rows, uint64_t *cols, diag_engine *d);

/* The format weight `weight_name` is stored in (qck_weight_shape's checks):
 * on QCK_QUANTIZED, s->format with the group of a per-channel scheme set to
 * the weight's input columns, *rows x *cols its [out, in]. What the
 * precision pass gives the weight op (method "checkpoint") before the
 * driver copies qck_read_weight's bytes into the plan. */
qck_result qck_weight_format(const qck_scheme *s, const st_checkpoint *ck, const char *weight_name,
                             quant_format *out, uint64_t *rows, uint64_t *cols, diag_engine *d);

/* The format of every live weight op of m (formats[op], m->op_count
 * entries; kind QUANT_NONE for ops that are no weight or whose tensor is a
 * plain float one) from checkpoint ck of scheme s: what the precision pass
 * keeps for pre-quantized weights. Stacked weights (MoE experts) get none:
 * the layout holds one matrix, so their parts stay float and bind
 * dequantized (fe_bind_weights_quantized), exactly. False after reporting. */
bool qck_module_formats(const ir_module *m, const qck_scheme *s, const st_checkpoint *ck,
                        quant_format *formats, diag_engine *d);

/* The scheme of the config at `path` (NULL: none, QCK_METHOD_NONE): a
 * config.json, or a GGUF file (which has no quantization_config). */
bool qck_scheme_of_file(const char *path, qck_scheme *out, diag_engine *d);

#endif
