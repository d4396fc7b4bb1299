#!/usr/bin/env python3
"""Writes the GGUF fixtures of tests/fixtures/gguf with PyPI's `gguf` package.

    /work/venv/bin/python tests/reference/make_gguf_fixtures.py [OUT_DIR]

quants.gguf               one tensor per type smelt reads (F32, F16, BF16,
                          Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K), each 4 rows
                          of 512 values, from seeded random blocks (random
                          bytes, with every f16 scale replaced by a finite
                          random half, so that every bit pattern of the
                          quantized values occurs)
quants_expected.safetensors  the same names, F32: what gguf-py's own
                          gguf.quants.dequantize makes of each tensor - the
                          truth tests/unit/test_gguf.c compares smelt with
llama.gguf                tests/fixtures/llama's model as llama.cpp's
                          convert_hf_to_gguf.py would write it (F32 tensors
                          under GGUF names, q_proj/k_proj rows permuted, the
                          hyperparameters as llama.* metadata), so smelt must
                          give that fixture's logits from it without a config
llama_q8_0.gguf           the same model with every 2-dim weight in Q8_0
                          (the ref backend and the host plan must agree on it)
qwen2.gguf                tests/fixtures/qwen2's model as the converter writes
                          a qwen2 (q/k/v biases, tied embeddings, no permutation)

Deterministic: the same inputs give the same bytes.
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize
from safetensors.numpy import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")

ROWS, COLS = 4, 512

# Byte offsets of the f16 scales in one block of each quantized type.
F16_SCALES = {
    T.Q8_0: [0],
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}


def random_halves(rng, n):
    """Finite f16 values across the whole range, subnormals and zeros included."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    exponent = (bits >> 10) & 0x1F
    bits = np.where(exponent == 0x1F, bits & 0x83FF, bits)  # no inf/nan: exponent 31 -> 0
    return bits.astype(np.uint16)


def quantized_tensor(rng, qtype):
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = ROWS * COLS // block
    raw = rng.integers(0, 256, size=(blocks, type_size), dtype=np.uint16).astype(np.uint8)
    for offset in F16_SCALES[qtype]:
        # scales of moderate size, so that products stay finite and normal
        scale = (rng.standard_normal(blocks) * 0.05).astype(np.float16)
        raw[:, offset:offset + 2] = scale.view(np.uint8).reshape(blocks, 2)
    return raw.reshape(ROWS, COLS // block * type_size)


def write_quants(out):
    rng = np.random.default_rng(12)
    writer = gguf.GGUFWriter(os.path.join(out, "quants.gguf"), "test")
    expected = {}

    f32 = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    f32[0, :4] = [0.0, -0.0, 1e-40, -3.0e38]  # a subnormal and a large value
    writer.add_tensor("f32", f32)
    expected["f32"] = dequantize(f32.view(np.uint8), T.F32).reshape(ROWS, COLS)

    f16 = random_halves(rng, ROWS * COLS).reshape(ROWS, COLS)
    f16[0, :2] = [0x7C00, 0xFC00]  # +inf, -inf
    writer.add_tensor("f16", f16.view(np.float16))
    expected["f16"] = dequantize(f16.view(np.uint8), T.F16).reshape(ROWS, COLS)

    bf16 = rng.integers(0, 1 << 16, size=(ROWS, COLS), dtype=np.uint32).astype(np.uint16)
    bf16 = np.where(((bf16 >> 7) & 0xFF) == 0xFF, bf16 & 0x807F, bf16).astype(np.uint16)  # no inf/nan
    writer.add_tensor("bf16", bf16.view(np.uint8), raw_dtype=T.BF16)
    expected["bf16"] = dequantize(bf16.view(np.uint8), T.BF16).reshape(ROWS, COLS)

    for qtype in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K, T.Q6_K):
        raw = quantized_tensor(rng, qtype)
        name = qtype.name.lower()
        writer.add_tensor(name, raw, raw_dtype=qtype)
        expected[name] = dequantize(raw, qtype).reshape(ROWS, COLS).astype(np.float32)

    # Q8_0 and Q4_1 as llama.cpp's quantizer writes them, from smooth values.
    values = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    for qtype in (T.Q8_0, T.Q4_1, T.Q4_0):
        raw = quantize(values, qtype)
        name = "quantized_" + qtype.name.lower()
        writer.add_tensor(name, raw, raw_dtype=qtype)
        expected[name] = dequantize(raw, qtype).reshape(ROWS, COLS).astype(np.float32)

    writer.add_uint32("test.u32", 7)
    writer.add_float32("test.f32", 0.25)
    writer.add_string("test.string", "tensors of every type")
    writer.add_array("test.strings", ["a", "bc", ""])
    writer.add_array("test.ints", [1, -2, 3])
    writer.add_bool("test.bool", True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in expected.items()},
              os.path.join(out, "quants_expected.safetensors"))


def permute(weights, n_head):
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py): within each
    head, rows from rotate-half order to interleaved pairs."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
MODEL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf):
    if hf in MODEL_NAMES:
        return MODEL_NAMES[hf]
    parts = hf.split(".")
    assert parts[:2] == ["model", "layers"], hf
    return "blk.%s.%s" % (parts[2], LAYER_NAMES[".".join(parts[3:])])


def write_model(out, name, fixture, arch, qtype):
    """The fixture's model as convert_hf_to_gguf.py writes `arch`: only
    llama (its LlamaModel) permutes q/k rows."""
    src = os.path.join(FIXTURES, fixture)
    config = json.load(open(os.path.join(src, "config.json")))
    tensors = load_file(os.path.join(src, "model.safetensors"))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    permuted = arch == "llama"
    writer = gguf.GGUFWriter(os.path.join(out, name), arch)
    writer.add_name("smelt tiny %s fixture" % fixture)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(config.get("rope_theta") or config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(0 if qtype == T.F32 else 7)
    if config.get("bos_token_id") is not None:
        writer.add_bos_token_id(config["bos_token_id"])
    if config.get("eos_token_id") is not None:
        writer.add_eos_token_id(config["eos_token_id"])
    for hf in sorted(tensors):
        data = tensors[hf].astype(np.float32)
        if permuted and hf.endswith(("q_proj.weight", "q_proj.bias")):
            data = permute(data, heads)
        elif permuted and hf.endswith(("k_proj.weight", "k_proj.bias")):
            data = permute(data, kv_heads)
        if qtype != T.F32 and data.ndim == 2:
            writer.add_tensor(gguf_name(hf), quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name(hf), np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(FIXTURES, "gguf")
    os.makedirs(out, exist_ok=True)
    write_quants(out)
    write_model(out, "llama.gguf", "llama", "llama", T.F32)
    write_model(out, "llama_q8_0.gguf", "llama", "llama", T.Q8_0)
    write_model(out, "qwen2.gguf", "qwen2", "qwen2", T.F32)
    for f in sorted(os.listdir(out)):
        print("%-30s %8d bytes" % (f, os.path.getsize(os.path.join(out, f))))


if __name__ == "__main__":
    main()
