#include "common/compute/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace tandem::cuda {

absl::Status CudaStatus(cudaError_t error, const char* expr, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(expr, " failed: ", cudaGetErrorName(error), " (",
                                           cudaGetErrorString(error), ") at ", file, ":", line);
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status CublasStatus(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(expr, " failed: ", cublasGetStatusName(status), " (",
                                           cublasGetStatusString(status), ") at ", file, ":", line);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace tandem::cuda
