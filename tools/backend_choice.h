// The compute backend a tool's --backend flag names: "cpu" or "cuda".
#ifndef TANDEM_TOOLS_BACKEND_CHOICE_H_
#define TANDEM_TOOLS_BACKEND_CHOICE_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/compute/backend.h"

namespace tandem {

struct BackendChoice {
  std::unique_ptr<Backend> backend;
  std::string description;  // e.g. the CPU's thread count, or the GPU's name
  // Measured device memory bandwidth (bytes/s) for the cuda backend; 0 for
  // cpu, whose tools measure it themselves.
  double device_bandwidth = 0.0;
};

// `threads` applies to the CPU backend (0 = every core). With
// `measure_bandwidth`, the CUDA backend's device bandwidth is measured over
// 1 GiB copies. A build without CUDA answers FAILED_PRECONDITION for
// "cuda"; another name is INVALID_ARGUMENT.
absl::StatusOr<BackendChoice> ChooseBackend(std::string_view name, int threads,
                                            bool measure_bandwidth = false);

}  // namespace tandem

#endif  // TANDEM_TOOLS_BACKEND_CHOICE_H_
