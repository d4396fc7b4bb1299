#!/usr/bin/env python3
"""Calibration statistics by Hugging Face transformers, for
tests/unit/test_calibrate.c: the inputs of three matmuls of the tiny
tests/fixtures/llama model, captured with forward pre-hooks while the model
runs 40 ids in consecutive windows of 16 (16, 16, 8), each window a fresh
forward pass from position 0 (as smelt's calibration runs them).

For each captured input x (all tokens of all windows) it writes mean |x|,
max |x| and XᵀX (computed in f64, stored as f32). Weights that share an
input (q/k/v) are hooked once, on q_proj. Output
tests/fixtures/quant/calib_llama.bin, little-endian:
    magic "CALIBFX1"; u32 id_count, context, record_count; u32 ids[id_count];
    per record: u32 name_length, name bytes (the weight's HF name),
                u32 cols, u32 tokens, f32 mean_abs[cols], f32 absmax[cols],
                f32 xtx[cols][cols]
Run once with /work/venv/bin/python (torch, transformers); committed.
"""
import os
import struct

import numpy as np
import torch
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "fixtures", "llama")
OUT = os.path.join(HERE, "..", "fixtures", "quant", "calib_llama.bin")
CONTEXT = 16
HOOKED = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj",
          "model.layers.1.mlp.gate_proj"]


def main():
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    ids = np.random.default_rng(7).integers(0, 97, size=40).tolist()
    captured = {name: [] for name in HOOKED}
    modules = dict(model.named_modules())
    for name in HOOKED:
        def hook(module, args, name=name):
            captured[name].append(args[0].detach().reshape(-1, args[0].shape[-1]).double())
        modules[name].register_forward_pre_hook(hook)
    with torch.no_grad():
        for begin in range(0, len(ids), CONTEXT):
            window = torch.tensor([ids[begin:begin + CONTEXT]])
            model(window, use_cache=False)
    with open(OUT, "wb") as f:
        f.write(b"CALIBFX1")
        f.write(struct.pack("<3I", len(ids), CONTEXT, len(HOOKED)))
        f.write(struct.pack(f"<{len(ids)}I", *ids))
        for name in HOOKED:
            x = torch.cat(captured[name]).numpy()
            weight = (name + ".weight").encode()
            f.write(struct.pack("<I", len(weight)) + weight)
            f.write(struct.pack("<2I", x.shape[1], x.shape[0]))
            f.write(np.abs(x).mean(0).astype("<f4").tobytes())
            f.write(np.abs(x).max(0).astype("<f4").tobytes())
            f.write((x.T @ x).astype("<f4").tobytes())
            print(name, x.shape)


if __name__ == "__main__":
    main()
