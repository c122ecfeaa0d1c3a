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
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/compute/backend.h"

struct cublasContext;

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
  absl::Status status() const { return status_; }
  // Waits for queued work and returns status().
  absl::Status Synchronize();

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override;
  void CopyToDevice(const void* host, void* device, size_t bytes) override;
  void CopyToHost(const void* device, void* host, size_t bytes) override;
  void MatMul(const float* x, const float* w, float* out, int m, int n, int k,
              bool accumulate) override;
  void Embed(const float* table, std::span<const int32_t> ids, int dim, float* out) override;
  void RmsNorm(const float* x, const float* weight, float* out, int rows, int dim,
               float eps) override;
  void Rope(float* q, int q_stride, float* k, int k_stride, std::span<const int32_t> positions,
            const AttentionShape& shape, const float* cos_sin) override;
  void SwiGlu(const float* gate_up, float* out, int rows, int hidden) override;
  void WriteKv(const float* k, int k_stride, const float* v, int v_stride,
               std::span<const AttentionRow> rows, int layer, const KvLayout& layout,
               float* cache) override;
  void PagedAttention(const float* q, int q_stride, std::span<const AttentionRow> rows, int layer,
                      const KvLayout& layout, const float* cache, const AttentionShape& shape,
                      float* out) override;

 private:
  CudaBackend(int device, cublasContext* cublas, std::string description);
  // False (and the op is skipped) once an error is kept; makes the device
  // current for the calling thread.
  bool Begin();
  void Keep(absl::Status status);
  // Copies `ints` into device scratch; nullptr on error (kept).
  const int32_t* UploadInts(std::span<const int32_t> ints);
  // Packs rows as [position, offset into blocks] pairs followed by the
  // block lists (rows sharing a list share one copy) and uploads them.
  const int32_t* UploadRows(std::span<const AttentionRow> rows);

  int device_;
  cublasContext* cublas_;
  std::string description_;
  absl::Status status_;
  void* scratch_ = nullptr;  // device memory for per-call host spans
  size_t scratch_bytes_ = 0;
  std::vector<int32_t> host_ints_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_COMPUTE_CUDA_CUDA_BACKEND_H_
