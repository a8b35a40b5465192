#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/) from the
real files in tests/fixtures and models/default, kept small:

- safetensors: each checkpoint's real header (names, dtypes, metadata) with
  every dimension cut to at most 2 and offsets recomputed, the data taken from
  the start of each real tensor; plus a few hand-made files (empty header,
  every dtype, a truncated file).
- model_config: every config.json as is, plus variants the fixtures lack
  (llama3 / linear RoPE, the multimodal gemma3 wrapper, layer_types).
- tokenizer: every tokenizer.json with its vocabulary cut to the first 320 ids
  (merges kept when both parts and the result survive), once alone and once as
  JSON \\0 TEXT \\0 tokenizer_config.json (the layout tokenizer_fuzz.cpp reads).
- chat_template: every template of tests/fixtures/chat_templates, alone and as
  TEMPLATE \\0 CONTEXT_JSON with a conversation of tests/chat/conversations.json
  (the layout chat_template_fuzz.cpp reads), and the construct snippets of
  tests/chat/snippets.json.

Run from the repository root: python3 tests/fuzz/make_seeds.py
"""
import glob
import json
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4, "I64": 8, "U8": 1, "F64": 8, "BOOL": 1}


def out(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(header, data):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + data


def model_name(path):
    parts = path.split(os.sep)
    return parts[-2]  # the family folder, or "default"


def safetensors_seeds():
    files = sorted(glob.glob(os.path.join(ROOT, "tests/fixtures/models/*/model.safetensors")))
    files.append(os.path.join(ROOT, "models/default/model.safetensors"))
    for path in files:
        raw = open(path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        body = raw[8 + n:]
        small, data = {}, b""
        for name, e in header.items():
            if name == "__metadata__":
                small[name] = e
                continue
            shape = [min(d, 2) for d in e["shape"]]
            count = 1
            for d in shape:
                count *= d
            nbytes = count * DTYPE_BYTES[e["dtype"]]
            begin = e["data_offsets"][0]
            small[name] = {"dtype": e["dtype"], "shape": shape, "data_offsets": [len(data), len(data) + nbytes]}
            data += body[begin:begin + nbytes]
        out("safetensors", model_name(path), safetensors(small, data))
    out("safetensors", "empty_header", safetensors({}, b""))
    out("safetensors", "metadata_only", safetensors({"__metadata__": {"format": "pt", "x": 1}}, b""))
    every, data = {}, b""
    for dt, size in DTYPE_BYTES.items():
        every[dt.lower()] = {"dtype": dt, "shape": [1, 2], "data_offsets": [len(data), len(data) + 2 * size]}
        data += bytes(range(2 * size))
    every["scalar"] = {"dtype": "F32", "shape": [], "data_offsets": [len(data), len(data) + 4]}
    data += struct.pack("<f", 1.5)
    every["empty"] = {"dtype": "F16", "shape": [0, 3], "data_offsets": [len(data), len(data)]}
    out("safetensors", "every_dtype", safetensors(every, data))
    out("safetensors", "truncated", safetensors(every, data)[:-5])


def config_seeds():
    for path in sorted(glob.glob(os.path.join(ROOT, "tests/fixtures/models/*/config.json"))):
        out("model_config", model_name(path), open(path, "rb").read())
    out("model_config", "default", open(os.path.join(ROOT, "models/default/config.json"), "rb").read())
    llama = json.load(open(os.path.join(ROOT, "tests/fixtures/models/llama/config.json")))
    llama["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}
    out("model_config", "llama3_rope", json.dumps(llama))
    llama["rope_scaling"] = {"type": "linear", "factor": 2.0}
    out("model_config", "linear_rope", json.dumps(llama))
    gemma3 = json.load(open(os.path.join(ROOT, "tests/fixtures/models/gemma3/config.json")))
    wrapper = {"model_type": "gemma3", "torch_dtype": "bfloat16", "eos_token_id": [1, 106],
               "text_config": dict(gemma3, model_type="gemma3_text")}
    out("model_config", "gemma3_multimodal", json.dumps(wrapper))
    out("model_config", "qwen2_layer_types", json.dumps({
        "model_type": "qwen2", "num_hidden_layers": 3, "use_sliding_window": True, "sliding_window": 16,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}))


def trim_tokenizer(j, keep=320):
    model = j["model"]
    vocab = {t: i for t, i in model["vocab"].items() if i < keep}
    merges = []
    for m in model.get("merges", []):
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    model["vocab"] = vocab
    model["merges"] = merges
    return j


TEXT = "Hello world, it's 2024!\n  caf\u00e9 \u65e5\u672c \U0001F600 <s>x</s>"


def tokenizer_seeds():
    paths = sorted(glob.glob(os.path.join(ROOT, "tests/fixtures/tokenizers/*/tokenizer.json")))
    paths.append(os.path.join(ROOT, "models/default/tokenizer.json"))
    for path in paths:
        name = model_name(path)
        j = trim_tokenizer(json.load(open(path, encoding="utf-8")))
        text = json.dumps(j, ensure_ascii=False, separators=(",", ":"))
        out("tokenizer", name, text)
        cfg_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
        cfg = open(cfg_path, encoding="utf-8").read() if os.path.exists(cfg_path) else "{}"
        out("tokenizer", name + "_with_text_and_config", text + "\0" + TEXT + "\0" + cfg)


def chat_template_seeds():
    conversations = json.load(open(os.path.join(ROOT, "tests/chat/conversations.json"), encoding="utf-8"))
    with_tools = [c for c in conversations if c["name"] == "tools_call_and_result"][0]["context"]
    for path in sorted(glob.glob(os.path.join(ROOT, "tests/fixtures/chat_templates/*.jinja"))):
        name = os.path.basename(path)[:-len(".jinja")]
        source = open(path, encoding="utf-8").read()
        out("chat_template", name, source)
        out("chat_template", name + "_with_tools", source + "\0" + json.dumps(with_tools, ensure_ascii=False))
    snippets = json.load(open(os.path.join(ROOT, "tests/chat/snippets.json"), encoding="utf-8"))
    for i, s in enumerate(snippets):
        out("chat_template", "snippet_%03d" % i, s["template"] + "\0" + json.dumps(s.get("context", {}), ensure_ascii=False))


if __name__ == "__main__":
    shutil.rmtree(CORPUS, ignore_errors=True)
    safetensors_seeds()
    config_seeds()
    tokenizer_seeds()
    chat_template_seeds()
