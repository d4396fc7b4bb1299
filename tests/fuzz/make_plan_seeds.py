#!/usr/bin/env python3
"""Regenerates the plan harness's seeds, tests/fuzz/corpus/plan/seed-*.plan.

    tests/fuzz/make_plan_seeds.py SMELT [CORPUS]

SMELT is a built `smelt` (build/cli/smelt); CORPUS defaults to
tests/fuzz/corpus/plan beside this script. The seeds are real plans of a
micro llama (one layer, hidden 32, 2 query heads and 1 KV head of 16 dims,
MLP 64, vocab 40, 32 positions, steps of at most 4 tokens), compiled for
the host alone, in f32 and in fp8 (W8A8), each without weights and with
them (a checkpoint this script writes: values from a fixed formula, so the
same seeds every time); and the GPT-2 fixture's config under int4-rtn
without weights (int4 weights, transposed Conv1D ones among them). Most of each plan is its kernels' sources and host
object, which the model's size hardly changes: 90 to 160 KB. Run it
whenever the plan format or the program format changes (docs/fuzzing.md),
then replay them: ctest -R fuzz/plan.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "vocab_size": 40,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "max_position_embeddings": 32,
    "tie_word_embeddings": False,
    "attention_bias": False,
}


def tensor_shapes():
    d, f, v = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["vocab_size"]
    kv = CONFIG["num_key_value_heads"] * CONFIG["head_dim"]
    q = CONFIG["num_attention_heads"] * CONFIG["head_dim"]
    layer = "model.layers.0."
    return {
        "model.embed_tokens.weight": [v, d],
        layer + "input_layernorm.weight": [d],
        layer + "self_attn.q_proj.weight": [q, d],
        layer + "self_attn.k_proj.weight": [kv, d],
        layer + "self_attn.v_proj.weight": [kv, d],
        layer + "self_attn.o_proj.weight": [d, q],
        layer + "post_attention_layernorm.weight": [d],
        layer + "mlp.gate_proj.weight": [f, d],
        layer + "mlp.up_proj.weight": [f, d],
        layer + "mlp.down_proj.weight": [d, f],
        "model.norm.weight": [d],
        "lm_head.weight": [v, d],
    }


def write_checkpoint(path):
    """A safetensors file of f32 tensors: norms 1, the rest small values
    from a formula (no randomness: the seeds are reproducible)."""
    header, data = {}, bytearray()
    for index, (name, shape) in enumerate(sorted(tensor_shapes().items())):
        count = 1
        for size in shape:
            count *= size
        if name.endswith("norm.weight"):
            values = [1.0] * count
        else:
            values = [((i * 37 + index * 11) % 23 - 11) / 64.0 for i in range(count)]
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + 4 * count]}
        data += struct.pack("<%df" % count, *values)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(data))


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    smelt = os.path.abspath(sys.argv[1])
    here = os.path.dirname(os.path.abspath(__file__))
    corpus = sys.argv[2] if len(sys.argv) == 3 else os.path.join(here, "corpus", "plan")
    root = os.path.join(here, "..", "..")
    corpus = os.path.abspath(corpus)
    with tempfile.TemporaryDirectory() as scratch:
        config = os.path.join(scratch, "config.json")
        with open(config, "w") as f:
            json.dump(CONFIG, f)
        weights = os.path.join(scratch, "model.safetensors")
        write_checkpoint(weights)
        for precision in ("f32", "fp8"):
            for with_weights in (False, True):
                name = "seed-llama-micro-%s%s.plan" % (precision, "-weights" if with_weights else "")
                command = [smelt, "compile", "examples/llama.smelt", "--config", config, "--target", "host",
                           "--precision", precision, "--max-step-tokens", "4", "--no-cache", "-o",
                           os.path.join(corpus, name)]
                if with_weights:
                    command[3:3] = ["--weights", weights]
                # from the repository's root: the manifest names the source as given
                subprocess.run(command, check=True, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                size = os.path.getsize(os.path.join(corpus, name))
                print("%s: %d bytes" % (name, size))
        # GPT-2's fixture under int4-rtn, without weights: quantized weights
        # (interleaved and not) and transposed ones (its Conv1D projections)
        name = "seed-gpt2-int4.plan"
        subprocess.run([smelt, "compile", "examples/gpt2.smelt", "--config", "tests/fixtures/gpt2/config.json",
                        "--target", "host", "--precision", "int4-rtn", "--max-step-tokens", "4", "--no-cache",
                        "-o", os.path.join(corpus, name)],
                       check=True, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print("%s: %d bytes" % (name, os.path.getsize(os.path.join(corpus, name))))


if __name__ == "__main__":
    main()
