#include "common/model/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/model/ggml_types.h"
#include "common/model/tensor_list.h"

namespace tandem {
namespace {

// SplitMix64: a tiny, well-known generator whose output does not depend on
// the standard library, so synthetic weights are identical everywhere. Its
// state after k steps is seed + k * gamma, so draw k is computed from k
// alone: a tensor's values are filled in parallel and still come out in the
// order one generator would give them.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : seed_(seed) {}
  // Uniform in [-1, 1): draw number `k` (0-based) of the sequence.
  float Symmetric(uint64_t k) const {
    uint64_t z = seed_ + (k + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>((z >> 40) * 0x1.0p-23 - 1.0);
  }

 private:
  uint64_t seed_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> MakeSyntheticModel(const ModelConfig& config,
                                                                 uint64_t seed, DType dtype) {
  RETURN_IF_ERROR(config.Validate());
  const std::vector<TensorSpec> specs = ModelTensors(config);
  int64_t matrices = 0, vectors = 0;
  for (const TensorSpec& spec : specs) (spec.is_matrix() ? matrices : vectors) += spec.numel();
  const size_t element = DTypeSize(dtype);
  // Matrices first (in `dtype`), then the fp32 vectors, 8-byte aligned.
  const size_t vector_start = (static_cast<size_t>(matrices) * element + 7) / 8 * 8;
  auto storage = std::make_shared<std::vector<uint64_t>>(
      (vector_start + static_cast<size_t>(vectors) * sizeof(float) + 7) / 8);
  uint8_t* base = reinterpret_cast<uint8_t*>(storage->data());
  uint8_t* m = base;
  float* f = reinterpret_cast<float*>(base + vector_start);
  const SplitMix64 rng(seed * 0x2545F4914F6CDD1Dull + 1);
  uint64_t drawn = 0;  // draws taken so far, in tensor order

  // Uniform with variance 1/fan_in keeps each projection's output near unit
  // scale: U(-a, a) has variance a^2 / 3. Values are drawn as floats and
  // rounded to `dtype`, so every dtype holds the same model.
  auto matrix = [&](int64_t rows, int64_t cols) {
    const float a = std::sqrt(3.0f / static_cast<float>(cols));
    const int64_t n = rows * cols;
    const Tensor t(m, dtype, n);
    const uint64_t first = drawn;
    uint8_t* const out = m;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float x = a * rng.Symmetric(first + static_cast<uint64_t>(i));
      uint8_t* dst = out + static_cast<size_t>(i) * element;
      if (dtype == DType::kF32) {
        std::memcpy(dst, &x, 4);
      } else {
        const uint16_t y = dtype == DType::kBF16 ? Fp32ToBf16(x) : Fp32ToFp16(x);
        std::memcpy(dst, &y, 2);
      }
    }
    drawn += static_cast<uint64_t>(n);
    m += static_cast<size_t>(n) * element;
    return t;
  };
  auto vector = [&](int64_t n, float center, float spread) {
    std::span<const float> s(f, static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) *f++ = center + spread * rng.Symmetric(drawn++);
    return Tensor(s);
  };

  auto weights = std::make_unique<ModelWeights>();
  weights->config = config;
  weights->source = "synthetic";
  SizeLayers(*weights);
  for (const TensorSpec& spec : specs) {
    Tensor& t = TensorOf(*weights, spec);
    switch (spec.role) {
      case TensorRole::kBq:
      case TensorRole::kBk:
      case TensorRole::kBv:
        t = vector(spec.numel(), 0.0f, 0.5f);
        break;
      case TensorRole::kQNorm:
      case TensorRole::kKNorm:
      case TensorRole::kQANorm:
      case TensorRole::kKvANorm:
        // Far from 1, so that a norm applied to the wrong dimensions shows.
        t = vector(spec.numel(), 1.0f, 0.5f);
        break;
      default:
        t = spec.is_matrix() ? matrix(spec.shape[0], spec.shape[1])
                             : vector(spec.numel(), 1.0f, 0.1f);
    }
  }
  if (config.shared_classifier) weights->classifier = weights->token_embedding;
  weights->storage = std::move(storage);
  return weights;
}

ModelConfig Stories15MShape() {
  return ModelConfig{.dim = 288,
                     .hidden_dim = 768,
                     .n_layers = 6,
                     .n_heads = 6,
                     .n_kv_heads = 6,
                     .vocab_size = 32000,
                     .seq_len = 256};
}

ModelConfig Stories110MShape() {
  return ModelConfig{.dim = 768,
                     .hidden_dim = 2048,
                     .n_layers = 12,
                     .n_heads = 12,
                     .n_kv_heads = 12,
                     .vocab_size = 32000,
                     .seq_len = 1024};
}

ModelConfig Llama32_1BShape() {
  return ModelConfig{.dim = 2048,
                     .hidden_dim = 8192,
                     .n_layers = 16,
                     .n_heads = 32,
                     .n_kv_heads = 8,
                     .vocab_size = 128256,
                     .seq_len = 8192,
                     .rope_theta = 500000.0f,
                     .rope_layout = RopeLayout::kHalfSplit,
                     .rope_scaling = {.type = RopeScaling::Type::kLlama3,
                                      .factor = 32.0f,
                                      .low_freq_factor = 1.0f,
                                      .high_freq_factor = 4.0f,
                                      .original_max_position = 8192}};
}

ModelConfig Llama3_8BShape() {
  return ModelConfig{.dim = 4096,
                     .hidden_dim = 14336,
                     .n_layers = 32,
                     .n_heads = 32,
                     .n_kv_heads = 8,
                     .vocab_size = 128256,
                     .seq_len = 8192,
                     .rope_theta = 500000.0f,
                     .shared_classifier = false};
}

ModelConfig Llama3_70BShape() {
  ModelConfig c = Llama3_8BShape();
  c.dim = 8192;
  c.hidden_dim = 28672;
  c.n_layers = 80;
  c.n_heads = 64;
  c.n_kv_heads = 8;
  return c;
}

ModelConfig Qwen3_0_6BShape() {
  return ModelConfig{.dim = 1024,
                     .hidden_dim = 3072,
                     .n_layers = 28,
                     .n_heads = 16,
                     .n_kv_heads = 8,
                     .vocab_size = 151936,
                     .seq_len = 40960,
                     .rope_theta = 1000000.0f,
                     .norm_eps = 1e-6f,
                     .head_size = 128,
                     .qk_norm = QkNorm::kPerHead,
                     .rope_layout = RopeLayout::kHalfSplit};
}

ModelConfig Qwen3SmallShape() {
  return ModelConfig{.dim = 64,
                     .hidden_dim = 96,
                     .n_layers = 2,
                     .n_heads = 4,
                     .n_kv_heads = 2,
                     .vocab_size = 512,
                     .seq_len = 256,
                     .rope_theta = 1000000.0f,
                     .norm_eps = 1e-6f,
                     .shared_classifier = false,
                     .head_size = 32,
                     .qk_norm = QkNorm::kPerHead,
                     .rope_layout = RopeLayout::kHalfSplit};
}

ModelConfig Qwen3_30B_A3BShape() {
  ModelConfig c = Qwen3_0_6BShape();
  c.dim = 2048;
  c.hidden_dim = 6144;
  c.n_layers = 48;
  c.n_heads = 32;
  c.n_kv_heads = 4;
  c.shared_classifier = false;
  c.moe = {.n_experts = 128, .top_k = 8, .expert_hidden = 768, .norm_topk_prob = true};
  return c;
}

ModelConfig Mixtral8x7BShape() {
  return ModelConfig{
      .dim = 4096,
      .hidden_dim = 14336,
      .n_layers = 32,
      .n_heads = 32,
      .n_kv_heads = 8,
      .vocab_size = 32000,
      .seq_len = 32768,
      .rope_theta = 1000000.0f,
      .shared_classifier = false,
      .rope_layout = RopeLayout::kHalfSplit,
      .moe = {.n_experts = 8, .top_k = 2, .expert_hidden = 14336, .norm_topk_prob = true}};
}

namespace {

// DeepSeek's YaRN: `factor` over an original context of 4096.
RopeScaling DeepSeekYarn(float factor, float mscale, float beta_fast) {
  RopeScaling s;
  s.type = RopeScaling::Type::kYarn;
  s.factor = factor;
  s.original_max_position = 4096;
  s.beta_fast = beta_fast;
  s.beta_slow = 1.0f;
  s.mscale = mscale;
  s.mscale_all_dim = mscale;
  return s;
}

}  // namespace

ModelConfig DeepSeekV2LiteShape() {
  ModelConfig c{.dim = 2048,
                .hidden_dim = 10944,
                .n_layers = 27,
                .n_heads = 16,
                .n_kv_heads = 16,
                .vocab_size = 102400,
                .seq_len = 163840,
                .norm_eps = 1e-6f,
                .shared_classifier = false,
                .rope_scaling = DeepSeekYarn(40.0f, 0.707f, 32.0f)};
  c.mla = {.kv_lora_rank = 512, .qk_nope_head_dim = 128, .qk_rope_head_dim = 64, .v_head_dim = 128};
  c.moe = {.n_experts = 64,
           .top_k = 6,
           .expert_hidden = 1408,
           .shared_hidden = 2 * 1408,
           .shared_gated = false,
           .dense_layers = {0}};
  return c;
}

ModelConfig DeepSeekV3Shape() {
  ModelConfig c{.dim = 7168,
                .hidden_dim = 18432,
                .n_layers = 61,
                .n_heads = 128,
                .n_kv_heads = 128,
                .vocab_size = 129280,
                .seq_len = 163840,
                .norm_eps = 1e-6f,
                .shared_classifier = false,
                .rope_scaling = DeepSeekYarn(40.0f, 1.0f, 32.0f)};
  c.mla = {.q_lora_rank = 1536,
           .kv_lora_rank = 512,
           .qk_nope_head_dim = 128,
           .qk_rope_head_dim = 64,
           .v_head_dim = 128};
  c.moe = {.n_experts = 256,
           .top_k = 8,
           .expert_hidden = 2048,
           .norm_topk_prob = true,
           .shared_hidden = 2048,
           .shared_gated = false,
           .scoring = MoeConfig::Scoring::kSigmoid,
           .score_bias = true,
           .n_group = 8,
           .topk_group = 4,
           .group_score = MoeConfig::GroupScore::kBestTwo,
           .routed_scale = 2.5f,
           .dense_layers = {0, 1, 2}};
  return c;
}

ModelConfig KimiK2Shape() {
  ModelConfig c = DeepSeekV3Shape();
  c.n_heads = c.n_kv_heads = 64;
  c.vocab_size = 163840;
  c.seq_len = 131072;
  c.rope_theta = 50000.0f;
  c.rope_scaling = DeepSeekYarn(32.0f, 1.0f, 1.0f);
  c.moe.n_experts = 384;
  c.moe.n_group = c.moe.topk_group = 1;
  c.moe.routed_scale = 2.827f;
  c.moe.dense_layers = {0};
  return c;
}

ModelConfig Olmoe1B7BShape() {
  return ModelConfig{.dim = 2048,
                     .hidden_dim = 1024,
                     .n_layers = 16,
                     .n_heads = 16,
                     .n_kv_heads = 16,
                     .vocab_size = 50304,
                     .seq_len = 4096,
                     .shared_classifier = false,
                     .qk_norm = QkNorm::kWhole,
                     .rope_layout = RopeLayout::kHalfSplit,
                     .moe = {.n_experts = 64, .top_k = 8, .expert_hidden = 1024}};
}

std::vector<std::pair<std::string, ModelConfig>> SmallMoeShapes() {
  ModelConfig base{.dim = 64,
                   .hidden_dim = 96,
                   .n_layers = 3,
                   .n_heads = 4,
                   .n_kv_heads = 2,
                   .vocab_size = 512,
                   .seq_len = 256,
                   .shared_classifier = false,
                   .rope_layout = RopeLayout::kHalfSplit};
  ModelConfig mixtral = base;
  mixtral.hidden_dim = 48;
  mixtral.moe = {.n_experts = 4, .top_k = 2, .expert_hidden = 48, .norm_topk_prob = true};
  ModelConfig qwen2 = base;  // layer 1 sparse (step 2), shared expert, biases
  qwen2.attention_bias = true;
  qwen2.moe = {
      .n_experts = 8, .top_k = 2, .expert_hidden = 32, .shared_hidden = 48, .sparse_step = 2};
  ModelConfig qwen3 = Qwen3SmallShape();  // layer 1 dense (mlp_only_layers)
  qwen3.n_layers = 3;
  qwen3.moe = {
      .n_experts = 8, .top_k = 3, .expert_hidden = 32, .norm_topk_prob = true, .dense_layers = {1}};
  ModelConfig olmoe = base;
  olmoe.n_kv_heads = 4;
  olmoe.hidden_dim = 32;
  olmoe.qk_norm = QkNorm::kWhole;
  olmoe.moe = {.n_experts = 8, .top_k = 3, .expert_hidden = 32};
  return {{"mixtral-small", mixtral},
          {"qwen2-moe-small", qwen2},
          {"qwen3-moe-small", qwen3},
          {"olmoe-small", olmoe}};
}

std::vector<std::pair<std::string, ModelConfig>> SmallDeepSeekShapes() {
  ModelConfig lite{.dim = 64,
                   .hidden_dim = 80,
                   .n_layers = 3,
                   .n_heads = 4,
                   .n_kv_heads = 4,
                   .vocab_size = 512,
                   .seq_len = 256,
                   .norm_eps = 1e-6f,
                   .shared_classifier = false};
  lite.mla = {.kv_lora_rank = 32, .qk_nope_head_dim = 16, .qk_rope_head_dim = 8, .v_head_dim = 16};
  lite.moe = {.n_experts = 8,
              .top_k = 3,
              .expert_hidden = 24,
              .shared_hidden = 48,
              .shared_gated = false,
              .dense_layers = {0}};
  ModelConfig v2 = lite;
  v2.mla.q_lora_rank = 24;
  v2.mla.v_head_dim = 12;
  v2.moe.n_group = 4;
  v2.moe.topk_group = 2;
  v2.moe.routed_scale = 1.5f;
  ModelConfig v3 = v2;
  v3.moe = {.n_experts = 16,
            .top_k = 4,
            .expert_hidden = 16,
            .norm_topk_prob = true,
            .shared_hidden = 16,
            .shared_gated = false,
            .scoring = MoeConfig::Scoring::kSigmoid,
            .score_bias = true,
            .n_group = 4,
            .topk_group = 2,
            .group_score = MoeConfig::GroupScore::kBestTwo,
            .routed_scale = 2.5f,
            .dense_layers = {0}};
  v3.rope_scaling = DeepSeekYarn(4.0f, 1.0f, 32.0f);
  v3.rope_scaling.original_max_position = 64;
  return {{"deepseek-v2-lite-small", lite}, {"deepseek-v2-small", v2}, {"deepseek-v3-small", v3}};
}

namespace {

struct NamedShapeEntry {
  const char* name;
  ModelConfig (*make)();
};
constexpr NamedShapeEntry kNamedShapes[] = {
    {"stories15M", Stories15MShape},
    {"stories110M", Stories110MShape},
    {"llama3.2-1b", Llama32_1BShape},
    {"llama3-8b", Llama3_8BShape},
    {"llama3-70b", Llama3_70BShape},
    {"qwen3-small", Qwen3SmallShape},
    {"qwen3-0.6b", Qwen3_0_6BShape},
    {"qwen3-30b-a3b", Qwen3_30B_A3BShape},
    {"mixtral-8x7b", Mixtral8x7BShape},
    {"olmoe-1b-7b", Olmoe1B7BShape},
    {"deepseek-v2-lite", DeepSeekV2LiteShape},
    {"deepseek-v3", DeepSeekV3Shape},
    {"kimi-k2", KimiK2Shape},
};

}  // namespace

std::string NamedShapeList() {
  std::string out;
  for (const NamedShapeEntry& e : kNamedShapes)
    absl::StrAppend(&out, out.empty() ? "" : ", ", e.name);
  return out;
}

absl::StatusOr<ModelConfig> NamedShape(std::string_view name) {
  for (const NamedShapeEntry& e : kNamedShapes) {
    if (name == e.name) return e.make();
  }
  for (const auto& [small, config] : SmallMoeShapes()) {
    if (name == small) return config;
  }
  for (const auto& [small, config] : SmallDeepSeekShapes()) {
    if (name == small) return config;
  }
  return absl::InvalidArgumentError(absl::StrCat("no model shape is called '", std::string(name),
                                                 "'; use one of ", NamedShapeList()));
}

absl::StatusOr<std::string> SyntheticTokenizerBytes(int vocab_size) {
  constexpr int kFirstPiece = 3 + 256;
  if (vocab_size <= kFirstPiece) {
    return absl::InvalidArgumentError(
        absl::StrCat("a synthetic tokenizer needs a vocab_size above ", kFirstPiece,
                     " (3 control and 256 byte tokens); got ", vocab_size));
  }
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) pieces.push_back(absl::StrFormat("<0x%02X>", b));
  // Word-start pieces, letters, then two- and three-letter pieces, as many
  // as the vocabulary holds.
  const std::string letters = "etaoinshrdlcumwfgypbvkjxqz";
  const std::string space =
      " ";  // llama2.c pieces hold a plain space where SentencePiece has U+2581
  std::vector<std::string> made = {space};
  for (char c : letters) made.push_back(space + c);
  for (char c : letters) made.push_back(std::string(1, c));
  for (char a : letters) {
    for (char b : letters) made.push_back(std::string{a, b});
  }
  for (char a : letters) {
    for (char b : letters) made.push_back(space + a + b);
  }
  for (size_t i = 0; pieces.size() < static_cast<size_t>(vocab_size); ++i) {
    pieces.push_back(i < made.size() ? made[i] : absl::StrCat("<extra", i, ">"));
  }
  int32_t max_length = 0;
  for (const std::string& p : pieces) max_length = std::max<int32_t>(max_length, p.size());
  std::string out;
  auto put = [&out](const void* data, size_t n) { out.append(static_cast<const char*>(data), n); };
  put(&max_length, sizeof(max_length));
  for (size_t id = 0; id < pieces.size(); ++id) {
    // Byte and control tokens score 0; pieces by length, then order.
    const float score = id < kFirstPiece ? 0.0f
                                         : static_cast<float>(pieces[id].size()) -
                                               static_cast<float>(id) / (vocab_size + 1);
    const int32_t length = static_cast<int32_t>(pieces[id].size());
    put(&score, sizeof(score));
    put(&length, sizeof(length));
    put(pieces[id].data(), pieces[id].size());
  }
  return out;
}

}  // namespace tandem
