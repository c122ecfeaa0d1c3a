#include "common/model/llama2c_checkpoint.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);

// Element counts of the tensors that follow the header, in file order.
struct Layout {
  int64_t embedding, per_layer_norm, wq, wk, wv, wo, w1, w2, w3, rms_final, rope, classifier;
  int64_t Total() const {
    return embedding + 2 * per_layer_norm + wq + wk + wv + wo + w1 + w2 + w3 + rms_final + rope +
           classifier;
  }
};

Layout LayoutOf(const ModelConfig& c) {
  const int64_t d = c.dim, h = c.hidden_dim, l = c.n_layers, kv = c.kv_dim();
  Layout lay;
  lay.embedding = int64_t{c.vocab_size} * d;
  lay.per_layer_norm = l * d;
  lay.wq = l * d * d;
  lay.wk = l * kv * d;
  lay.wv = l * kv * d;
  lay.wo = l * d * d;
  lay.w1 = l * h * d;
  lay.w2 = l * d * h;
  lay.w3 = l * h * d;
  lay.rms_final = d;
  lay.rope = int64_t{c.seq_len} * c.head_dim();  // two tables of [seq_len, head_dim / 2]
  lay.classifier = c.shared_classifier ? 0 : lay.embedding;
  return lay;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadLlama2cCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  auto shared = std::make_shared<const MappedFile>(std::move(file));
  const std::span<const uint8_t> bytes = shared->bytes();
  return ParseLlama2cCheckpoint(std::move(shared), bytes, path);
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ParseLlama2cCheckpoint(
    std::shared_ptr<const void> storage, std::span<const uint8_t> bytes, const std::string& path) {
  if (bytes.size() < kHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("model file '", path, "' is truncated: ", bytes.size(),
                     " bytes, fewer than the 28-byte llama2.c header"));
  }
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model file '", path, "' is not 4-byte aligned in memory"));
  }
  int32_t h[7];
  std::memcpy(h, bytes.data(), kHeaderBytes);
  ModelConfig config;
  config.dim = h[0];
  config.hidden_dim = h[1];
  config.n_layers = h[2];
  config.n_heads = h[3];
  config.n_kv_heads = h[4];
  config.shared_classifier = h[5] > 0;
  config.vocab_size = h[5] > 0 ? h[5] : (h[5] == INT32_MIN ? 0 : -h[5]);
  config.seq_len = h[6];
  if (absl::Status s = config.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model file '", path, "' has an impossible llama2.c header: ", s.message()));
  }
  const Layout lay = LayoutOf(config);
  const uint64_t expected = kHeaderBytes + static_cast<uint64_t>(lay.Total()) * sizeof(float);
  if (bytes.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model file '", path, "' is ", bytes.size(), " bytes but its header (", config.ToString(),
        ") needs ", expected, (bytes.size() < expected ? "; the file is truncated" : "")));
  }

  auto weights = std::make_unique<ModelWeights>();
  weights->config = config;
  weights->source = path;
  const float* p = reinterpret_cast<const float*>(bytes.data() + kHeaderBytes);
  auto take = [&p](int64_t n) {
    std::span<const float> s(p, static_cast<size_t>(n));
    p += n;
    return s;
  };
  const int L = config.n_layers;
  weights->layers.resize(L);
  weights->token_embedding = take(lay.embedding);
  // Per-kind tensors are stacked over layers; slice them layer by layer.
  auto slice = [&](int64_t total, Tensor LayerWeights::*field) {
    std::span<const float> all = take(total);
    const int64_t each = total / L;
    for (int l = 0; l < L; ++l) weights->layers[l].*field = all.subspan(l * each, each);
  };
  slice(lay.per_layer_norm, &LayerWeights::rms_att);
  slice(lay.wq, &LayerWeights::wq);
  slice(lay.wk, &LayerWeights::wk);
  slice(lay.wv, &LayerWeights::wv);
  slice(lay.wo, &LayerWeights::wo);
  slice(lay.per_layer_norm, &LayerWeights::rms_ffn);
  slice(lay.w1, &LayerWeights::w1);
  slice(lay.w2, &LayerWeights::w2);
  slice(lay.w3, &LayerWeights::w3);
  weights->rms_final = take(lay.rms_final);
  take(lay.rope);
  weights->classifier = config.shared_classifier ? weights->token_embedding : take(lay.classifier);
  weights->storage = std::move(storage);
  return weights;
}

absl::Status WriteLlama2cCheckpoint(const ModelWeights& w, const std::string& path) {
  RETURN_IF_ERROR(w.config.Validate());
  const ModelConfig& cfg = w.config;
  if (cfg.attention_bias || cfg.qk_norm != QkNorm::kNone || cfg.head_size != 0 ||
      cfg.rope_layout != RopeLayout::kInterleaved ||
      cfg.rope_scaling.type != RopeScaling::Type::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights from '", w.source, "' (", cfg.ToString(),
        ") need what a llama2.c checkpoint cannot say (biases, q/k norms, an explicit head_dim, "
        "half-split RoPE or RoPE scaling); write GGUF or a Hugging Face folder"));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InvalidArgumentError(absl::StrCat("cannot write '", path, "'"));
  const ModelConfig& c = w.config;
  const int32_t header[7] = {c.dim,        c.hidden_dim,
                             c.n_layers,   c.n_heads,
                             c.n_kv_heads, c.shared_classifier ? c.vocab_size : -c.vocab_size,
                             c.seq_len};
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  auto put = [&out](const Tensor& t) {
    const std::vector<float> s = t.ToFloats();
    out.write(reinterpret_cast<const char*>(s.data()),
              static_cast<std::streamsize>(s.size() * sizeof(float)));
  };
  put(w.token_embedding);
  for (auto field : {&LayerWeights::rms_att, &LayerWeights::wq, &LayerWeights::wk,
                     &LayerWeights::wv, &LayerWeights::wo, &LayerWeights::rms_ffn,
                     &LayerWeights::w1, &LayerWeights::w2, &LayerWeights::w3}) {
    for (const LayerWeights& layer : w.layers) put(layer.*field);
  }
  put(w.rms_final);
  const std::vector<float> rope(static_cast<size_t>(c.seq_len) * c.head_dim(), 0.0f);
  put(Tensor(rope));
  if (!c.shared_classifier) put(w.classifier);
  out.flush();
  if (!out) return absl::DataLossError(absl::StrCat("short write to '", path, "'"));
  return absl::OkStatus();
}

}  // namespace tandem
