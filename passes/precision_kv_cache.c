/* precision_kv_cache.c - the precision pass's choice for KV caches: the
 * storage dtype of every attention op's cache (kv_dtype, kv_scale), from
 * pass_options.kv_cache (--kv-cache). Part of `precision` (precision.c calls
 * it last), kept apart so that the weight and activation policies and this
 * one change independently.
 *
 *   auto (NULL)  kv_dtype "auto": the cache stores k and v in their own
 *                storage dtype (the activation dtype);
 *   bf16, f16, f32  the same, accepted only when that is the activation dtype
 *                (a cache in another dtype than its k and v has no kernels);
 *   fp8          kv_dtype "f8e4m3", kv_scale "per_token_head": each cached
 *                row of a kv head is E4M3 with its own f32 scale, computed
 *                when the row is written (no calibration data needed), so
 *                the cache holds D + 4 bytes per head and position where
 *                bf16 holds 2 D. Such a cache is written by the attention
 *                op's own kernel: cache_written_upto goes back to 0 (fuse
 *                does not move the write into a GEMV epilogue, whose units
 *                each see one element of the row, never its max).
 * Idempotent: running it again sets the same attributes.
 */
#include "pass.h"

#include <string.h>

bool pass_precision_kv_cache(ir_module *m, const char *kv_cache, const char *policy, diag_engine *d) {
    const char *choice = kv_cache ? kv_cache : "auto";
    bool fp8 = strcmp(choice, "fp8") == 0;
    if (!fp8 && strcmp(choice, "auto") != 0 && strcmp(choice, policy) != 0) {
        if (strcmp(choice, "bf16") == 0 || strcmp(choice, "f16") == 0 || strcmp(choice, "f32") == 0)
            diag_error(d, SMELT_NO_LOC,
                       "a KV cache in %s needs %s activations (the precision policy is '%s'); "
                       "--kv-cache takes auto, fp8 or the activation dtype",
                       choice, choice, policy);
        else
            diag_error(d, SMELT_NO_LOC, "unknown KV cache dtype '%.*s%s'; known: auto, bf16, f16, f32, fp8",
                       DIAG_NAME(choice));
        return false;
    }
    for (uint32_t i = 0; i < m->op_count; i++) {
        if (m->ops[i].dead || m->ops[i].kind != IR_OP_ATTENTION) continue;
        ir_op_set_string(m, i, "kv_dtype", fp8 ? "f8e4m3" : "auto");
        ir_op_set_string(m, i, "kv_scale", fp8 ? "per_token_head" : "none");
        if (fp8) ir_op_set_int(m, i, "cache_written_upto", 0);
    }
    return true;
}
