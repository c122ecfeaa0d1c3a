// CUDA and cuBLAS results as absl::Status. Internal to the CUDA backend:
// includes the CUDA headers, so only its own sources may include it.
#ifndef TANDEM_COMMON_COMPUTE_CUDA_CUDA_STATUS_H_
#define TANDEM_COMMON_COMPUTE_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace tandem::cuda {

// OK for cudaSuccess; otherwise INTERNAL (RESOURCE_EXHAUSTED for out of
// memory) naming the failed expression, the CUDA error and where it was.
absl::Status CudaStatus(cudaError_t error, const char* expr, const char* file, int line);
absl::Status CublasStatus(cublasStatus_t status, const char* expr, const char* file, int line);

}  // namespace tandem::cuda

#define TANDEM_CUDA_STATUS(expr) ::tandem::cuda::CudaStatus((expr), #expr, __FILE__, __LINE__)
#define TANDEM_CUBLAS_STATUS(expr) ::tandem::cuda::CublasStatus((expr), #expr, __FILE__, __LINE__)

#define CUDA_RETURN_IF_ERROR(expr)                                 \
  do {                                                             \
    ::absl::Status tandem_cuda_status_ = TANDEM_CUDA_STATUS(expr); \
    if (!tandem_cuda_status_.ok()) return tandem_cuda_status_;     \
  } while (false)

#define CUBLAS_RETURN_IF_ERROR(expr)                                 \
  do {                                                               \
    ::absl::Status tandem_cuda_status_ = TANDEM_CUBLAS_STATUS(expr); \
    if (!tandem_cuda_status_.ok()) return tandem_cuda_status_;       \
  } while (false)

#endif  // TANDEM_COMMON_COMPUTE_CUDA_CUDA_STATUS_H_
