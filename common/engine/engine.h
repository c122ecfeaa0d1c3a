// The inference engine: one forward pass of a Llama-family model over a mixed batch
// (decode tokens of some sequences and prefill chunks of others) against a
// paged KV cache.
//
// Thread-compatible: one thread (the scheduler's) drives an Engine. The
// backend may use many threads inside a step.
#ifndef TANDEM_COMMON_ENGINE_ENGINE_H_
#define TANDEM_COMMON_ENGINE_ENGINE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/compute/backend.h"
#include "common/engine/moe_routing.h"
#include "common/engine/step_executor.h"
#include "common/kvcache/block_pool.h"
#include "common/kvcache/block_table.h"
#include "common/kvcache/kv_layout.h"
#include "common/model/model_weights.h"

namespace tandem {

// Most KV blocks an engine's cache may hold (a lease's first block must fit
// its 24-bit range too).
inline constexpr int kMaxKvBlocks = 1 << 24;

// The share of a device's memory a worker fills by default
// (EngineOptions::gpu_memory_fraction): the rest is headroom for what a
// backend allocates as it computes (scratch, library workspaces).
inline constexpr double kDefaultGpuMemoryFraction = 0.9;

// The share of device memory a worker's --gpu_memory_fraction asks for:
// kDefaultGpuMemoryFraction when not given; INVALID_ARGUMENT (saying what to
// change) when given for a backend without device memory, or beside an
// explicit KV block count (`kv_blocks` != 0), which sizes the pool instead.
absl::StatusOr<double> GpuMemoryFractionFor(Backend& backend, std::optional<double> requested,
                                            int kv_blocks);

struct EngineOptions;

// The KV cache's layout for `config` under `options` (latent for latent
// attention: one scale per token for int8).
KvLayout KvLayoutFor(const ModelConfig& config, const EngineOptions& options);

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
  // With a backend that reports its device memory (QueryDeviceMemory), the
  // KV pool is sized instead of taking num_blocks: the engine takes this
  // share of the device's memory, and the KV pool gets what its weights and
  // activation buffers leave of it, at most kMaxKvBlocks. What others hold
  // on the device does not count (engines sharing a device each take their
  // share), nor do the backend's own workspaces (the rest is headroom for
  // them). In (0, 1]. Unset, or a backend in host memory: num_blocks.
  std::optional<double> gpu_memory_fraction = std::nullopt;
  // Latent attention (DeepSeek): which form computes it, by default the
  // cheaper per run of rows (LatentShape); tests pin one to compare them.
  LatentShape::Form latent_form = LatentShape::Form::kCheaper;
};

// The KV blocks of `block_bytes` each (every layer of one block) that fit
// in `fraction` of a device of `total_bytes` beside the engine's other
// `used_bytes` (weights, activation buffers), at most kMaxKvBlocks.
// INVALID_ARGUMENT, saying what to change, for a fraction outside (0, 1] or
// one that leaves no room for a single block.
absl::StatusOr<int> KvBlocksForDeviceMemory(size_t total_bytes, size_t used_bytes, double fraction,
                                            size_t block_bytes);

class Engine final : public StepExecutor {
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
  // What one step may carry (ValidateStep).
  StepLimits step_limits() const {
    return StepLimits{layout_.block_size, config_.vocab_size, config_.seq_len,
                      options_.max_batch_tokens, options_.max_logit_rows};
  }
  BlockPool& block_pool() { return pool_; }
  Backend& backend() { return *backend_; }

  // OK while the backend works. Once a step (or CopySequence) found the
  // backend failed (Backend::status(), which a GPU backend keeps for errors
  // of its asynchronous operations), that error, naming the backend and
  // saying the engine is unusable: every later Step and CopySequence
  // returns it, for the backend is broken for good. Thread-safe, unlike the
  // rest of the engine, so that a server can report its health.
  absl::Status status() const;
  // Runs `listener` once, on the thread driving the engine, when it fails
  // (here and now when it has failed already); replaces the listener set
  // before, and null removes it. When this returns, the listener replaced is
  // not running and will not run, so that what it uses may go. The listener
  // must not call SetFailureListener. Thread-safe.
  void SetFailureListener(std::function<void(const absl::Status&)> listener);

  // Bytes of the device's memory when the backend reports it (queried once,
  // at Create), else 0.
  size_t device_memory_bytes() const { return device_memory_bytes_; }

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
  // Items with pick_greedy add no rows: the index of their largest logit is
  // computed by the backend (Backend::Argmax) and only the indices are
  // copied to the host, into `*picks`.
  //
  // A backend failure (status()), found before the pass or once it has
  // run (the copy of the logits to host memory waits for a GPU backend's
  // work, and a step without logits copies a few bytes to wait just the
  // same), is returned with no logits. The step's sequences are then not
  // advanced (num_tokens() as before: the K/V of their new positions is
  // garbage and never counts) but keep the blocks reserved for the new
  // tokens, which Release frees with the rest; the caller fails their
  // requests and releases them. Every later step returns the same error.
  //
  // `kv_written(layer)`, when given, runs as soon as this step's K/V of
  // `layer` are in the cache (before the rest of the layer is computed), so
  // that a sender can ship layer l while layers l+1... are computed. It
  // does not run for a layer the backend failed in (nor for later ones).
  absl::StatusOr<std::vector<float>> Step(std::span<const BatchItem> items,
                                          const std::function<void(int layer)>& kv_written,
                                          std::vector<int32_t>* picks) override;
  using StepExecutor::Step;

  // Makes `dst` (empty, or holding blocks reserved and not yet written) a
  // copy of the first `tokens` positions of `src`: it reserves what is
  // missing and copies the K/V of those positions, block by block, through
  // host memory. RESOURCE_EXHAUSTED when the pool cannot hold them (nothing
  // changes then), INVALID_ARGUMENT when `src` holds fewer tokens or `dst`
  // already holds some. A backend failure is returned as Step does: `dst`
  // keeps the blocks it reserved and holds no tokens.
  absl::Status CopySequence(const BlockTable& src, int tokens, BlockTable& dst);

  // Tokens routed to each expert of each layer since the engine was made or
  // ResetExpertLoad() last ran, [layer][expert] (empty for a dense layer): a
  // skewed router shows here.
  const std::vector<std::vector<uint64_t>>& expert_load() const { return expert_load_; }
  // Zeroes expert_load() (after a warm-up, whose tokens no one asked for).
  void ResetExpertLoad() {
    for (std::vector<uint64_t>& layer : expert_load_) std::fill(layer.begin(), layer.end(), 0);
  }

  // Frees a sequence's blocks.
  void Release(BlockTable& table) { table.Release(pool_); }

 private:
  // Matrices stacked by rows (q, k and v; gate and up) in one backend
  // buffer, or in one per run of equal types when their types differ (a
  // Q4_K_M file keeps some v projections in Q6_K).
  struct MatrixPart {
    MatrixRef ref;
    int rows;
  };
  using StackedMatrix = std::vector<MatrixPart>;

  // One SwiGLU expert: gate and up rows stacked, then down.
  struct Expert {
    StackedMatrix w13 = {};  // [2 hidden, dim]
    StackedMatrix w2 = {};   // [dim, hidden]
    int hidden = 0;
  };

  struct Layer {
    const float* rms_att;
    StackedMatrix wqkv;   // [q_dim + 2 kv_dim, dim]: q, k, v projections stacked
    const float* bqkv;    // [q_dim + 2 kv_dim] biases, or null
    const float* q_norm;  // per-head [head_dim] or whole [q_dim] norm, or null
    const float* k_norm;
    StackedMatrix wo;  // [dim, q_dim]
    const float* rms_ffn;
    StackedMatrix w13;  // [2 hidden, dim]: gate rows, then up rows
    StackedMatrix w2;
    // A mixture-of-experts layer instead of w13 and w2: the router
    // [n_experts, dim], the experts, and the shared expert (hidden 0 when
    // there is none) with its sigmoid gate [1, dim].
    StackedMatrix router;
    std::vector<Expert> experts;
    Expert shared;
    StackedMatrix shared_expert_gate;
    // Latent attention instead of wqkv: q's down-projection and norm (or
    // none without a q rank) and up-projection (or the whole projection),
    // its rows ordered as every head's no-rope part, then every head's rope
    // part; the latent and rope key's projection and the latent's norm;
    // the per-head up-projection kv_b in f32 (LatentAttention).
    StackedMatrix wq_a;
    const float* q_a_norm = nullptr;
    StackedMatrix wq_b;
    StackedMatrix wkv_a;
    const float* kv_a_norm = nullptr;
    const float* kv_b = nullptr;
  };

  // out[m, n] (+)= x[m, k] * w^T over the parts of `w`.
  void MatMul(const float* x, const StackedMatrix& w, float* out, int m, int n, int k,
              bool accumulate);
  // The type a weight of type `stored` is uploaded in: its own where the
  // backend computes with it, else widened.
  DType UploadType(DType stored) const;

  Engine(const ModelConfig& config, std::unique_ptr<Backend> backend, const EngineOptions& options);
  absl::Status Init(const ModelWeights& weights);
  // Sizes the KV pool from the device's memory (gpu_memory_fraction) when
  // the backend reports it; before the cache is allocated.
  absl::Status SizeKvPool();
  // On the driving thread: the backend's error, if any, becomes the
  // engine's failure (listener told); returns status().
  absl::Status CheckBackend();
  void Forward(int rows, int logit_rows, const std::function<void(int layer)>& kv_written);
  // Backend memory of `bytes` (at least 1), kept in buffers_.
  absl::StatusOr<void*> AllocBytes(size_t bytes);
  // Copies tensors into backend memory, back to back, each in its upload
  // type, as a matrix of rows of k values: one buffer per run of parts of
  // equal type.
  absl::StatusOr<StackedMatrix> Upload(const std::vector<Tensor>& parts, int64_t k);
  // Vectors (norms, biases) are small and kept as f32 whatever their type.
  absl::StatusOr<float*> UploadF32(const std::vector<Tensor>& parts);
  // Uploads layer `lw`'s latent attention into `layer` (engine_mla.cc).
  absl::Status InitLatent(const LayerWeights& lw, Layer& layer);
  // att_ = the layer's latent attention of xb_, its latents written to the
  // cache (engine_mla.cc); false when the backend failed.
  bool LatentAttentionLayer(const Layer& layer, int l, int rows,
                            const std::function<void(int layer)>& kv_written);
  // x_ += the layer's FFN (dense or mixture of experts) of norm(x_).
  void Ffn(const Layer& layer, int l, int rows);
  // x_ += the layer's mixture of experts of xb_ (engine_moe.cc): routes on
  // the host, then runs each touched expert once over the rows routed to it.
  void MoeFfn(const Layer& layer, int l, int rows);
  // x_[rows[i]] += weights[i] * expert(xb_[rows[i]]).
  void RunExpert(const Expert& expert, std::span<const int32_t> rows,
                 std::span<const float> weights);

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
  const float* rope_ = nullptr;  // [seq_len][rope_dim / 2][cos, sin]
  void* cache_ = nullptr;
  float *x_ = nullptr, *xb_ = nullptr, *qkv_ = nullptr, *att_ = nullptr;
  float *hb_ = nullptr, *hb2_ = nullptr, *logits_ = nullptr;
  // Mixture of experts: router logits [tokens, n_experts], the rows routed
  // to one expert gathered [tokens, dim], and its outputs [tokens, dim].
  float *router_logits_ = nullptr, *expert_in_ = nullptr, *expert_out_ = nullptr;
  // Latent attention: q's down-projection [tokens, q_lora_rank] and the
  // latent and rope key [tokens, kv_lora_rank + qk_rope_head_dim].
  float *q_low_ = nullptr, *latent_ = nullptr;
  int32_t* picks_ = nullptr;  // [max_logit_rows] greedy picks

  // Per-step host scratch.
  std::vector<int32_t> ids_, positions_, logit_rows_, picked_rows_;
  std::vector<AttentionRow> rows_;
  std::vector<uint8_t> copy_staging_;
  std::vector<float> host_router_, picked_weights_, ones_;
  std::vector<int32_t> picked_, all_rows_;
  std::unique_ptr<ExpertRouter> expert_router_;
  // Per layer: the router's score bias in host memory (empty without).
  std::vector<std::vector<float>> router_bias_;
  std::vector<std::vector<int32_t>> expert_rows_;
  std::vector<std::vector<float>> expert_weights_;
  std::vector<std::vector<uint64_t>> expert_load_;

  size_t device_memory_bytes_ = 0;
  mutable absl::Mutex failure_mu_;
  absl::Status failure_ ABSL_GUARDED_BY(failure_mu_);
  // Held while the listener runs, so that replacing it waits for the run;
  // taken before failure_mu_ when both are.
  absl::Mutex listener_mu_;
  std::function<void(const absl::Status&)> listener_ ABSL_GUARDED_BY(listener_mu_);
  // Whether the failure was handed to the listeners (there may be none).
  bool failure_announced_ ABSL_GUARDED_BY(listener_mu_) = false;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_ENGINE_H_
