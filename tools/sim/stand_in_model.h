// The model a simulated worker holds in place of the one it simulates: the
// target's vocabulary, context, layer count and RoPE, with one attention
// head of two dimensions and a feed-forward width of two. Its engine keeps
// the target's block pool (the same blocks and block size, so admission,
// preemption and prefix caching decide as they would) in a few hundred
// bytes per block instead of the target's megabytes, and its weights take
// a few megabytes: a 70B model's cluster with 80 GB pools simulates on a
// laptop. The simulated executor computes nothing, so the stand-in's
// numbers never matter; what a KV transfer of the target would cost comes
// from scaling the stand-in's bytes on the link (KvByteScale).
#ifndef TANDEM_TOOLS_SIM_STAND_IN_MODEL_H_
#define TANDEM_TOOLS_SIM_STAND_IN_MODEL_H_

#include "common/base/dtype.h"
#include "common/model/model_config.h"

namespace tandem::sim {

// `vocab_size` > 0 cuts the vocabulary to the ids a workload sends: the
// sampler scans every logit of a step (128,256 of them for Llama 3), and
// the cost model reads the target's vocabulary, not this one.
ModelConfig StandInConfig(const ModelConfig& target, int vocab_size = 0);

// Bytes of the KV cache per token of `config` with `dtype` elements.
double KvBytesPerToken(const ModelConfig& config, DType dtype);

// What one byte of the stand-in's KV (in `stand_in_dtype`) stands for in
// the target's (in `target_dtype`).
double KvByteScale(const ModelConfig& target, DType target_dtype, DType stand_in_dtype);

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_STAND_IN_MODEL_H_
