// What the workers of one cluster must agree on, and how the router picks
// the identity its pool serves. Pure functions of plain data: no clock, no
// network, no logging, so they are unit tested with made-up identities.
//
// Prefill workers copy KV blocks into decode workers byte for byte, and the
// router sends a request's prefill and decode to different workers: every
// worker, prefill and decode alike, must serve the same model (name and
// weights fingerprint) with the same KV layout (element type, block size)
// and vocabulary. A worker that disagrees is kept out of routing.
//
// The agreement rule (ChoosePoolIdentity): the pool's identity is the one
// reported by the most healthy workers; a tie keeps the current identity,
// and with none yet goes to the identity seen first. So a minority of
// misconfigured workers never takes over a serving pool, a worker restarted
// with the right model rejoins, and a complete redeploy (or a rolling one,
// once past half the workers) moves the pool to the new model.
#ifndef TANDEM_ROUTER_POOL_IDENTITY_H_
#define TANDEM_ROUTER_POOL_IDENTITY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "router/worker_snapshot.h"

namespace tandem::router {

struct ModelIdentity {
  std::string model;                // the served model name
  std::string weights_fingerprint;  // ModelWeights::Fingerprint()
  std::string model_shape;          // ModelConfig::ShapeString()
  std::string kv_dtype;             // "f32", "f16", "bf16"
  int32_t block_size = 0;
  int32_t vocab_size = 0;

  bool operator==(const ModelIdentity&) const = default;
};

// The identity a worker reported in its last stats.
ModelIdentity IdentityOf(const WorkerSnapshot& snapshot);

// "model 'x' (weights 0123456789abcdef, KV bf16 in blocks of 16 tokens,
// vocab_size 32000)", for log lines.
std::string DescribeIdentity(const ModelIdentity& identity);

// How `worker` differs from `pool`, one clause per field, e.g. "has kv_dtype
// bf16, the pool has f32; has block_size 32, the pool has 16". Empty when
// they agree.
std::string DescribeDifferences(const ModelIdentity& worker, const ModelIdentity& pool);

// Whether the router's tokenizer can serve a model of `model_vocab` ids:
// every id the tokenizer produces must be one of the model's. The model's
// vocabulary may be larger (embeddings padded to a multiple of 64 or 128, as
// Qwen's are). Empty when it fits or either size is unknown (<= 0), else
// e.g. "has vocab_size 512, smaller than the router's tokenizer (32000)".
std::string CheckTokenizerVocab(int32_t model_vocab, int32_t tokenizer_vocab);

// The pool's identity among the identities of the healthy workers that may
// serve (`seen`, one entry per worker, in the order the workers were first
// seen): the most frequent; ties go to `current`, then to the one seen
// first. `current` when `seen` is empty.
std::optional<ModelIdentity> ChoosePoolIdentity(const std::vector<ModelIdentity>& seen,
                                                const std::optional<ModelIdentity>& current);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_POOL_IDENTITY_H_
