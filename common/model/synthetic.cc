#include "common/model/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// SplitMix64: a tiny, well-known generator whose output does not depend on
// the standard library, so synthetic weights are identical everywhere.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float Symmetric() { return static_cast<float>((Next() >> 40) * 0x1.0p-23 - 1.0); }

 private:
  uint64_t state_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> MakeSyntheticModel(const ModelConfig& config,
                                                                 uint64_t seed) {
  RETURN_IF_ERROR(config.Validate());
  const int64_t d = config.dim, h = config.hidden_dim, kv = config.kv_dim();
  const int64_t v = config.vocab_size, L = config.n_layers;
  const int64_t per_layer = 2 * d + 2 * d * d + 2 * kv * d + 3 * d * h;
  const int64_t total = v * d * (config.shared_classifier ? 1 : 2) + L * per_layer + d;
  auto storage = std::make_shared<std::vector<float>>(static_cast<size_t>(total));
  SplitMix64 rng(seed * 0x2545F4914F6CDD1Dull + 1);
  float* p = storage->data();

  // Uniform with variance 1/fan_in keeps each projection's output near unit
  // scale: U(-a, a) has variance a^2 / 3.
  auto matrix = [&](int64_t rows, int64_t cols) {
    const float a = std::sqrt(3.0f / static_cast<float>(cols));
    std::span<const float> s(p, static_cast<size_t>(rows * cols));
    for (int64_t i = 0; i < rows * cols; ++i) *p++ = a * rng.Symmetric();
    return s;
  };
  auto norm = [&](int64_t n) {
    std::span<const float> s(p, static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) *p++ = 1.0f + 0.1f * rng.Symmetric();
    return s;
  };

  auto weights = std::make_unique<ModelWeights>();
  weights->config = config;
  weights->source = "synthetic";
  weights->token_embedding = matrix(v, d);
  weights->layers.resize(L);
  for (LayerWeights& layer : weights->layers) {
    layer.rms_att = norm(d);
    layer.wq = matrix(d, d);
    layer.wk = matrix(kv, d);
    layer.wv = matrix(kv, d);
    layer.wo = matrix(d, d);
    layer.rms_ffn = norm(d);
    layer.w1 = matrix(h, d);
    layer.w2 = matrix(d, h);
    layer.w3 = matrix(h, d);
  }
  weights->rms_final = norm(d);
  weights->classifier = config.shared_classifier ? weights->token_embedding : matrix(v, d);
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
