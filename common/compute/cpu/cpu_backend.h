// The CPU backend: OpenBLAS (OpenMP flavour) for matrix products, our own
// vectorised kernels for the rest, all cores through OpenMP. Kernels are
// compiled for AVX-512, AVX2+FMA and baseline x86-64 and picked at load time
// by the CPU's features, so one binary runs everywhere.
//
// Thread-compatible, as Backend is: one thread (an engine's) issues its
// operations; its kernels use the OpenMP pool inside each call. Buffers it
// allocates are host memory owned by the DeviceBuffer handed out (freed
// when that is destroyed). Create fails with INVALID_ARGUMENT for a
// negative thread count and FAILED_PRECONDITION when OpenBLAS cannot be
// loaded; an allocation the host cannot satisfy is RESOURCE_EXHAUSTED.
// Work is synchronous: an operation has finished when it returns.
#ifndef TANDEM_COMMON_COMPUTE_CPU_CPU_BACKEND_H_
#define TANDEM_COMMON_COMPUTE_CPU_CPU_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "common/compute/backend.h"
#include "common/compute/cpu/quant_matmul.h"

namespace tandem {

// The most threads a CPU backend takes: OpenMP and OpenBLAS start every one
// of them, and tens of thousands exhaust the process.
inline constexpr int kMaxCpuThreads = 1024;

struct CpuBackendOptions {
  // Threads for BLAS and kernels, at most kMaxCpuThreads; 0 uses every core
  // the process may run on.
  int num_threads = 0;
  // Touch every page of a large buffer (weights, the KV pool) when it is
  // allocated, so that no step pays first-touch faults. Off for a simulated
  // worker, whose pool is mostly never touched.
  bool prefault = true;
};

namespace cpu {
struct BlasLibrary;
}

class CpuBackend final : public Backend {
 public:
  // FAILED_PRECONDITION when OpenBLAS cannot be loaded.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(CpuBackendOptions options = {});

  std::string_view name() const override { return "cpu"; }
  int num_threads() const { return num_threads_; }
  // e.g. "openblas 0.3.21 (openmp, SkylakeX), kernels avx512f, 2 threads".
  std::string Describe() const;

  using Backend::Embed;
  using Backend::MatMul;
  absl::Status Supports(DType weights, DType kv) const override;
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override;
  void CopyToDevice(const void* host, void* device, size_t bytes) override;
  void CopyToHost(const void* device, void* host, size_t bytes) override;
  void MatMul(const float* x, MatrixRef w, float* out, int m, int n, int k,
              bool accumulate) override;
  void MatMulColumns(const float* x, MatrixRef w, float* out, int ldo, int m, int n, int k,
                     bool accumulate) override;
  // Q8_0 matrices of whole groups of 16 rows become kQ8_0R16
  // (cpu/quant_repack.h) where the int8 products run.
  MatrixRef PrepareWeights(MatrixRef w, int64_t rows, int64_t k) override;
  void Embed(MatrixRef table, std::span<const int32_t> ids, int dim, float* out) override;
  void AddBias(float* x, int stride, const float* bias, int rows, int n) override;
  void RmsNorm(const float* x, const float* weight, float* out, int rows, int dim,
               float eps) override;
  void RmsNormHeads(float* x, int stride, const float* weight, int rows, int heads, int head_dim,
                    float eps) override;
  void Rope(float* q, int q_stride, float* k, int k_stride, std::span<const int32_t> positions,
            const AttentionShape& shape, const float* cos_sin) override;
  void GatherRows(const float* src, std::span<const int32_t> rows, int n, float* dst) override;
  void ScatterAddRows(const float* src, std::span<const int32_t> rows,
                      std::span<const float> weights, int n, float* dst) override;
  void SwiGlu(const float* gate_up, float* out, int rows, int hidden) override;
  void WriteKv(const float* k, int k_stride, const float* v, int v_stride,
               std::span<const AttentionRow> rows, int layer, const KvLayout& layout,
               void* cache) override;
  void PagedAttention(const float* q, int q_stride, std::span<const AttentionRow> rows, int layer,
                      const KvLayout& layout, const void* cache, const AttentionShape& shape,
                      float* out) override;
  absl::Status SupportsLatentAttention() const override;
  void LatentAttention(const float* q, int q_stride, std::span<const AttentionRow> rows, int layer,
                       const KvLayout& layout, const void* cache, const LatentShape& shape,
                       const float* kv_b, float* out) override;
  void Argmax(const float* x, int rows, int n, int32_t* out) override;

 private:
  CpuBackend(const cpu::BlasLibrary* blas, int num_threads);
  // Attention of rows (one sequence, consecutive positions) for the query
  // heads of one KV head, through matrix products; scratch grows as needed.
  void AttendTile(const float* q, int q_stride, std::span<const AttentionRow> rows, int kv_head,
                  int group, int head_dim, int layer, const KvLayout& layout, const void* cache,
                  std::vector<float>& scratch, float* out, int out_stride) const;
  // Latent attention of one run of rows (one sequence, consecutive
  // positions) for heads [h0, h1) (cpu/latent_attention.cc): expanded, from
  // the queries; absorbed, from the absorbed queries qp [rows][heads][kv_rank
  // + rope_dim] into the weighted latents o_lat [rows][heads][kv_rank].
  void LatentExpanded(const float* q, int q_stride, std::span<const AttentionRow> rows, int h0,
                      int h1, int layer, const KvLayout& layout, const void* cache,
                      const LatentShape& shape, const float* kv_b, std::vector<float>& scratch,
                      float* out) const;
  void LatentAbsorbed(const float* qp, std::span<const AttentionRow> rows, int h0, int h1,
                      int layer, const KvLayout& layout, const void* cache,
                      const LatentShape& shape, std::vector<float>& scratch, float* o_lat) const;
  // f32 product of x with 16-bit or quantized weights for many rows:
  // panels of w are widened to f32 into scratch and multiplied by BLAS, so
  // the f32 copy of w that exists at any time is one panel. out's rows are
  // `ldo` apart.
  void MatMulWidened(const float* x, MatrixRef w, float* out, int ldo, int m, int n, int k,
                     bool accumulate);
  // A quantized w: int8 products for few rows; for more, panels widened to
  // bf16 for the AVX512-BF16 product where the CPU has it (twice the
  // multiply-adds per instruction of BLAS's f32), else to f32 for BLAS.
  void MatMulQuantized(const float* x, MatrixRef w, float* out, int ldo, int m, int n, int k,
                       bool accumulate);
  void MatMulQuantizedBf16(const float* x, MatrixRef w, float* out, int ldo, int m, int n, int k,
                           bool accumulate);
  // x[m, k] rounded to bf16 into x_bf16_.
  const uint16_t* RoundToBf16(const float* x, int m, int k);
  // out[m, n] (rows `ldo` apart) (+)= xb w^T with bf16 w[n, k], over the
  // thread team. Requires dot_bf16_.
  void MatMulBf16(const uint16_t* xb, const void* w, float* out, int ldo, int m, int n, int k,
                  bool accumulate);

  const cpu::BlasLibrary* blas_;
  int num_threads_;
  bool prefault_ = true;
  bool small_matmul_;                  // few-row products bypass BLAS (cpu/small_matmul.h)
  bool small_matmul16_;                // ... also with 16-bit weights
  bool dot_bf16_;                      // ... with bf16 weights through AVX512-BF16
  bool quant_matmul_;                  // ... with quantized weights through AVX512-VNNI
  std::vector<float> panel_;           // MatMulWidened scratch
  std::vector<uint16_t> panel_bf16_;   // MatMulQuantizedBf16 scratch
  std::vector<uint16_t> x_bf16_;       // inputs rounded to bf16 for dot_bf16_
  cpu::QuantizedRows quantized_rows_;  // inputs rounded to int8 for quant_matmul_
  // LatentAttention scratch: absorbed queries, weighted latents, and the
  // absorbed rows' no-rope queries (then their outputs).
  std::vector<float> latent_q_, latent_o_, latent_in_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_COMPUTE_CPU_CPU_BACKEND_H_
