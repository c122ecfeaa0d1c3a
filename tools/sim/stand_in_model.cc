#include "tools/sim/stand_in_model.h"

namespace tandem::sim {

ModelConfig StandInConfig(const ModelConfig& target) {
  ModelConfig c = target;
  c.dim = 2;
  c.hidden_dim = 2;
  c.n_heads = 1;
  c.n_kv_heads = 1;
  c.head_size = 2;
  c.attention_bias = false;
  return c;
}

double KvBytesPerToken(const ModelConfig& config, DType dtype) {
  return 2.0 * config.kv_dim() * config.n_layers * static_cast<double>(DTypeSize(dtype));
}

double KvByteScale(const ModelConfig& target, DType target_dtype, DType stand_in_dtype) {
  return KvBytesPerToken(target, target_dtype) /
         KvBytesPerToken(StandInConfig(target), stand_in_dtype);
}

}  // namespace tandem::sim
