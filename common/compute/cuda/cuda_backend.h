// The CUDA backend: cuBLAS for matrix products, our own kernels
// (kernels.cu, attention.cu) for the rest, everything on the device's legacy
// default stream so that the synchronous copies order with the kernels.
//
// Weights are f32, bf16 or f16, and so is the KV cache, in any pairing.
// f32 products are cuBLAS's pedantic fp32 (no TF32: they match the CPU
// backend to fp32 rounding). A product with 16-bit weights rounds the f32
// activations to the weights' type on the device and runs on the tensor
// cores with f32 accumulation and an f32 result (or, for a few rows, through
// a weight-streaming kernel with f32 sums); 16-bit KV is rounded as it
// is written and widened as attention reads it, except that prefill chunks
// over a 16-bit cache run on the tensor cores with the queries and
// probabilities rounded to the cache's type (prefill_mma.h).
//
// Backend operations return nothing, so the first CUDA or cuBLAS error is
// kept (status()) and every later operation is skipped until the backend is
// destroyed: a caller checks status() after a step.
//
// This header includes no CUDA header; users link tandem_compute_cuda only.
#ifndef TANDEM_COMMON_COMPUTE_CUDA_CUDA_BACKEND_H_
#define TANDEM_COMMON_COMPUTE_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compute/backend.h"

struct cublasContext;
struct CUevent_st;

namespace tandem {
class CudaKvCopier;
}

namespace tandem {

struct CudaBackendOptions {
  int device = 0;
};

class CudaBackend final : public Backend {
 public:
  // FAILED_PRECONDITION "no CUDA device: ..." when the runtime finds no
  // device (no driver, no GPU); INVALID_ARGUMENT for a device index out of
  // range; INTERNAL for other CUDA/cuBLAS failures.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(CudaBackendOptions options = {});
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  int device() const { return device_; }
  // e.g. "NVIDIA H100 80GB HBM3 (sm_90, 79 GiB), device 0".
  const std::string& Describe() const { return description_; }

  // The first error of any operation so far; OK when none failed.
  absl::Status status() const override { return status_; }
  std::optional<DeviceMemory> QueryDeviceMemory() override;
  KvCopier* kv_copier() override;
  // Waits for queued work and returns status().
  absl::Status Synchronize();
  // Device memory bandwidth in bytes/s: best of several device-to-device
  // copies between two `bytes`-byte buffers, counting bytes read plus
  // bytes written. The ceiling for memory-bound steps such as decode.
  absl::StatusOr<double> MeasureCopyBandwidth(size_t bytes);
  // Matrix-product rate in flop/s: best of several m x n x k products with
  // operands of `dtype` (random values) and an f32 result, issued as
  // MatMul issues them (f32: pedantic fp32; f16/bf16: tensor cores, f32
  // accumulation), without MatMul's rounding of the activations. The
  // ceiling for compute-bound steps such as prefill.
  absl::StatusOr<double> MeasureGemmRate(DType dtype, int m, int n, int k);

  // Products of 16-bit weights with 1 to `rows` rows (decode batches; at
  // most cuda::kMaxSkinnyRows) stream the weights through the backend's own
  // kernel (skinny_product.cu) instead of cuBLAS; 0 sends every product to
  // cuBLAS. Benchmarks and tests compare the two this way.
  void set_skinny_max_rows(int rows);
  int skinny_max_rows() const { return skinny_max_rows_; }
  // Whether decode rows take the paged-block attention kernel where it
  // applies (cuda::BlockDecodeApplies; on by default) or the tiled kernel
  // everywhere: for benchmarks that compare the two.
  void set_block_decode(bool on) { block_decode_ = on; }

  // Op profile, for benchmarks: from StartOpProfile() on, every operation
  // records a device event as it is issued. TakeOpProfile() records a last
  // one, waits for the device, turns profiling off and returns, per
  // operation name in first-issued order, the device seconds from each
  // operation's event to the next one's (the operation, plus any time the
  // device then idled waiting for the host to issue more).
  void StartOpProfile();
  absl::StatusOr<std::vector<std::pair<std::string, double>>> TakeOpProfile();

  // For tests: the operation after the next `after_operations` ones (every
  // call that reaches the device counts, copies and Synchronize() too)
  // launches a kernel with more threads per block than a device allows
  // instead of its work, so that CUDA reports the failed launch and
  // status() keeps it (INTERNAL, "cuda::LaunchFaultyKernel() failed:
  // cudaError..."), as it would a real failure.
  void InjectFaultForTesting(int after_operations = 0);

  using Backend::Embed;
  using Backend::MatMul;
  // f32, bf16 and f16 weights, each with an f32, bf16 or f16 KV cache.
  absl::Status Supports(DType weights, DType kv) const override;
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override;
  void CopyToDevice(const void* host, void* device, size_t bytes) override;
  void CopyToHost(const void* device, void* host, size_t bytes) override;
  void MatMul(const float* x, MatrixRef w, float* out, int m, int n, int k,
              bool accumulate) override;
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
  // Not computed yet (SupportsLatentAttention says so): a call fails the
  // backend with UNIMPLEMENTED.
  void LatentAttention(const float* q, int q_stride, std::span<const AttentionRow> rows, int layer,
                       const KvLayout& layout, const void* cache, const LatentShape& shape,
                       const float* kv_b, float* out) override;
  void Argmax(const float* x, int rows, int n, int32_t* out) override;

 private:
  // Device memory reused across calls, grown on demand.
  struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
  };

  // Where UploadRows put a step's rows on the device, and how attention
  // divides them: runs of kMinPrefillRun or more rows of one sequence at
  // consecutive positions go to the tiled prefill kernel as tiles
  // (longest context first), the other rows to the per-row kernel.
  struct DeviceRows {
    const int32_t* meta = nullptr;   // [position, block list offset] per row, block lists
    const int32_t* tiles = nullptr;  // [first row, rows] per tile
    int n_tiles = 0;
    const int32_t* decode_rows = nullptr;  // row indices
    int n_decode = 0;
    int decode_max_context = 0;
  };

  CudaBackend(int device, int sm_count, cublasContext* cublas, cublasContext* cublas16,
              std::string description);
  // False (and the op is skipped) once an error is kept; makes the device
  // current for the calling thread, and marks the operation `op` (when
  // named) while profiling.
  bool Begin(const char* op = nullptr);
  // Records the next profiling event on the legacy stream, for `op`.
  void Mark(const char* op);
  void Keep(absl::Status status);
  // `scratch` holding at least `bytes` (after the queued work that may use
  // its old memory); nullptr on error (kept).
  void* Grow(Scratch& scratch, size_t bytes);
  // Host integers kept on the device, and what was last copied there.
  struct Upload {
    Scratch scratch;
    std::vector<int32_t> last;
  };
  // Copies `ints` into `upload`'s device memory, unless they equal what is
  // already there; nullptr on error (kept).
  const int32_t* UploadInts(Upload& upload, std::span<const int32_t> ints);
  // Packs rows as [position, offset into blocks] pairs followed by the
  // block lists (rows sharing a list share one copy), the prefill tiles and
  // the per-row kernel's rows, and uploads them; false on error (kept).
  bool UploadRows(std::span<const AttentionRow> rows, DeviceRows& out);
  // out[m, n] = x[m, k] w[n, k]^T (+ out when beta is 1), x in w's type.
  absl::Status Product(const void* x, MatrixRef w, float* out, int m, int n, int k, float beta);

  int device_;
  int sm_count_;
  cublasContext* cublas_;    // pedantic fp32 math
  cublasContext* cublas16_;  // default math: tensor cores for 16-bit operands
  std::string description_;
  int skinny_max_rows_;
  bool block_decode_ = true;
  bool profiling_ = false;
  std::vector<const char*> marks_;   // operation of each recorded event
  std::vector<CUevent_st*> events_;  // reused across profiles
  int fault_countdown_ = -1;         // InjectFaultForTesting; -1: none planted
  absl::Status status_;
  Upload ids_upload_;          // token ids
  Upload positions_upload_;    // RoPE positions
  Upload rows_upload_;         // packed attention rows
  Upload expert_rows_upload_;  // the rows of a GatherRows or ScatterAddRows
  Upload weights_upload_;      // a ScatterAddRows's weights, as their bits
  std::vector<int32_t> weight_bits_;
  Scratch attention_scratch_;  // partial results of split attention
  Scratch narrow_scratch_;     // activations rounded to 16 bits for a product
  std::vector<int32_t> host_ints_;
  std::unique_ptr<CudaKvCopier> copier_;  // Made on first use.
};

}  // namespace tandem

#endif  // TANDEM_COMMON_COMPUTE_CUDA_CUDA_BACKEND_H_
