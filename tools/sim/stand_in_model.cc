#include "tools/sim/stand_in_model.h"

#include <algorithm>

namespace tandem::sim {

ModelConfig StandInConfig(const ModelConfig& target, int vocab_size) {
  ModelConfig c = target;
  c.dim = 2;
  c.hidden_dim = 2;
  c.n_heads = 1;
  c.n_kv_heads = 1;
  c.head_size = 2;
  c.attention_bias = false;
  // Grouped-query attention of the same shape stands in for latent
  // attention (KvByteScale keeps the target's KV bytes).
  c.mla = MlaConfig{};
  if (vocab_size > 0) c.vocab_size = std::min(target.vocab_size, vocab_size);
  return c;
}

double KvBytesPerToken(const ModelConfig& config, DType dtype) {
  return static_cast<double>(config.KvCacheValuesPerToken()) *
         static_cast<double>(DTypeSize(dtype));
}

double KvByteScale(const ModelConfig& target, DType target_dtype, DType stand_in_dtype) {
  return KvBytesPerToken(target, target_dtype) /
         KvBytesPerToken(StandInConfig(target), stand_in_dtype);
}

}  // namespace tandem::sim
