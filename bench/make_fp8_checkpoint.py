#!/usr/bin/env python3
"""An FP8 (e4m3) checkpoint of a float one, in transformers' fine-grained FP8 layout (Qwen3-*-FP8 style).

For the quantized-weights quality table (issue 13): `kvgraph perplexity` over the result gives the fp8
row beside the int8/int4 rows that `--weights` makes on load. Pure Python (no numpy or torch needed):

  python3 bench/make_fp8_checkpoint.py models/default /tmp/default-fp8 [--block 128]

Every 2-D "*_proj.weight" becomes "X.weight" F8_E4M3 [N, K] and "X.weight_scale_inv" F32
[ceil(N/b), ceil(K/b)], scale = absmax / 448 of its b x b block (1 where all zero), code = the e4m3
value nearest w / scale (ties to the even code, |w / scale| clamped to 448, as transformers' clamp then
cast); embeddings, norms and lm_head stay as they are (modules_to_not_convert). config.json gains
"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
"weight_block_size": [b, b]}; the other files are copied.
"""
import argparse
import bisect
import json
import os
import shutil
import struct
import sys
from array import array


def e4m3_value(code):
    e, m = (code >> 3) & 15, code & 7
    return (m / 8.0) * 2.0 ** -6 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7)


VALUES = [e4m3_value(c) for c in range(127)]  # the non-negative finite codes, increasing


def encode(x):
    a = min(abs(x), 448.0)
    c = bisect.bisect_left(VALUES, a)
    if c > 0 and VALUES[c] != a:
        up, down = VALUES[c] - a, a - VALUES[c - 1]
        if down < up or (down == up and (c - 1) % 2 == 0):
            c -= 1
    return (0x80 if x < 0 or (x == 0 and str(x).startswith("-")) else 0) | c


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def read_floats(dtype, raw):
    if dtype == "F32":
        return array("f", raw).tolist()
    if dtype == "BF16":
        h = array("H", raw)
        return array("f", array("I", (v << 16 for v in h)).tobytes()).tolist()
    sys.exit(f"make_fp8_checkpoint: a matrix in {dtype}: expected F32 or BF16")


def quantize(w, N, K, b):
    rows, cols = (N + b - 1) // b, (K + b - 1) // b
    amax = [0.0] * (rows * cols)
    for n in range(N):
        base, r = n * K, (n // b) * cols
        for k in range(K):
            v = abs(w[base + k])
            if v > amax[r + k // b]:
                amax[r + k // b] = v
    scale = [f32(a / 448.0) if a > 0 else 1.0 for a in amax]
    codes = bytearray(N * K)
    for n in range(N):
        base, r = n * K, (n // b) * cols
        for k in range(K):
            codes[base + k] = encode(w[base + k] / scale[r + k // b])
    return bytes(codes), array("f", scale).tobytes(), [rows, cols]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--block", type=int, default=128)
    args = ap.parse_args()
    src = os.path.join(args.src, "model.safetensors")
    if not os.path.isfile(src):
        sys.exit(f"make_fp8_checkpoint: {src}: no such file (one model.safetensors expected)")
    with open(src, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    tensors = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        raw = data[b:end]
        if name.endswith("_proj.weight") and len(e["shape"]) == 2:
            N, K = e["shape"]
            codes, scales, sshape = quantize(read_floats(e["dtype"], raw), N, K, args.block)
            tensors[name] = ("F8_E4M3", [N, K], codes)
            tensors[name[: -len("weight")] + "weight_scale_inv"] = ("F32", sshape, scales)
            print(f"  {name} [{N}, {K}] -> e4m3, scales {sshape}", file=sys.stderr)
        else:
            tensors[name] = (e["dtype"], e["shape"], raw)
    os.makedirs(args.out, exist_ok=True)
    for f in os.listdir(args.src):
        p = os.path.join(args.src, f)
        if os.path.isfile(p) and f not in ("model.safetensors", "config.json"):
            shutil.copy(p, os.path.join(args.out, f))
    config = json.load(open(os.path.join(args.src, "config.json")))
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [args.block, args.block]}
    json.dump(config, open(os.path.join(args.out, "config.json"), "w"), indent=2)
    out_header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        out_header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    if meta is not None:
        out_header["__metadata__"] = meta
    h = json.dumps(out_header).encode()
    h += b" " * (-len(h) % 8)
    tmp = os.path.join(args.out, "model.safetensors.partial")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, os.path.join(args.out, "model.safetensors"))
    print(f"{args.out}: fp8 e4m3 block {args.block}x{args.block}", file=sys.stderr)


if __name__ == "__main__":
    main()
