// The CUDA backend, fp32: cuBLAS for matrix products, our own kernels
// (kernels.cu) for the rest, everything on the device's legacy default
// stream so that the synchronous copies order with the kernels.
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

  using Backend::Embed;
  using Backend::MatMul;
  // f32 weights and KV only, for now.
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
  void Rope(float* q, int q_stride, float* k, int k_stride, std::span<const int32_t> positions,
            const AttentionShape& shape, const float* cos_sin) override;
  void SwiGlu(const float* gate_up, float* out, int rows, int hidden) override;
  void WriteKv(const float* k, int k_stride, const float* v, int v_stride,
               std::span<const AttentionRow> rows, int layer, const KvLayout& layout,
               void* cache) override;
  void PagedAttention(const float* q, int q_stride, std::span<const AttentionRow> rows, int layer,
                      const KvLayout& layout, const void* cache, const AttentionShape& shape,
                      float* out) override;

 private:
  // Device memory reused across calls, grown on demand.
  struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
  };

  CudaBackend(int device, int sm_count, cublasContext* cublas, std::string description);
  // False (and the op is skipped) once an error is kept; makes the device
  // current for the calling thread.
  bool Begin();
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
  // block lists (rows sharing a list share one copy) and uploads them.
  const int32_t* UploadRows(std::span<const AttentionRow> rows);

  int device_;
  int sm_count_;
  cublasContext* cublas_;
  std::string description_;
  absl::Status status_;
  Upload ids_upload_;          // token ids
  Upload positions_upload_;    // RoPE positions
  Upload rows_upload_;         // packed attention rows
  Scratch attention_scratch_;  // partial results of split attention
  std::vector<int32_t> host_ints_;
  std::unique_ptr<CudaKvCopier> copier_;  // Made on first use.
};

}  // namespace tandem

#endif  // TANDEM_COMMON_COMPUTE_CUDA_CUDA_BACKEND_H_
