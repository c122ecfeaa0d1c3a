// The compute backend a tool's or worker's --backend flag names: "cpu" or
// "cuda" (with --device and --threads).
#ifndef TANDEM_COMMON_COMPUTE_BACKEND_CHOICE_H_
#define TANDEM_COMMON_COMPUTE_BACKEND_CHOICE_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"

namespace tandem {

struct BackendOptions {
  // "cpu" or "cuda".
  std::string_view name = "cpu";
  // Threads of the CPU backend; 0 = every core.
  int threads = 0;
  // The GPU the CUDA backend computes on; must be 0 for the CPU backend.
  int device = 0;
  // Measure the CUDA backend's device bandwidth over 1 GiB copies.
  bool measure_bandwidth = false;
};

struct BackendChoice {
  std::unique_ptr<Backend> backend;
  std::string description;  // e.g. the CPU's thread count, or the GPU's name
  // Measured device memory bandwidth (bytes/s) for the cuda backend; 0 for
  // cpu, whose tools measure it themselves.
  double device_bandwidth = 0.0;
};

// A build without CUDA answers FAILED_PRECONDITION for "cuda"; another
// name, a negative device or a device other than 0 for "cpu" is
// INVALID_ARGUMENT; CudaBackend::Create's errors (no GPU, a device index out
// of range) pass through.
absl::StatusOr<BackendChoice> ChooseBackend(const BackendOptions& options);

}  // namespace tandem

#endif  // TANDEM_COMMON_COMPUTE_BACKEND_CHOICE_H_
