#!/usr/bin/env python3
"""make_quant_checkpoints.py - small pre-quantized checkpoints (AWQ, GPTQ,
FP8) in the packings those tools publish, with their own dequantization.

What it makes: tests/fixtures/quant/<name>/ for each of

    awq            AutoAWQ's GEMM layout ("version": "gemm"): 4 bits, zero
                   points, group 32
    gptq           AutoGPTQ's layout, checkpoint_format "gptq" (v1: the
                   stored zero point is zero - 1), sym, group 32, trivial
                   g_idx (desc_act false)
    gptq-actorder  the same, asymmetric, group 16, desc_act true: a g_idx
                   that is not k // group (the columns quantized in
                   decreasing order of a Hessian diagonal)
    gptq-v2        gptqmodel's checkpoint_format "gptq_v2" (zero points
                   stored as they are), asymmetric, group 32
    gptq-int8      8 bits (4 codes to a word), sym, group 32, v1
    fp8-tensor     AutoFP8 / transformers "fp8": float8_e4m3fn weights, one
                   f32 weight_scale and one f32 input_scale per Linear
                   (activation_scheme "static")
    fp8-channel    compressed-tensors "float-quantized": float8_e4m3fn
                   weights, a bf16 weight_scale [out, 1] per output channel,
                   dynamic per-token activations (no input_scale)

each holding

    config.json              the tiny llama fixture's config plus the
                             `quantization_config` as that tool writes it
    model.safetensors        the quantized tensors of two Linear layers of
                             tests/fixtures/llama (layer 0's k_proj [32, 64]
                             and v_proj [32, 64]), under their tool's names
    dequantized.safetensors  float32 [out, in] per weight, under the
                             weight's name (`...k_proj.weight`): the tool's
                             own dequantization, computed in f32 from the
                             stored f16 scales, the truth the C importer
                             (frontend/quant_checkpoint.c) must reproduce
                             bit for bit

How each format packs (written here from the published descriptions; the
script checks its own packing by unpacking it the way each tool's
dequantization does, with separate code):

  AWQ GEMM (AutoAWQ, WQLinear_GEMM): intweight [in, out] (w transposed);
    qweight int32 [in, out / 8]: word j of row k holds columns 8j..8j+7 in
    the nibble order [0, 2, 4, 6, 1, 3, 5, 7] (nibble i, bits 4i..4i+3,
    holds column 8j + order[i]); qzeros int32 [in / group, out / 8] packed
    the same way; scales f16 [in / group, out].
    w[n][k] = (q[k][n] - z[k / group][n]) * s[k / group][n].
  GPTQ (AutoGPTQ QuantLinear.pack): qweight int32 [in / 8, out]: word
    [r][n] holds rows 8r..8r+7 of input column order, nibble i = row 8r + i;
    qzeros int32 [groups, out / 8]: word [g][j] holds columns 8j..8j+7,
    nibble i = column 8j + i, of (zero - 1) in v1 ("gptq") and of zero in
    "gptq_v2"; scales f16 [groups, out]; g_idx int32 [in], the group of
    each input column. w[n][k] = (q[k][n] - z[g][n]) * s[g][n], g = g_idx[k].
    8 bits pack the same way with 4 codes (bytes) to a word: qweight
    [in / 4, out], qzeros [groups, out / 4].
  FP8: weight float8_e4m3fn [out, in]; weight_scale f32 [] (per tensor) or
    [out, 1] (per channel); w[n][k] = f32(weight[n][k]) * weight_scale[n];
    input_scale f32 [] for static activation quantization.

How to run (from the repository root; about a second):

    /work/venv/bin/python tests/reference/make_quant_checkpoints.py
    /work/venv/bin/python tests/reference/make_quant_checkpoints.py --out /tmp/q

It needs torch (for float8_e4m3fn and bfloat16), safetensors and numpy; the
build and the tests never do.
"""
import argparse
import json
import os

import numpy as np
import torch
from safetensors.numpy import load_file
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
LAYERS = ["model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj"]
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i holds column 8j + AWQ_ORDER[i]


def source_weights():
    w = load_file(os.path.join(FIXTURES, "llama", "model.safetensors"))
    return {name: w[name + ".weight"].astype(np.float32) for name in LAYERS}


def base_config():
    with open(os.path.join(FIXTURES, "llama", "config.json")) as f:
        return json.load(f)


# ---- asymmetric / symmetric 4-bit group quantization ---------------------

def group_params(w, columns_of_group, sym, bits=4):
    """Scales (f16) and integer zero points [out, groups] for the columns of
    each group, as AutoAWQ's pseudo_quantize_tensor and GPTQ's Quantizer
    choose them (min/max over the group, 0 included; scales rounded to f16,
    the dtype they are stored in, before the codes are chosen)."""
    out = w.shape[0]
    maxq = 2 ** bits - 1
    groups = len(columns_of_group)
    scales = np.zeros((out, groups), np.float16)
    zeros = np.zeros((out, groups), np.int64)
    for g, cols in enumerate(columns_of_group):
        part = w[:, cols]
        lo = np.minimum(part.min(axis=1), 0)
        hi = np.maximum(part.max(axis=1), 0)
        if sym:
            amax = np.maximum(np.abs(lo), hi)
            s = (2 * amax / maxq).astype(np.float16)
            z = np.full(out, (maxq + 1) // 2)
        else:
            s = ((hi - lo) / maxq).astype(np.float16)
            z = np.clip(np.round(-lo / s.astype(np.float32)), 0, maxq).astype(np.int64)
        assert np.all(s > 0)
        scales[:, g] = s
        zeros[:, g] = z
    return scales, zeros


def direct(q, zeros, scales, group_of_column):
    """(q - z) * s [out, in] from the unpacked values: what the packing must
    give back once unpacked."""
    return ((q - zeros[:, group_of_column]).astype(np.float32)
            * scales[:, group_of_column].astype(np.float32))


def codes_for(w, scales, zeros, group_of_column, bits=4):
    s = scales[:, group_of_column].astype(np.float32)  # [out, in]
    z = zeros[:, group_of_column]
    return np.clip(np.round(w / s) + z, 0, 2 ** bits - 1).astype(np.int64)  # [out, in]


# ---- AWQ GEMM ------------------------------------------------------------

def awq_pack_columns(values):
    """values int [rows, cols] (cols % 8 == 0) -> int32 [rows, cols / 8] in
    AWQ's interleaved nibble order."""
    rows, cols = values.shape
    packed = np.zeros((rows, cols // 8), np.uint32)
    for j in range(cols // 8):
        for i in range(8):
            packed[:, j] |= values[:, 8 * j + AWQ_ORDER[i]].astype(np.uint32) << np.uint32(4 * i)
    return packed.view(np.int32)


def awq_unpack_columns(packed):
    """AutoAWQ's unpack_awq + reverse_awq_order: shift every word by
    0, 4, ..., 28, then reorder each 8 columns by [0, 4, 1, 5, 2, 6, 3, 7]."""
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    nibbles = (packed.view(np.uint32)[:, :, None] >> shifts[None, None, :]) & 15
    nibbles = nibbles.reshape(packed.shape[0], -1).astype(np.int64)
    reverse = np.arange(nibbles.shape[1]).reshape(-1, 8)[:, [0, 4, 1, 5, 2, 6, 3, 7]].reshape(-1)
    return nibbles[:, reverse]


def make_awq(w, group):
    out, inp = w.shape
    cols = [list(range(g * group, (g + 1) * group)) for g in range(inp // group)]
    scales, zeros = group_params(w, cols, sym=False)
    q = codes_for(w, scales, zeros, np.arange(inp) // group)
    tensors = {
        "qweight": awq_pack_columns(q.T),                # [in, out / 8]
        "qzeros": awq_pack_columns(zeros.T),             # [in / group, out / 8]
        "scales": np.ascontiguousarray(scales.T),        # [in / group, out] f16
    }
    return tensors, direct(q, zeros, scales, np.arange(inp) // group)


def dequantize_awq(t, group):
    iw = awq_unpack_columns(t["qweight"])               # [in, out]
    iz = awq_unpack_columns(t["qzeros"])                # [in / group, out]
    s = t["scales"].astype(np.float32)
    iz = np.repeat(iz, group, axis=0)
    s = np.repeat(s, group, axis=0)
    return ((iw - iz).astype(np.float32) * s).T          # [out, in]


# ---- GPTQ ----------------------------------------------------------------

def gptq_pack(w, group, sym, act_order, v2, rng, bits=4):
    out, inp = w.shape
    per = 32 // bits  # codes to an int32 word
    groups = inp // group
    if act_order:
        # Columns are quantized in decreasing order of the Hessian's
        # diagonal; the i-th quantized column joins group i // group.
        hessian_diag = rng.random(inp)
        perm = np.argsort(-hessian_diag, kind="stable")
        g_idx = np.zeros(inp, np.int64)
        g_idx[perm] = np.arange(inp) // group
        assert not np.array_equal(g_idx, np.arange(inp) // group)
    else:
        g_idx = np.arange(inp) // group
    cols = [list(np.nonzero(g_idx == g)[0]) for g in range(groups)]
    scales, zeros = group_params(w, cols, sym, bits)
    q = codes_for(w, scales, zeros, g_idx, bits)        # [out, in]
    intweight = q.T.astype(np.uint32)                   # [in, out]
    qweight = np.zeros((inp // per, out), np.uint32)
    for r in range(inp // per):
        for i in range(per):
            qweight[r] |= intweight[per * r + i] << np.uint32(bits * i)
    stored = zeros.T.copy()                             # [groups, out]
    if not v2:
        # v1 stores zero - 1; a zero of 0 would wrap to -1 and spill into the
        # next nibbles (AutoGPTQ's known overflow), so the fixture has none.
        assert np.all(stored >= 1)
        stored -= 1
    qzeros = np.zeros((groups, out // per), np.uint32)
    for j in range(out // per):
        for i in range(per):
            qzeros[:, j] |= stored[:, per * j + i].astype(np.uint32) << np.uint32(bits * i)
    return {
        "qweight": qweight.view(np.int32),
        "qzeros": qzeros.view(np.int32),
        "scales": np.ascontiguousarray(scales.T),        # [groups, out] f16
        "g_idx": g_idx.astype(np.int32),
    }, direct(q, zeros, scales, g_idx)


def dequantize_gptq(t, v2, bits=4):
    """AutoGPTQ's dequantization: shift the words by 0, bits, ..., 32 - bits,
    mask, add 1 to v1 zero points, index scales and zeros by g_idx."""
    shifts = np.arange(0, 32, bits, dtype=np.uint32)
    mask = 2 ** bits - 1
    qz = t["qzeros"].view(np.uint32)
    zeros = ((qz[:, :, None] >> shifts[None, None, :]) & mask).reshape(qz.shape[0], -1).astype(np.int64)
    if not v2:
        zeros = zeros + 1
    qw = t["qweight"].view(np.uint32)
    weight = ((qw[:, None, :] >> shifts[None, :, None]) & mask).reshape(-1, qw.shape[1]).astype(np.int64)
    g = t["g_idx"].astype(np.int64)
    s = t["scales"].astype(np.float32)[g]               # [in, out]
    return ((weight - zeros[g]).astype(np.float32) * s).T


# ---- FP8 -----------------------------------------------------------------

def make_fp8(w, per_channel, scale_dtype, static_input, rng):
    tw = torch.from_numpy(w)
    if per_channel:
        amax = tw.abs().amax(dim=1, keepdim=True)       # [out, 1]
    else:
        amax = tw.abs().amax()
    scale = (amax / 448.0).to(scale_dtype)
    q = (tw / scale.float()).clamp(-448, 448).to(torch.float8_e4m3fn)
    tensors = {"weight": q, "weight_scale": scale}
    if static_input:
        tensors["input_scale"] = torch.tensor(float(rng.uniform(0.01, 0.05)), dtype=torch.float32)
    return tensors, (q.float() * scale.float()).numpy()


def dequantize_fp8(t):
    return (t["weight"].float() * t["weight_scale"].float()).numpy()


# ---- configs -------------------------------------------------------------

AWQ_CONFIG = {"bits": 4, "group_size": 32, "modules_to_not_convert": None, "quant_method": "awq",
              "version": "gemm", "zero_point": True}


def gptq_config(group, sym, desc_act, checkpoint_format, bits=4):
    return {"bits": bits, "checkpoint_format": checkpoint_format, "damp_percent": 0.01, "desc_act": desc_act,
            "group_size": group, "model_file_base_name": None, "model_name_or_path": None,
            "quant_method": "gptq", "static_groups": False, "sym": sym, "true_sequential": True}


FP8_TENSOR_CONFIG = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}

FP8_CHANNEL_CONFIG = {
    "quant_method": "compressed-tensors", "format": "float-quantized",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False,
                    "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
                    "observer_kwargs": {}},
        "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                              "dynamic": True, "group_size": None, "block_structure": None, "actorder": None,
                              "observer": None, "observer_kwargs": {}},
        "output_activations": None}},
    "ignore": ["lm_head"], "kv_cache_scheme": None, "quantization_status": "compressed",
    "global_compression_ratio": 1.5, "sparsity_config": {}, "version": "0.9.0",
}


def write(out, name, quantization_config, tensors, truth):
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    config = base_config()
    config["quantization_config"] = quantization_config
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    as_torch = {k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v)))
                for k, v in tensors.items()}
    save_file(as_torch, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    save_file({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in truth.items()},
              os.path.join(folder, "dequantized.safetensors"), metadata={"format": "pt"})


# ---- whole models: the tiny llama, every Linear of its layers quantized ----

MODEL_LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
NEW_TOKENS = 8


def greedy_logits(state, config):
    """The tiny llama's transformers model on `state` (f32): rows [9, V]
    (row 0 after the prefill of prompt.txt, row i after feeding generated
    token i) and the 8 greedy tokens, decoded with a KV cache as
    tests/reference/make_fixtures.py does; checked against one full pass."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = {k: v for k, v in config.items() if k != "quantization_config"}
    model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    with open(os.path.join(FIXTURES, "llama", "prompt.txt")) as f:
        prompt = torch.tensor([int(t) for t in f.read().strip().split(",")])
    with torch.no_grad():
        out = model(input_ids=prompt[None, :], use_cache=True)
        cache, rows, tokens = out.cache if hasattr(out, "cache") else out.past_key_values, [out.logits[0, -1]], []
        for _ in range(NEW_TOKENS):
            tokens.append(int(torch.argmax(rows[-1])))
            kwargs = {"cache": cache} if hasattr(out, "cache") else {"past_key_values": cache}
            out = model(input_ids=torch.tensor([[tokens[-1]]]), use_cache=True, **kwargs)
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            rows.append(out.logits[0, -1])
        full = model(input_ids=torch.cat([prompt, torch.tensor(tokens)])[None, :], use_cache=False).logits[0]
    rows = torch.stack(rows)
    assert torch.max(torch.abs(full[len(prompt) - 1:] - rows)) < 1e-5
    return prompt.tolist(), rows.numpy().astype(np.float32), tokens


def write_model(out, name, quantization_config, quantize, dequantize):
    """tests/fixtures/quant/<name>/: the whole tiny llama with every Linear
    of its layers quantized by `quantize` (embeddings, norms and lm_head in
    f16, as the tools leave them), and the logits of transformers' model on
    the tool's dequantized weights (f32): what smelt must compute from the
    checkpoint."""
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    source = load_file(os.path.join(FIXTURES, "llama", "model.safetensors"))
    config = base_config()
    tensors, state = {}, {}
    for key, value in source.items():
        linear = key[:-len(".weight")]
        if key.endswith(".weight") and any(linear.endswith(m) for m in MODEL_LINEARS):
            t, expected = quantize(value.astype(np.float32))
            d = dequantize(t)
            assert np.array_equal(d, expected), (name, key)
            for suffix, v in t.items():
                tensors[linear + "." + suffix] = v
            state[key] = d
        else:
            half = value.astype(np.float16)
            tensors[key] = half
            state[key] = half.astype(np.float32)
    prompt, rows, tokens = greedy_logits(state, config)
    top2 = np.sort(rows, axis=1)[:, -2:]
    gaps = top2[:, 1] - top2[:, 0]
    logit_range = float(rows.max() - rows.min())
    assert gaps[:NEW_TOKENS].min() > 1e-3 * logit_range, gaps  # the f32 bound cannot flip a token
    config["quantization_config"] = quantization_config
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    as_torch = {k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v)))
                for k, v in tensors.items()}
    save_file(as_torch, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    np.save(os.path.join(folder, "logits.npy"), rows)
    with open(os.path.join(folder, "prompt.txt"), "w") as f:
        f.write(",".join(map(str, prompt)) + "\n")
    with open(os.path.join(folder, "tokens.txt"), "w") as f:
        f.write(",".join(map(str, tokens)) + "\n")
    meta = {"source": "tests/fixtures/llama", "logit_range": logit_range,
            "min_top2_gap": float(gaps[:NEW_TOKENS].min()),
            "versions": {"torch": torch.__version__, "numpy": np.__version__}}
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(FIXTURES, "quant"))
    args = parser.parse_args()
    rng = np.random.default_rng(10)
    weights = source_weights()

    def build(name, config, quantize, dequantize):
        tensors, truth = {}, {}
        for layer, w in weights.items():
            t, expected = quantize(w)
            for suffix, v in t.items():
                tensors[layer + "." + suffix] = v
            d = dequantize(t)
            assert d.shape == w.shape and d.dtype == np.float32
            assert np.array_equal(d, expected), name  # packing and unpacking agree
            # the quantization is a faithful one: within a scale of w
            assert np.max(np.abs(d - w)) < 0.2 * np.max(np.abs(w)), name
            truth[layer + ".weight"] = d
        write(args.out, name, config, tensors, truth)

    build("awq", AWQ_CONFIG, lambda w: make_awq(w, 32), lambda t: dequantize_awq(t, 32))
    build("gptq", gptq_config(32, True, False, "gptq"),
          lambda w: gptq_pack(w, 32, True, False, False, rng), lambda t: dequantize_gptq(t, False))
    build("gptq-actorder", gptq_config(16, False, True, "gptq"),
          lambda w: gptq_pack(w, 16, False, True, False, rng), lambda t: dequantize_gptq(t, False))
    build("gptq-v2", gptq_config(32, False, False, "gptq_v2"),
          lambda w: gptq_pack(w, 32, False, False, True, rng), lambda t: dequantize_gptq(t, True))
    build("gptq-int8", gptq_config(32, True, False, "gptq", bits=8),
          lambda w: gptq_pack(w, 32, True, False, False, rng, bits=8), lambda t: dequantize_gptq(t, False, bits=8))
    build("fp8-tensor", FP8_TENSOR_CONFIG, lambda w: make_fp8(w, False, torch.float32, True, rng),
          dequantize_fp8)
    build("fp8-channel", FP8_CHANNEL_CONFIG, lambda w: make_fp8(w, True, torch.bfloat16, False, rng),
          dequantize_fp8)

    write_model(args.out, "llama-awq", AWQ_CONFIG, lambda w: make_awq(w, 32), lambda t: dequantize_awq(t, 32))
    write_model(args.out, "llama-gptq", gptq_config(32, False, True, "gptq"),
                lambda w: gptq_pack(w, 32, False, True, False, rng), lambda t: dequantize_gptq(t, False))
    write_model(args.out, "llama-fp8", FP8_TENSOR_CONFIG, lambda w: make_fp8(w, False, torch.float32, True, rng),
                dequantize_fp8)


if __name__ == "__main__":
    main()
