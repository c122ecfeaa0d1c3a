// The inference engine: one forward pass of a Llama model over a mixed batch
// (decode tokens of some sequences and prefill chunks of others) against a
// paged KV cache.
//
// Thread-compatible: one thread (the scheduler's) drives an Engine. The
// backend may use many threads inside a step.
#ifndef TANDEM_COMMON_ENGINE_ENGINE_H_
#define TANDEM_COMMON_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compute/backend.h"
#include "common/kvcache/block_pool.h"
#include "common/kvcache/block_table.h"
#include "common/kvcache/kv_layout.h"
#include "common/model/model_weights.h"

namespace tandem {

// Most KV blocks an engine's cache may hold (a lease's first block must fit
// its 24-bit range too).
inline constexpr int kMaxKvBlocks = 1 << 24;

struct EngineOptions {
  int block_size = 16;
  // KV blocks in the pool; 0 sizes the pool for one full-context sequence.
  int num_blocks = 0;
  // Most tokens one step may carry (sizes the activation buffers).
  int max_batch_tokens = 1024;
  // Most rows of logits one step may return.
  int max_logit_rows = 256;
  // Element type of the paged KV cache; unset: the weights' type.
  std::optional<DType> kv_dtype = std::nullopt;
};

// One sequence's part of a step: `tokens` continue the sequence whose KV
// cache `table` holds (positions table->num_tokens() onwards). One entry per
// sequence per step.
struct BatchItem {
  BlockTable* table;
  std::span<const int32_t> tokens;
  bool want_logits = true;  // logits of the entry's last token
  // Logits of every token of the entry, in order (one row each; overrides
  // want_logits), e.g. for the log-probabilities of a prompt.
  bool all_logits = false;

  int logit_rows() const { return all_logits ? static_cast<int>(tokens.size()) : want_logits; }
};

class Engine {
 public:
  // Copies (and packs) the weights into backend memory in their own element
  // type (widened to f32 for a backend that computes in f32 only); `weights`
  // may be dropped afterwards. INVALID_ARGUMENT for impossible options or
  // matrices of mixed types, UNIMPLEMENTED when the backend cannot compute
  // with the weights' or the KV cache's type.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const ModelWeights& weights,
                                                        std::unique_ptr<Backend> backend,
                                                        const EngineOptions& options);
  ~Engine();

  const ModelConfig& config() const { return config_; }
  const KvLayout& kv_layout() const { return layout_; }
  BlockPool& block_pool() { return pool_; }
  Backend& backend() { return *backend_; }

  // The paged KV cache in backend memory (layout and element type:
  // kv_layout()), so that a KV transport can register it and copy blocks in
  // and out.
  void* kv_cache() { return cache_; }
  size_t kv_cache_bytes() const { return layout_.total_bytes(); }
  // Element type of the weight matrices in backend memory.
  DType weights_dtype() const { return weights_dtype_; }

  // A table for a new, empty sequence.
  BlockTable NewSequence() const { return BlockTable(layout_.block_size); }

  // Runs one forward pass over `items`, appending each item's tokens to its
  // sequence, and returns the logits of the items that want them,
  // [rows][vocab_size] in item order (BatchItem::logit_rows() each; at most
  // max_logit_rows in all). Nothing changes on error:
  // INVALID_ARGUMENT for bad input (empty item, token id out of range,
  // sequence past the context, batch over the configured limits) and
  // RESOURCE_EXHAUSTED when the KV pool cannot hold the new tokens.
  //
  // `kv_written(layer)`, when given, runs as soon as this step's K/V of
  // `layer` are in the cache (before the rest of the layer is computed), so
  // that a sender can ship layer l while layers l+1... are computed.
  absl::StatusOr<std::vector<float>> Step(std::span<const BatchItem> items,
                                          const std::function<void(int layer)>& kv_written = nullptr);

  // Makes `dst` (empty, or holding blocks reserved and not yet written) a
  // copy of the first `tokens` positions of `src`: it reserves what is
  // missing and copies the K/V of those positions, block by block, through
  // host memory. RESOURCE_EXHAUSTED when the pool cannot hold them (nothing
  // changes then), INVALID_ARGUMENT when `src` holds fewer tokens or `dst`
  // already holds some.
  absl::Status CopySequence(const BlockTable& src, int tokens, BlockTable& dst);

  // Frees a sequence's blocks.
  void Release(BlockTable& table) { table.Release(pool_); }

 private:
  struct Layer {
    const float* rms_att;
    MatrixRef wqkv;  // [q_dim + 2 kv_dim, dim]: q, k, v projections stacked
    const float* bqkv;  // [q_dim + 2 kv_dim] biases, or null
    MatrixRef wo;    // [dim, q_dim]
    const float* rms_ffn;
    MatrixRef w13;  // [2 hidden, dim]: gate rows, then up rows
    MatrixRef w2;
  };

  Engine(const ModelConfig& config, std::unique_ptr<Backend> backend, const EngineOptions& options);
  absl::Status Init(const ModelWeights& weights);
  absl::Status Validate(std::span<const BatchItem> items) const;
  void Forward(int rows, int logit_rows, const std::function<void(int layer)>& kv_written);

  ModelConfig config_;
  EngineOptions options_;
  KvLayout layout_;
  std::unique_ptr<Backend> backend_;
  BlockPool pool_;

  // Backend memory.
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  std::vector<Layer> layers_;
  DType weights_dtype_ = DType::kF32;
  MatrixRef embedding_{nullptr, DType::kF32};
  const float* rms_final_ = nullptr;
  MatrixRef classifier_{nullptr, DType::kF32};
  const float* rope_ = nullptr;  // [seq_len][head_dim / 2][cos, sin]
  void* cache_ = nullptr;
  float *x_ = nullptr, *xb_ = nullptr, *qkv_ = nullptr, *att_ = nullptr;
  float *hb_ = nullptr, *hb2_ = nullptr, *logits_ = nullptr;

  // Per-step host scratch.
  std::vector<int32_t> ids_, positions_, logit_rows_;
  std::vector<AttentionRow> rows_;
  std::vector<uint8_t> copy_staging_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_ENGINE_H_
