"""An independent float64 reference of Hugging Face's Llama, Qwen2, Qwen3,
Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE and DeepSeek V2/V3 forward passes (DeepSeek's
latent attention computed expanded, per head, as its modeling code does),
written from the transformers modeling code's semantics
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


def yarn_mscale(factor, m):
    return 1.0 if factor <= 1 else 0.1 * m * np.log(factor) + 1.0


def deepseek_rope(config, positions):
    """cos and sin of DeepSeek's rope part, with its YaRN frequencies."""
    dim = config["qk_rope_head_dim"]
    base = config.get("rope_theta", 10000.0)
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    inv_freq = 1.0 / base ** exponents
    scaling = config.get("rope_scaling")
    if scaling:
        if scaling.get("type", scaling.get("rope_type")) != "yarn":
            raise SystemExit("unsupported rope_scaling for DeepSeek")
        factor = scaling["factor"]
        original = scaling["original_max_position_embeddings"]

        def turning_dim(rotations):
            return dim * np.log(original / (rotations * 2 * np.pi)) / (2 * np.log(base))

        low = max(np.floor(turning_dim(scaling.get("beta_fast", 32))), 0)
        high = min(np.ceil(turning_dim(scaling.get("beta_slow", 1))), dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
        keep = 1.0 - ramp
        inv_freq = inv_freq / factor * (1 - keep) + inv_freq * keep
    emb = np.outer(positions, inv_freq)
    emb = np.concatenate([emb, emb], axis=-1)
    return np.cos(emb), np.sin(emb)


def deepseek_attention(config, w, p, h, mask):
    """Latent attention expanded: every head's key and value from the latent."""
    seq = h.shape[0]
    heads = config["num_attention_heads"]
    nope, rope = config["qk_nope_head_dim"], config["qk_rope_head_dim"]
    v_dim, rank = config["v_head_dim"], config["kv_lora_rank"]
    a = p + "self_attn."
    if config.get("q_lora_rank"):
        q = rms_norm(h @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], 1e-6)
        q = q @ w[a + "q_b_proj.weight"].T
    else:
        q = h @ w[a + "q_proj.weight"].T
    q = q.reshape(seq, heads, nope + rope)
    compressed = h @ w[a + "kv_a_proj_with_mqa.weight"].T
    latent = rms_norm(compressed[:, :rank], w[a + "kv_a_layernorm.weight"], 1e-6)
    kv = (latent @ w[a + "kv_b_proj.weight"].T).reshape(seq, heads, nope + v_dim)
    cos, sin = deepseek_rope(config, np.arange(seq, dtype=np.float64))

    def rotate(x):  # pairs (2i, 2i + 1), regrouped into halves first
        x = x.reshape(x.shape[:-1] + (rope // 2, 2)).swapaxes(-1, -2).reshape(x.shape)
        return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]

    q_pe = rotate(q[:, :, nope:])
    k_pe = rotate(compressed[:, None, rank:])
    k = np.concatenate([kv[:, :, :nope], np.repeat(k_pe, heads, axis=1)], axis=-1)
    q = np.concatenate([q[:, :, :nope], q_pe], axis=-1)
    scale = (nope + rope) ** -0.5
    scaling = config.get("rope_scaling")
    if scaling and scaling.get("mscale_all_dim"):
        m = yarn_mscale(scaling["factor"], scaling["mscale_all_dim"])
        scale *= m * m
    scores = np.einsum("qhd,khd->hqk", q, k) * scale + mask
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    scores /= scores.sum(axis=-1, keepdims=True)
    attn = np.einsum("hqk,khd->qhd", scores, kv[:, :, nope:]).reshape(seq, heads * v_dim)
    return attn @ w[a + "o_proj.weight"].T


def deepseek_moe(config, w, p, h):
    """DeepSeek's gate: V2's softmax (greedy or group-limited), V3's sigmoid
    with the correction bias steering the choice and groups scored by their
    best two; renormalised and/or scaled; plus the shared experts."""
    m = p + "mlp."
    logits = h @ w[m + "gate.weight"].T
    n, k = logits.shape[1], config["num_experts_per_tok"]
    v3 = config.get("scoring_func") == "sigmoid"
    if v3:
        scores = 1.0 / (1.0 + np.exp(-logits))
        choice = scores + w[m + "gate.e_score_correction_bias"]
    else:
        scores = np.exp(logits - logits.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        choice = scores
    groups = config.get("n_group") or 1
    if config.get("topk_method") in ("group_limited_greedy", "noaux_tc") and groups > 1:
        grouped = choice.reshape(h.shape[0], groups, n // groups)
        if v3:
            group_scores = np.sort(grouped, axis=-1)[:, :, -2:].sum(axis=-1)
        else:
            group_scores = grouped.max(axis=-1)
        best = np.argsort(-group_scores, axis=-1, kind="stable")[:, :config["topk_group"]]
        allowed = np.zeros_like(group_scores, dtype=bool)
        np.put_along_axis(allowed, best, True, axis=-1)
        choice = np.where(np.repeat(allowed, n // groups, axis=-1), choice, -np.inf)
    chosen = np.argsort(-choice, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(scores, chosen, axis=-1)
    if k > 1 and config.get("norm_topk_prob"):
        weights /= weights.sum(axis=-1, keepdims=True) + 1e-20
        if v3:
            weights *= config.get("routed_scaling_factor", 1.0)
    else:
        weights *= config.get("routed_scaling_factor", 1.0)
    names = ("gate_proj", "up_proj", "down_proj")
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        for j in range(k):
            e = m + "experts.%d." % chosen[t, j]
            out[t] += weights[t, j] * swiglu(h[t:t + 1], *(w[e + x + ".weight"] for x in names))[0]
    if config.get("n_shared_experts"):
        out += swiglu(h, *(w[m + "shared_experts." + x + ".weight"] for x in names))
    return out


def main():
    folder, out_path, ids_text = sys.argv[1], sys.argv[2], sys.argv[3]
    config = json.load(open(folder + "/config.json"))
    w = read_safetensors(folder + "/model.safetensors")
    arch = config["architectures"][0]
    if arch not in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                    "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
                    "OlmoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
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
    deepseek = arch.startswith("Deepseek")  # its rope part: deepseek_rope
    if scaling and not deepseek:
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
        if deepseek:
            x = x + deepseek_attention(config, w, p, h, mask)
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
            if config.get("n_routed_experts") and layer >= config.get("first_k_dense_replace", 0):
                x = x + deepseek_moe(config, w, p, h)
            else:
                x = x + swiglu(h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                               w[p + "mlp.down_proj.weight"])
            continue
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
