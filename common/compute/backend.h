// The compute backend: memory and the operations of a Llama forward pass.
// The CPU backend is the numerical reference; others must match it within
// stated tolerances. All pointers are backend memory (host memory for the
// CPU backend) obtained from Allocate(). Calls are issued from one thread;
// a backend may use many threads inside one call.
#ifndef TANDEM_COMMON_COMPUTE_BACKEND_H_
#define TANDEM_COMMON_COMPUTE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/dtype.h"
#include "common/kvcache/kv_layout.h"

namespace tandem {

// Backend memory; freed when destroyed.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
  float* floats() { return static_cast<float*>(data()); }
};

// One row of a batch as attention sees it: the row's query attends to the
// cached positions [0, position] of the sequence whose blocks are `blocks`.
struct AttentionRow {
  int32_t position;
  std::span<const int32_t> blocks;
};

struct AttentionShape {
  int n_heads;
  int n_kv_heads;
  int head_dim;
  // RoPE pairs dimension i with i + head_dim / 2 (Hugging Face checkpoints)
  // instead of 2i with 2i + 1 (llama2.c, GGUF).
  bool rope_half_split = false;
};

// Multi-head latent attention (DeepSeek V2/V3) over a latent KV cache
// (KvLayout::latent): each cached slot holds a token's latent c
// (kv_rank values) and its rotated rope key (rope_dim values). Head h's key
// is [W_uk[h] c, rope key] and its value W_uv[h] c, where kv_b
// [n_heads * (nope_dim + v_dim), kv_rank] stacks per head W_uk[h]
// (nope_dim rows) then W_uv[h] (v_dim rows). The attention can be computed
// absorbed (W_uk[h] folded into the query, W_uv[h] applied after the
// weighted sum of latents: the cache is read as it is) or expanded (keys
// and values of every cached position computed from the latents first):
// the same numbers within float error, the cheaper one chosen per run of
// rows unless `form` says which.
struct LatentShape {
  enum class Form : uint8_t { kCheaper, kAbsorbed, kExpanded };
  int n_heads = 0;
  int kv_rank = 0;
  int nope_dim = 0;
  int rope_dim = 0;
  int v_dim = 0;
  float scale = 1.0f;  // of the scores (DeepSeek's, YaRN's correction included)
  Form form = Form::kCheaper;
};

// A weight matrix in backend memory, in the element type it is stored in.
struct MatrixRef {
  const void* data;
  DType dtype;
};

// One contiguous copy between a backend buffer and a host buffer: bytes
// [src_offset, src_offset + bytes) of the source to dst_offset on.
struct CopyRange {
  size_t src_offset;
  size_t dst_offset;
  size_t bytes;
};

// Moves KV bytes between backend memory and host staging memory while the
// backend goes on computing (on a GPU: a copy stream ordered after the
// compute work by events). Used by a backend whose memory is not host
// memory, so that a KV transport, which reads and writes host memory only,
// can ship what the engine computed and land what it receives.
//
// Copies of one copier finish in the order they were queued. Called from the
// thread that drives the backend.
class KvCopier {
 public:
  virtual ~KvCopier() = default;

  // Host memory this copier moves to and from at full speed (page-locked on
  // a GPU), which a transport may register; freed when destroyed.
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> AllocateStaging(size_t bytes) = 0;

  // Queues copies of `ranges` from backend memory `device` to host memory
  // `host`. They start only after every backend operation issued before
  // this call (e.g. the WriteKv of the layer just computed) and overlap the
  // operations issued after it. Returns a ticket for Finished().
  virtual absl::StatusOr<uint64_t> ToHost(const void* device, void* host,
                                          std::span<const CopyRange> ranges) = 0;
  // Queues copies of `ranges` from host memory `host` to backend memory
  // `device`. Backend operations that read the destination may be issued
  // once Finished(ticket) has said true.
  virtual absl::StatusOr<uint64_t> ToDevice(const void* host, void* device,
                                            std::span<const CopyRange> ranges) = 0;
  // Whether the copies of `ticket` have finished (never blocks); an error
  // when they failed (the backend is broken then). True again when asked
  // about a ticket that already finished; NOT_FOUND for one never issued.
  virtual absl::StatusOr<bool> Finished(uint64_t ticket) = 0;
};

// Memory of the device a backend computes on.
struct DeviceMemory {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // Operations return nothing and may run asynchronously, so a backend keeps
  // the first error any of them hit: OK while none failed. Once it is not OK
  // the backend is broken for good and every later result is garbage; the
  // engine checks it after each step and returns it instead of results.
  virtual absl::Status status() const { return absl::OkStatus(); }

  // The device's memory; nullopt for a backend on host memory.
  virtual std::optional<DeviceMemory> QueryDeviceMemory() { return std::nullopt; }

  // The copier for KV staging; nullptr when backend memory is host memory,
  // which a transport can use directly.
  virtual KvCopier* kv_copier() { return nullptr; }

  // OK when this backend computes with weights of `weights` type and a KV
  // cache of `kv` type; otherwise UNIMPLEMENTED saying what it supports.
  virtual absl::Status Supports(DType weights, DType kv) const = 0;

  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) = 0;
  virtual void CopyToDevice(const void* host, void* device, size_t bytes) = 0;
  virtual void CopyToHost(const void* device, void* host, size_t bytes) = 0;

  // out[m, n] (+)= x[m, k] * w[n, k]^T; adds to `out` when `accumulate`.
  // A 16-bit or quantized w is widened as it is read (never copied to f32
  // as a whole); sums are f32. A backend multiplies the quantized types
  // that its Supports() accepts.
  virtual void MatMul(const float* x, MatrixRef w, float* out, int m, int n, int k,
                      bool accumulate) = 0;
  void MatMul(const float* x, const float* w, float* out, int m, int n, int k, bool accumulate) {
    MatMul(x, MatrixRef{w, DType::kF32}, out, m, n, k, accumulate);
  }
  // The same into columns [0, n) of an output whose rows are `ldo` >= n
  // apart: one part of a stacked matrix whose parts differ in type. This
  // default multiplies row by row.
  virtual void MatMulColumns(const float* x, MatrixRef w, float* out, int ldo, int m, int n, int k,
                             bool accumulate) {
    if (ldo == n) {
      MatMul(x, w, out, m, n, k, accumulate);
      return;
    }
    for (int r = 0; r < m; ++r) {
      MatMul(x + int64_t{r} * k, w, out + int64_t{r} * ldo, 1, n, k, accumulate);
    }
  }

  // Called once for each weight matrix (`rows` rows of k values) after it
  // is copied into backend memory, before any product with it: a backend
  // may rearrange it in place into a layout of its own and returns the
  // reference to use from then on (the same bytes, perhaps another type).
  // This default keeps it as it is.
  virtual MatrixRef PrepareWeights(MatrixRef w, int64_t rows, int64_t k) {
    (void)rows;
    (void)k;
    return w;
  }

  // out[r, :] = table[ids[r], :] for r < rows, widened to f32.
  virtual void Embed(MatrixRef table, std::span<const int32_t> ids, int dim, float* out) = 0;
  void Embed(const float* table, std::span<const int32_t> ids, int dim, float* out) {
    Embed(MatrixRef{table, DType::kF32}, ids, dim, out);
  }

  // x[r, i] += bias[i] for r < rows, i < n; rows of x are `stride` apart.
  virtual void AddBias(float* x, int stride, const float* bias, int rows, int n) = 0;

  // out[r] = x[r] / rms(x[r]) * weight, rows of `dim`.
  virtual void RmsNorm(const float* x, const float* weight, float* out, int rows, int dim,
                       float eps) = 0;

  // In place: each of the `heads` groups of `head_dim` values at the start
  // of every row of x (rows `stride` apart) becomes group / rms(group) *
  // weight, weight [head_dim] shared by the groups: the q/k norms (per head,
  // or heads = 1 over a whole projection).
  virtual void RmsNormHeads(float* x, int stride, const float* weight, int rows, int heads,
                            int head_dim, float eps) = 0;

  // Rotates pairs of every head of q ([rows, n_heads * head_dim], row stride
  // q_stride) and k ([rows, n_kv_heads * head_dim], stride k_stride), pair i
  // by position * freq_i, using the precomputed `cos_sin` table
  // [max_position][head_dim / 2][2]. Pair i is (2i, 2i+1), or (i, i +
  // head_dim/2) when shape.rope_half_split.
  virtual void Rope(float* q, int q_stride, float* k, int k_stride,
                    std::span<const int32_t> positions, const AttentionShape& shape,
                    const float* cos_sin) = 0;

  // dst[i, :] = src[rows[i], :] for i < rows.size(), rows of n floats: the
  // tokens routed to one expert, gathered.
  virtual void GatherRows(const float* src, std::span<const int32_t> rows, int n, float* dst) = 0;
  // dst[rows[i], :] += weights[i] * src[i, :] for i < rows.size(), rows of n
  // floats (distinct rows): an expert's outputs added back, weighted.
  virtual void ScatterAddRows(const float* src, std::span<const int32_t> rows,
                              std::span<const float> weights, int n, float* dst) = 0;

  // out[r, i] = silu(gate_up[r, i]) * gate_up[r, hidden + i].
  virtual void SwiGlu(const float* gate_up, float* out, int rows, int hidden) = 0;

  // Writes row r's key k[r] and value v[r] (kv_dim floats each, row strides
  // k_stride / v_stride) into the cache slot of rows[r].position, rounded to
  // layout.dtype. A latent layout has no values: v is not read.
  virtual void WriteKv(const float* k, int k_stride, const float* v, int v_stride,
                       std::span<const AttentionRow> rows, int layer, const KvLayout& layout,
                       void* cache) = 0;

  // Causal attention of each row's query (q row stride q_stride) over the
  // cached keys/values of positions [0, position] of its sequence (grouped
  // heads share a KV head), into out[r, n_heads * head_dim].
  virtual void PagedAttention(const float* q, int q_stride, std::span<const AttentionRow> rows,
                              int layer, const KvLayout& layout, const void* cache,
                              const AttentionShape& shape, float* out) = 0;

  // OK when this backend computes LatentAttention; otherwise UNIMPLEMENTED
  // saying so.
  virtual absl::Status SupportsLatentAttention() const {
    return absl::UnimplementedError(
        absl::StrCat("the ", std::string(name()),
                     " backend does not compute multi-head latent "
                     "attention (DeepSeek V2/V3) yet; use --backend cpu"));
  }
  // Causal latent attention of each row's query over the latents of
  // positions [0, position] of its sequence. q's rows (stride q_stride) hold
  // the no-rope parts of every head (n_heads * nope_dim values, head by
  // head), then the rotated rope parts (n_heads * rope_dim); out[r] holds
  // n_heads * v_dim values. kv_b is f32 backend memory.
  virtual void LatentAttention(const float* q, int q_stride, std::span<const AttentionRow> rows,
                               int layer, const KvLayout& layout, const void* cache,
                               const LatentShape& shape, const float* kv_b, float* out) = 0;

  // out[r] = the index of the largest of x[r, 0..n) for r < rows (rows n
  // apart; the lowest index among equals; NaN never wins unless a row is all
  // NaN, then 0): a greedy pick without the logits leaving backend memory.
  // `out` is backend memory.
  virtual void Argmax(const float* x, int rows, int n, int32_t* out) = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_COMPUTE_BACKEND_H_
