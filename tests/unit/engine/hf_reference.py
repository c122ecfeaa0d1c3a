"""An independent float64 reference of Hugging Face's Llama, Qwen2 and Qwen3
forward passes, written from the transformers modeling code's semantics
(not from tandem's engine): reads a hub folder (config.json and
model.safetensors in F32, F16 or BF16) with numpy and writes the logits of
every position of a token sequence as JSON.

    python3 hf_reference.py FOLDER OUT.json 1,2,3,...
"""
import json
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    base = 8 + length
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[base + start:base + end]
        if info["dtype"] == "F32":
            values = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif info["dtype"] == "F16":
            values = np.frombuffer(raw, dtype="<f2").astype(np.float64)
        elif info["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            values = bits.view(np.float32).astype(np.float64)
        else:
            raise SystemExit("unsupported dtype " + info["dtype"])
        tensors[name] = values.reshape(info["shape"])
    return tensors


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def main():
    folder, out_path, ids_text = sys.argv[1], sys.argv[2], sys.argv[3]
    config = json.load(open(folder + "/config.json"))
    w = read_safetensors(folder + "/model.safetensors")
    arch = config["architectures"][0]
    if arch not in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        raise SystemExit("unsupported architecture " + arch)
    ids = [int(t) for t in ids_text.split(",")]
    n_heads = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads", n_heads)
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // n_heads
    eps = config["rms_norm_eps"]
    theta = config.get("rope_theta", 10000.0)
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = config.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind != "linear":
            raise SystemExit("unsupported rope_scaling " + str(kind))
        inv_freq = inv_freq / scaling["factor"]
    positions = np.arange(len(ids), dtype=np.float64)
    freqs = np.outer(positions, inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    seq = len(ids)
    mask = np.triu(np.full((seq, seq), -np.inf), k=1)

    x = w["model.embed_tokens.weight"][ids]
    for layer in range(config["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        proj = {}
        for name in ("q", "k", "v"):
            y = h @ w[p + "self_attn.%s_proj.weight" % name].T
            bias = w.get(p + "self_attn.%s_proj.bias" % name)
            proj[name] = y if bias is None else y + bias
        q = proj["q"].reshape(seq, n_heads, head_dim)
        k = proj["k"].reshape(seq, n_kv, head_dim)
        v = proj["v"].reshape(seq, n_kv, head_dim)
        if arch == "Qwen3ForCausalLM":
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = n_heads // n_kv
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim) + mask
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", scores, v).reshape(seq, n_heads * head_dim)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight")
    if head is None or config.get("tie_word_embeddings"):
        head = w["model.embed_tokens.weight"]
    json.dump((x @ head.T).tolist(), open(out_path, "w"))


if __name__ == "__main__":
    main()
