/* gguf_model.h - a GGUF model file as smelt's two inputs: its metadata as
 * the Hugging Face config.json it stands for, and its tensors as a
 * checkpoint under Hugging Face names (internal to frontend/; config.c and
 * checkpoint.c call it when a path starts with the GGUF magic).
 *
 * Architectures: "llama" (Llama 1/2/3 without rope scaling, Mistral,
 * SmolLM, TinyLlama, ...) and "qwen2" (Qwen2 and 2.5 without rope scaling),
 * both for examples/llama.smelt (model_type qwen2 gives it the q/k/v
 * biases). Their keys (shown for llama; qwen2's are "qwen2.*") become
 * config keys:
 *
 *   llama.embedding_length               hidden_size
 *   llama.block_count                    num_hidden_layers
 *   llama.feed_forward_length            intermediate_size
 *   llama.attention.head_count           num_attention_heads
 *   llama.attention.head_count_kv        num_key_value_heads
 *   llama.attention.key_length           head_dim (value_length must match)
 *   llama.attention.layer_norm_rms_epsilon  rms_norm_eps
 *   llama.rope.freq_base                 rope_theta
 *   llama.context_length                 max_position_embeddings
 *   token_embd.weight's rows             vocab_size (llama.vocab_size must match)
 *   no output.weight                     tie_word_embeddings
 *   tokenizer.ggml.bos/eos_token_id      bos_token_id / eos_token_id
 *   general.architecture                 model_type
 *
 * Every other key under "<architecture>." is refused, naming it: smelt cannot tell
 * whether it changes the computation (rope scaling, sliding windows,
 * experts, logit scales, ...). Three are accepted at their neutral values:
 * llama.rope.dimension_count equal to head_dim, llama.rope.scaling.type
 * "none" (with any other rope.scaling.* key), llama.expert_count and
 * expert_used_count 0. general.*, tokenizer.* and other namespaces do not
 * change the logits and are read no further. A file split in parts
 * (split.count > 1) and a "rope_freqs.weight" tensor (Llama 3.1's scaled
 * frequencies) are refused.
 *
 * Tensors (blk.N.X is model.layers.N.Y):
 *
 *   token_embd.weight   model.embed_tokens.weight    output_norm.weight  model.norm.weight
 *   output.weight       lm_head.weight               attn_norm.weight    input_layernorm.weight
 *   attn_q/k/v.weight   self_attn.q/k/v_proj.weight  attn_output.weight  self_attn.o_proj.weight
 *   ffn_norm.weight     post_attention_layernorm.weight
 *   ffn_gate/up/down.weight  mlp.gate/up/down_proj.weight   (and the .bias of each)
 *
 * llama.cpp's convert_hf_to_gguf.py reorders the rows of q_proj and k_proj
 * (weight and bias) of llama models (not of qwen2), within each head, from Hugging Face's
 * rotate-half order to interleaved pairs: HF row h*D + i*(D/2) + j (head h
 * of D rows, half i, index j) is stored as row h*D + 2j + i. Reading undoes
 * it, over llama.attention.head_count heads for q and head_count_kv for k.
 * A tensor no rule names keeps its GGUF name (and is then a checkpoint
 * tensor no weight uses).
 */
#ifndef SMELT_FE_GGUF_MODEL_H
#define SMELT_FE_GGUF_MODEL_H

#include "checkpoint.h"
#include "gguf.h"

struct json_t;

/* The config object of the GGUF file at path into *root (a new reference).
 * False after reporting, at the file with the byte offset of the key, a
 * missing or mistyped key, a key refused above, or an unknown
 * architecture. */
bool fe_gguf_config(const char *path, struct json_t **root, diag_engine *d);

/* One tensor of a GGUF checkpoint as st_tensor_read_f32 reads it. */
typedef struct fe_gguf_view {
    const gguf_file *file;
    const gguf_tensor *tensor;
    /* 0: rows as stored; else llama.cpp's q/k permutation undone over this many heads */
    uint32_t permute_heads;
} fe_gguf_view;

/* Opens the GGUF file at path as checkpoint ck (which st_checkpoint_open
 * has initialised, arena and path): ck->tensors are st_tensors under the
 * Hugging Face names above, with dtype and byte_size of the values as read
 * (F32, F16 and BF16 as stored, every quantized type as F32) and the shape
 * in Hugging Face order (ne reversed); each one's `gguf` points at its view.
 * The metadata is checked as fe_gguf_config checks it, whatever gives the
 * params. False after reporting. */
bool fe_gguf_checkpoint_open(st_checkpoint *ck, const char *path, diag_engine *d);
void fe_gguf_checkpoint_close(st_checkpoint *ck);

/* The whole view, dequantized and unpermuted, as f32 into dst. */
bool fe_gguf_view_read_f32(const fe_gguf_view *v, float *dst, diag_engine *d);

#endif
