#!/usr/bin/env python3
"""Writes tests/corpus/gguf/*.gguf: malformed GGUF files, each of which
`smelt run examples/llama.smelt --weights FILE` must refuse with an error
(tests/corpus/run.sh; under the sanitizer build in tools/test.sh), never a
crash. Each is one defect in an otherwise valid tiny llama (valid.gguf is
written to --valid DIR only, for checking that the base runs).

    python3 tests/corpus/make_gguf_corpus.py [--valid DIR]

Plain Python (struct), no packages: the bytes are spelled out here.
"""
import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gguf")

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
T_F32, T_Q8_0 = 0, 8
HIDDEN, FFN, HEADS, VOCAB = 32, 32, 2, 8


def string(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    fmt = {U8: "<B", U32: "<I", F32: "<f", BOOL: "<B", U64: "<Q", I32: "<i"}
    body = string(value) if vtype == STRING else struct.pack(fmt[vtype], value)
    return string(key) + struct.pack("<I", vtype) + body


def q8_0(rows, cols):
    """rows x cols of Q8_0: scale 1/64, values cycling through -8..7."""
    block = struct.pack("<e", 1 / 64) + bytes((i % 16 - 8) & 0xFF for i in range(32))
    return block * (rows * cols // 32)


def f32(n, value=1.0):
    return struct.pack("<%df" % n, *([value] * n))


def tensors():
    out = [("token_embd.weight", [HIDDEN, VOCAB], T_F32, f32(HIDDEN * VOCAB, 0.01)),
           ("output_norm.weight", [HIDDEN], T_F32, f32(HIDDEN))]
    for name, rows, cols in [("attn_q", HIDDEN, HIDDEN), ("attn_k", HIDDEN, HIDDEN), ("attn_v", HIDDEN, HIDDEN),
                             ("attn_output", HIDDEN, HIDDEN), ("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN),
                             ("ffn_down", HIDDEN, FFN)]:
        out.append(("blk.0.%s.weight" % name, [cols, rows], T_Q8_0, q8_0(rows, cols)))
    out += [("blk.0.attn_norm.weight", [HIDDEN], T_F32, f32(HIDDEN)),
            ("blk.0.ffn_norm.weight", [HIDDEN], T_F32, f32(HIDDEN))]
    return out


def metadata(extra=()):
    return [kv("general.architecture", STRING, "llama"),
            kv("llama.embedding_length", U32, HIDDEN),
            kv("llama.block_count", U32, 1),
            kv("llama.feed_forward_length", U32, FFN),
            kv("llama.attention.head_count", U32, HEADS),
            kv("llama.context_length", U32, 64),
            kv("llama.attention.layer_norm_rms_epsilon", F32, 1e-5)] + list(extra)


def build(kvs=None, infos=None, version=3, counts=None, alignment=32, offsets=None, data=None):
    """A GGUF file; every part can be replaced to make one defect."""
    kvs = metadata() if kvs is None else kvs
    ts = tensors()
    blobs, offset, placed = [], 0, []
    for i, (name, ne, ttype, payload) in enumerate(ts):
        at = offset if offsets is None or i not in offsets else offsets[i]
        placed.append((name, ne, ttype, at))
        blobs.append(payload + b"\0" * (-len(payload) % alignment))
        offset += len(blobs[-1])
    if infos is None:
        infos = [string(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne) +
                 struct.pack("<IQ", ttype, at) for name, ne, ttype, at in placed]
    n_tensors, n_kvs = counts if counts else (len(infos), len(kvs))
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kvs) + b"".join(kvs) + b"".join(infos)
    head += b"\0" * (-len(head) % alignment)
    return head + (b"".join(blobs) if data is None else data)


def info(name, ne, ttype, offset):
    return string(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne) + struct.pack("<IQ", ttype, offset)


def main():
    os.makedirs(OUT, exist_ok=True)
    valid = build()
    cases = {
        "truncated_header": valid[:20],
        "truncated_metadata": valid[:100],
        "truncated_tensor_infos": valid[:len(build(data=b"")) - 40],
        "truncated_data": valid[:len(valid) - 100],
        "bad_magic": b"GGUG" + valid[4:],
        "version_1": build(version=1),
        "version_99": build(version=99),
        "huge_tensor_count": build(counts=(1 << 62, 7)),
        "huge_kv_count": build(counts=(11, 1 << 62)),
        "huge_string_length": b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", (1 << 64) - 1) + b"x" * 64,
        "huge_array_count": build(kvs=metadata([string("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING,
                                                                                              1 << 61)])),
        "nested_array": build(kvs=metadata([string("x.y") + struct.pack("<IIQ", ARRAY, ARRAY, 1)])),
        "bad_value_type": build(kvs=metadata([string("x.y") + struct.pack("<II", 77, 0)])),
        "bad_bool": build(kvs=metadata([kv("x.flag", BOOL, 7)])),
        "bad_alignment": build(kvs=metadata([kv("general.alignment", U32, 24)])),
        "duplicate_key": build(kvs=metadata([kv("llama.block_count", U32, 1)])),
        "bad_tensor_type": build(infos=[info("token_embd.weight", [HIDDEN, VOCAB], 10, 0)]),
        "unknown_tensor_type": build(infos=[info("token_embd.weight", [HIDDEN, VOCAB], 200, 0)]),
        "too_many_dims": build(infos=[info("token_embd.weight", [1, 1, 1, 1, 1], T_F32, 0)]),
        "dims_overflow": build(infos=[info("token_embd.weight", [1 << 32, 1 << 32], T_F32, 0)]),
        "partial_block": build(infos=[info("w", [40, 2], T_Q8_0, 0)]),
        "offset_past_end": build(offsets={3: 1 << 40}),
        "offset_wraps": build(offsets={3: (1 << 64) - 32}),
        "misaligned_offset": build(offsets={3: 4}),
        "overlapping_tensors": build(offsets={3: 0}),
        "duplicate_tensor": build(infos=[info("w", [32], T_F32, 0), info("w", [32], T_F32, 128)]),
        "rope_scaling": build(kvs=metadata([kv("llama.rope.scaling.type", STRING, "linear")])),
        "sliding_window": build(kvs=metadata([kv("llama.attention.sliding_window", U32, 16)])),
        "experts": build(kvs=metadata([kv("llama.expert_count", U32, 4)])),
        "unknown_architecture": build(kvs=[kv("general.architecture", STRING, "mamba")] + metadata()[1:]),
        "no_architecture": build(kvs=metadata()[1:]),
        "shape_mismatch": build(kvs=metadata()[:1] + [kv("llama.embedding_length", U32, 64)] + metadata()[2:]),
        "missing_key": build(kvs=metadata()[:2] + metadata()[3:]),
        "odd_head_rows": build(kvs=metadata()[:4] + [kv("llama.attention.head_count", U32, 32)] + metadata()[5:]),
    }
    for name, data in sorted(cases.items()):
        with open(os.path.join(OUT, name + ".gguf"), "wb") as f:
            f.write(data)
    if len(sys.argv) == 3 and sys.argv[1] == "--valid":
        with open(os.path.join(sys.argv[2], "valid.gguf"), "wb") as f:
            f.write(valid)
    print("%d files, %d bytes" % (len(cases), sum(len(d) for d in cases.values())))


if __name__ == "__main__":
    main()
