#!/usr/bin/env python3
"""An independent GPTQ for tests/unit/test_quant_gptq.c: numpy, f64.

This is GPTQ as the paper's Algorithm 1 states it, without the lazy batch:
after each column is rounded, its scaled error is subtracted from *every*
later column at once (smelt's quant/gptq.c batches those updates, so
agreement checks the batching too). Groups take their scale and zero point
from their columns as updated when the group's first column is reached;
act-order processes columns by descending diag(H) (stable), with groups
over consecutive processed columns and g_idx recording each column's group.
The group rule is quant_rtn's (quant/quant.h), in f32 with the scale
rounded to f16 first:

    int4 with zero: lo = min(v, 0), hi = max(v, 0), s = f16((hi - lo) / 15),
                    z = clip(rint(-lo / s), 0, 15), q = clip(rint(v / s) + z, 0, 15)
    value           (q - z) * s

Writes tests/fixtures/quant/gptq_g16.bin and gptq_g16_act_order.bin:
little-endian, in order
    magic "GPTQFIX1"; u32 rows, cols, group, act_order, block, has_zero;
    f64 damp; f32 W[rows][cols]; f64 H[cols][cols]; u8 codes[rows][cols];
    f32 scales[rows][groups]; u8 zeros[rows][groups]; u32 g_idx[cols]
(`block` is the lazy-batch size the C side is asked to use; this script
does not batch). Run once with /work/venv/bin/python (numpy); the output
is committed.
"""
import os
import struct

import numpy as np

ROWS, COLS, GROUP, BLOCK, DAMP, TOKENS = 8, 64, 16, 40, 0.01, 256
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "quant")


def f32(x):
    return np.float32(x)


def group_params(values):
    v = values.astype(np.float32)
    lo, hi = min(f32(0), v.min()), max(f32(0), v.max())
    s = np.float32(np.float16(f32(hi - lo) / f32(15)))
    if not (s > 0 and np.isfinite(s)):
        s = f32(1)
    z = np.float32(np.clip(np.rint(f32(-lo) / s), 0, 15))
    return s, z


def encode(v, s, z):
    return np.clip(np.rint(v.astype(np.float32) / s) + z, 0, 15).astype(np.float32)


def decode(q, s, z):
    return ((q - z).astype(np.float32) * s).astype(np.float64)


def gptq(w, h, act_order):
    rows, cols = w.shape
    w, h = w.astype(np.float64).copy(), h.copy()
    order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(cols)
    dead = np.diag(h) == 0
    w[:, dead] = 0
    h[dead, dead] = 1
    w, h = w[:, order], h[order][:, order]
    h += DAMP * np.mean(np.diag(h)) * np.eye(cols)
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # H^-1 = U^T U
    groups = cols // GROUP
    codes = np.zeros((rows, cols), np.uint8)
    scales = np.zeros((rows, groups), np.float32)
    zeros = np.zeros((rows, groups), np.uint8)
    g_idx = np.zeros(cols, np.uint32)
    for i in range(cols):
        if i % GROUP == 0:
            params = [group_params(w[n, i:i + GROUP]) for n in range(rows)]
            for n in range(rows):
                scales[n, i // GROUP], zeros[n, i // GROUP] = params[n][0], params[n][1]
        s = np.array([p[0] for p in params], np.float32)
        z = np.array([p[1] for p in params], np.float32)
        q = encode(w[:, i], s, z)
        e = (w[:, i] - decode(q, s, z)) / u[i, i]
        w[:, i + 1:] -= np.outer(e, u[i, i + 1:])
        codes[:, order[i]] = q.astype(np.uint8)
        g_idx[order[i]] = i // GROUP
    return codes, scales, zeros, g_idx


def main():
    rng = np.random.default_rng(20261201)
    w = rng.standard_normal((ROWS, COLS)).astype(np.float32) * 0.1
    x = rng.standard_normal((TOKENS, COLS))
    x[:, [3, 17, 40]] *= 12.0  # outlier channels
    x[:, 5] = 0.0  # an input that is never active
    h = x.T @ x
    os.makedirs(OUT, exist_ok=True)
    for act_order, name in ((0, "gptq_g16.bin"), (1, "gptq_g16_act_order.bin")):
        codes, scales, zeros, g_idx = gptq(w, h, act_order)
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(b"GPTQFIX1")
            f.write(struct.pack("<6I", ROWS, COLS, GROUP, act_order, BLOCK, 1))
            f.write(struct.pack("<d", DAMP))
            f.write(w.astype("<f4").tobytes())
            f.write(h.astype("<f8").tobytes())
            f.write(codes.tobytes())
            f.write(scales.astype("<f4").tobytes())
            f.write(zeros.tobytes())
            f.write(g_idx.astype("<u4").tobytes())
        print(name, "written")


if __name__ == "__main__":
    main()
