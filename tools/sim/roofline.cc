#include "tools/sim/roofline.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace tandem::sim {
namespace {

// Published figures: NVIDIA's data sheets (dense tensor rate, no sparsity).
const DeviceSpec kDevices[] = {
    {.name = "h100", .memory_bandwidth = 3.35e12, .flops = 989.4e12, .memory_bytes = 80e9},
    {.name = "h200", .memory_bandwidth = 4.8e12, .flops = 989.4e12, .memory_bytes = 141e9},
    {.name = "a100", .memory_bandwidth = 2.039e12, .flops = 312e12, .memory_bytes = 80e9},
};

// The longer of `flops` at the compute share and `bytes` at the bandwidth
// share.
double Roof(const RooflineCost& c, double flops, double bytes) {
  const double compute = flops / (c.device.flops * c.efficiency.compute);
  const double memory = bytes / (c.device.memory_bandwidth * c.efficiency.bandwidth);
  return std::max(compute, memory);
}

}  // namespace

absl::StatusOr<DeviceSpec> FindDevice(std::string_view name) {
  for (const DeviceSpec& d : kDevices) {
    if (d.name == name) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--device is '", absl::string_view(name.data(), name.size()), "'; use h100, h200 or a100"));
}

// Parameters of a model's layers: attention and dense FFNs; the sparse
// layers' router and shared expert; and one routed expert of each sparse
// layer, `sparse_layers` of them.
struct LayerParams {
  double dense = 0;
  double expert = 0;
  int sparse_layers = 0;
};

// The attention's weights in one layer: q, k, v and output projections, or
// latent attention's q (its rank's two and norm, or one), the latent and
// rope key's projection, the up-projection and the output.
double AttentionParams(const ModelConfig& c) {
  const double d = c.dim, q = c.q_dim();
  if (!c.is_mla()) return 2 * q * d + 2.0 * c.kv_dim() * d;
  const MlaConfig& a = c.mla;
  const double qr = a.q_lora_rank, kr = a.kv_lora_rank, heads = c.n_heads;
  return (qr > 0 ? qr * d + qr + q * qr : q * d) + (kr + a.qk_rope_head_dim) * d + kr +
         heads * (a.qk_nope_head_dim + a.v_head_dim) * kr + d * c.attention_out_dim();
}

// Multiply-adds (2 flops each) of one query over one cached position, every
// head: the score and the weighted value. Latent attention in its absorbed
// form scores each head's query against the latent and rope key and sums
// latents (the up-projections are products, counted with the weights).
double AttentionFlopsPerPosition(const ModelConfig& c) {
  if (!c.is_mla()) return 4.0 * c.head_dim() * c.n_heads;
  const MlaConfig& a = c.mla;
  return 2.0 * c.n_heads * (2.0 * a.kv_lora_rank + a.qk_rope_head_dim);
}

LayerParams CountLayerParams(const ModelConfig& c) {
  const double d = c.dim, h = c.hidden_dim;
  const MoeConfig& m = c.moe;
  LayerParams p;
  for (int l = 0; l < c.n_layers; ++l) {
    p.dense += AttentionParams(c);
    if (!c.IsMoeLayer(l)) {
      p.dense += 3 * d * h;
      continue;
    }
    ++p.sparse_layers;
    p.dense += static_cast<double>(m.n_experts) * d +
               (m.shared_hidden > 0 ? 3 * d * m.shared_hidden + (m.shared_gated ? d : 0) : 0);
  }
  p.expert = 3 * d * m.expert_hidden;
  return p;
}

double RooflineCost::LayerWeightBytes() const {
  const LayerParams p = CountLayerParams(config);
  return (p.dense + p.expert * config.moe.n_experts * p.sparse_layers) * weight_bytes;
}

double RooflineCost::StepWeightBytes(int tokens) const {
  const LayerParams p = CountLayerParams(config);
  const double e = config.moe.n_experts;
  const double touched =
      e == 0 ? 0 : e * (1 - std::pow(1 - config.moe.top_k / e, std::max(tokens, 0)));
  return (p.dense + p.expert * touched * p.sparse_layers) * weight_bytes;
}

double RooflineCost::ActiveLayerParams() const {
  const LayerParams p = CountLayerParams(config);
  return p.dense + p.expert * config.moe.top_k * p.sparse_layers;
}

double RooflineCost::ClassifierBytes() const {
  return static_cast<double>(config.vocab_size) * config.dim * weight_bytes;
}

double RooflineCost::KvBytesPerToken() const {
  return static_cast<double>(config.KvCacheValuesPerToken()) * kv_bytes;
}

absl::Duration RooflineCost::operator()(const StepShape& shape) const {
  if (shape.tokens == 0) return efficiency.per_step;
  const double products =
      Roof(*this, 2.0 * shape.tokens * ActiveLayerParams(), StepWeightBytes(shape.tokens));
  const double attention_flops =
      static_cast<double>(shape.attended) * AttentionFlopsPerPosition(config) * config.n_layers;
  // Decode rows read their whole context; a prompt chunk's tokens share
  // theirs, so its attention is bound by its arithmetic.
  const double attention_bytes = static_cast<double>(shape.decode_attended) * KvBytesPerToken() +
                                 static_cast<double>(shape.tokens) * KvBytesPerToken();
  const double attention = Roof(*this, attention_flops, attention_bytes);
  double classifier = 0;
  if (shape.logit_rows > 0) {
    classifier =
        Roof(*this, 2.0 * shape.logit_rows * ClassifierBytes() / weight_bytes, ClassifierBytes());
  }
  const absl::Duration host =
      efficiency.per_logit * (static_cast<double>(shape.logit_rows) * config.vocab_size);
  return absl::Seconds(products + attention + classifier) + host + efficiency.per_step;
}

absl::StatusOr<int> DeviceKvBlocks(const RooflineCost& cost, int block_size, double fraction) {
  if (!(fraction > 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the memory fraction is ", fraction, "; give one in (0, 1]"));
  }
  // The embedding is the classifier's size, and is the classifier when tied.
  const double weights =
      cost.LayerWeightBytes() + cost.ClassifierBytes() * (cost.config.shared_classifier ? 1 : 2);
  const double room = cost.device.memory_bytes * fraction - weights;
  const double block = cost.KvBytesPerToken() * block_size;
  if (room < block) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's weights (", std::round(weights / 1e9), " GB) leave no room for KV in ",
        fraction, " of one ", cost.device.name, "'s ", cost.device.memory_bytes / 1e9,
        " GB: it needs several devices, which the simulator does not model"));
  }
  return static_cast<int>(std::min(room / block, 1e9));
}

nlohmann::json RooflineJson(const RooflineCost& cost) {
  return {{"device", cost.device.name},
          {"memory_bandwidth_gbs", cost.device.memory_bandwidth / 1e9},
          {"tflops", cost.device.flops / 1e12},
          {"bandwidth_share", cost.efficiency.bandwidth},
          {"compute_share", cost.efficiency.compute},
          {"per_logit_ns", absl::ToDoubleNanoseconds(cost.efficiency.per_logit)},
          {"weight_bytes", cost.weight_bytes},
          {"kv_bytes", cost.kv_bytes}};
}

}  // namespace tandem::sim
