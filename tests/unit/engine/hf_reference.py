"""An independent float64 reference of Hugging Face's Llama, Qwen2, Qwen3,
Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE forward passes, written from the transformers modeling code's semantics
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


def swiglu(h, gate, up, down):
    g = h @ gate.T
    return (g / (1.0 + np.exp(-g)) * (h @ up.T)) @ down.T


def is_moe_layer(config, layer):
    experts = config.get("num_local_experts", config.get("num_experts", 0))
    step = config.get("decoder_sparse_step", 1)
    return (experts > 0 and (layer + 1) % step == 0
            and layer not in config.get("mlp_only_layers", []))


def mixture(config, w, p, h, mixtral):
    """The sparse MoE block: softmax over the router's logits, the top k
    (the lowest index first among equals), optionally renormalised, each
    chosen expert's SwiGLU weighted; plus Qwen2-MoE's gated shared expert."""
    block = p + ("block_sparse_moe." if mixtral else "mlp.")
    logits = h @ w[block + "gate.weight"].T
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    k = config["num_experts_per_tok"]
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, chosen, axis=-1)
    if config.get("norm_topk_prob", mixtral):
        weights /= weights.sum(axis=-1, keepdims=True)
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        for j in range(k):
            e = block + "experts.%d." % chosen[t, j]
            out[t] += weights[t, j] * swiglu(h[t:t + 1], *(w[e + n + ".weight"] for n in names))[0]
    if block + "shared_expert.gate_proj.weight" in w:
        s = block + "shared_expert."
        gate = 1.0 / (1.0 + np.exp(-(h @ w[block + "shared_expert_gate.weight"].T)))
        out += gate * swiglu(h, w[s + "gate_proj.weight"], w[s + "up_proj.weight"],
                             w[s + "down_proj.weight"])
    return out


def main():
    folder, out_path, ids_text = sys.argv[1], sys.argv[2], sys.argv[3]
    config = json.load(open(folder + "/config.json"))
    w = read_safetensors(folder + "/model.safetensors")
    arch = config["architectures"][0]
    if arch not in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                    "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                    "OlmoeForCausalLM"):
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
        if arch == "OlmoeForCausalLM":  # over the whole projections
            proj["q"] = rms_norm(proj["q"], w[p + "self_attn.q_norm.weight"], eps)
            proj["k"] = rms_norm(proj["k"], w[p + "self_attn.k_norm.weight"], eps)
        q = proj["q"].reshape(seq, n_heads, head_dim)
        k = proj["k"].reshape(seq, n_kv, head_dim)
        v = proj["v"].reshape(seq, n_kv, head_dim)
        if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
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
        if is_moe_layer(config, layer):
            x = x + mixture(config, w, p, h, arch == "MixtralForCausalLM")
        else:
            x = x + swiglu(h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                           w[p + "mlp.down_proj.weight"])
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight")
    if head is None or config.get("tie_word_embeddings"):
        head = w["model.embed_tokens.weight"]
    json.dump((x @ head.T).tolist(), open(out_path, "w"))


if __name__ == "__main__":
    main()
