"""Splits a safetensors file into two shards and a model.safetensors.index.json
in a folder, as Hugging Face saves a big model (standard library only).
   shard_safetensors.py IN.safetensors OUT_FOLDER"""
import json
import struct
import sys

source, folder = sys.argv[1], sys.argv[2]
with open(source, "rb") as f:
    header_length = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(header_length))
    data = f.read()
names = sorted(k for k in header if k != "__metadata__")
halves = [names[: len(names) // 2], names[len(names) // 2 :]]
weight_map = {}
for i, part in enumerate(halves):
    shard = "model-%05d-of-00002.safetensors" % (i + 1)
    out_header, blobs, offset = {}, [], 0
    for name in part:
        start, end = header[name]["data_offsets"]
        blobs.append(data[start:end])
        out_header[name] = dict(header[name], data_offsets=[offset, offset + end - start])
        offset += end - start
        weight_map[name] = shard
    text = json.dumps(out_header).encode()
    text += b" " * (-len(text) % 8)
    with open("%s/%s" % (folder, shard), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
with open("%s/model.safetensors.index.json" % folder, "w") as f:
    json.dump({"metadata": {"total_size": len(data)}, "weight_map": weight_map}, f)
