#!/usr/bin/env python3
"""f32 -> f16 rounding by numpy, for tests/unit/test_host_sim.c: an
independent oracle of smelt_f32_to_f16 (runtime/smelt_kernel.h) and
plan_f32_to_f16 (plan/numeric.h).

numpy's float32 -> float16 cast (npy_floatbits_to_halfbits) rounds to
nearest, ties to even, keeps subnormals, overflows to infinity and keeps
NaN a NaN. The f32 inputs cover: zeros, the edges of the f16 range
(smallest subnormal, largest subnormal, smallest normal, 65504 and the
65520 overflow tie) and their f32 neighbours; the exact midpoint between
each pair of consecutive f16 values for a spread of f16 codes (normals and
subnormals, both signs) and the f32 values one step either side of it;
infinities and NaNs; and random f32 bit patterns with exponents from far
below the f16 subnormals to far above 65504.

Output tests/fixtures/f16/numpy_float16.bin, little-endian records of
    u32 f32 bits, u16 f16 bits (numpy's)
preceded by the magic "F16NPY01" and a u32 record count.
Run once with /work/venv/bin/python (numpy); committed.
"""
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "f16", "numpy_float16.bin")


def f32_bits(values):
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def main():
    rng = np.random.default_rng(16)
    bits = []
    # Hand-picked edges, each with its f32 neighbours.
    edges = np.array([0.0, 2.0**-24, 2.0**-25, 3 * 2.0**-25, 2.0**-14 - 2.0**-24, 2.0**-14 - 2.0**-25,
                      2.0**-14, 1.0, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 0.1, 1.0 / 3.0, 2048.0, 2049.0,
                      65504.0, 65519.0, 65520.0, 65536.0, 1e5, 3.4e38], dtype=np.float32)
    for e in f32_bits(np.concatenate([edges, -edges])):
        bits.extend([int(e) - 1 if e & 0x7fffffff else int(e), int(e), int(e) + 1])
    # Midpoints between consecutive f16 values, and one f32 step either side.
    codes = np.concatenate([np.arange(0, 0x7c00, 97, dtype=np.uint32), np.arange(0, 40, dtype=np.uint32),
                            np.arange(0x3fe, 0x404, dtype=np.uint32),
                            np.arange(0x7bf0, 0x7bff, dtype=np.uint32)])
    low = codes.astype(np.uint16).view(np.float16).astype(np.float64)
    high = (codes + 1).astype(np.uint16).view(np.float16).astype(np.float64)
    mid = f32_bits((low + high) / 2)  # exact in f32: 12 significant bits
    for m in np.concatenate([mid, mid | 0x80000000]):
        bits.extend([int(m) - 1, int(m), int(m) + 1])
    # Infinities and NaNs (quiet, signalling, negative).
    bits.extend([0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7fbfffff, 0xffffffff])
    # Random patterns: exponents 2^-40 .. 2^20, any mantissa, either sign.
    exponents = rng.integers(127 - 40, 127 + 21, size=1500, dtype=np.uint32)
    mantissas = rng.integers(0, 1 << 23, size=1500, dtype=np.uint32)
    signs = rng.integers(0, 2, size=1500, dtype=np.uint32) << 31
    bits.extend(int(b) for b in signs | (exponents << 23) | mantissas)

    inputs = np.array(bits, dtype=np.uint32)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to infinity is what is tested
        halves = inputs.view(np.float32).astype(np.float16).view(np.uint16)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(b"F16NPY01")
        f.write(struct.pack("<I", len(inputs)))
        for x, h in zip(inputs.tolist(), halves.tolist()):
            f.write(struct.pack("<IH", x, h))
    print(f"wrote {OUT}: {len(inputs)} records")


if __name__ == "__main__":
    main()
