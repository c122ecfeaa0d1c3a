#include "common/model/model_weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/quant_blocks.h"
#include "common/base/xxhash_dispatch.h"
#include "common/model/ggml_types.h"
#include "common/model/gguf_model.h"
#include "common/model/hub_model.h"
#include "common/model/llama2c_checkpoint.h"
#include "common/model/tensor_list.h"

namespace tandem {

Tensor Tensor::Slice(int64_t offset, int64_t count) const {
  return Tensor(static_cast<const uint8_t*>(data) + DTypeBytes(dtype, offset), dtype, count);
}

float Tensor::At(int64_t i) const {
  const int block = DTypeBlockElements(dtype);
  float values[256];
  DequantizeRow(dtype, static_cast<const uint8_t*>(data) + DTypeBytes(dtype, i / block * block),
                values, block);
  return values[i % block];
}

std::vector<float> Tensor::ToFloats() const {
  std::vector<float> out(size());
  if (numel > 0) DequantizeRow(dtype, data, out.data(), numel);
  return out;
}

std::string ModelWeights::Fingerprint() const {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  // Every config field that changes the maths, in binary (ToString rounds).
  const ModelConfig& c = config;
  const RopeScaling& r = c.rope_scaling;
  const int32_t ints[] = {c.dim,
                          c.hidden_dim,
                          c.n_layers,
                          c.n_heads,
                          c.n_kv_heads,
                          c.vocab_size,
                          c.seq_len,
                          c.head_dim(),
                          c.shared_classifier,
                          c.attention_bias,
                          static_cast<int32_t>(c.qk_norm),
                          c.moe.n_experts,
                          c.moe.top_k,
                          c.moe.expert_hidden,
                          c.moe.norm_topk_prob,
                          c.moe.shared_hidden,
                          c.moe.sparse_step,
                          static_cast<int32_t>(c.rope_layout),
                          static_cast<int32_t>(r.type),
                          r.original_max_position};
  const float floats[] = {c.rope_theta, c.norm_eps, r.factor, r.low_freq_factor,
                          r.high_freq_factor};
  XXH3_64bits_update(state, ints, sizeof(ints));
  XXH3_64bits_update(state, floats, sizeof(floats));
  // DeepSeek's attention, routing and RoPE scaling, hashed only when a
  // model has them (so the fingerprints of models without stay as they
  // were).
  const MoeConfig& m = c.moe;
  const MlaConfig& a = c.mla;
  if (c.has_deepseek_parts()) {
    const int32_t more_ints[] = {a.q_lora_rank,
                                 a.kv_lora_rank,
                                 a.qk_nope_head_dim,
                                 a.qk_rope_head_dim,
                                 a.v_head_dim,
                                 m.shared_gated,
                                 static_cast<int32_t>(m.scoring),
                                 m.score_bias,
                                 m.n_group,
                                 m.topk_group,
                                 static_cast<int32_t>(m.group_score)};
    const float more_floats[] = {m.routed_scale, r.beta_fast, r.beta_slow, r.mscale,
                                 r.mscale_all_dim};
    XXH3_64bits_update(state, more_ints, sizeof(more_ints));
    XXH3_64bits_update(state, more_floats, sizeof(more_floats));
  }
  // Which layers are dense follows from the rest and this list.
  for (int l = 0; l < c.n_layers; ++l) {
    const uint8_t moe = c.IsMoeLayer(l);
    XXH3_64bits_update(state, &moe, 1);
  }
  auto add = [&](const Tensor& t) {
    const uint8_t type = static_cast<uint8_t>(t.dtype);
    XXH3_64bits_update(state, &type, 1);
    if (t.numel > 0) XXH3_64bits_update(state, t.data, t.size_bytes());
  };
  for (const TensorSpec& spec : ModelTensors(config)) add(TensorOf(*this, spec));
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return absl::StrFormat("%016x", h);
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModel(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return LoadHubModel(path);
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open model file '", path, "'"));
  in.read(magic, 4);
  if (in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0) return LoadGgufModel(path);
  return LoadLlama2cCheckpoint(path);
}

}  // namespace tandem
