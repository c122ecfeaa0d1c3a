#include "common/compute/backend_choice.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/compute/cpu/cpu_backend.h"
#ifdef TANDEM_HAVE_CUDA
#include "common/compute/cuda/cuda_backend.h"
#endif

namespace tandem {

absl::StatusOr<BackendChoice> ChooseBackend(const BackendOptions& options) {
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device is ", options.device, "; give a GPU's index (0 = the first)"));
  }
  BackendChoice choice;
  if (options.name == "cpu") {
    if (options.device != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device ", options.device,
                       " picks a GPU of --backend cuda; the cpu backend has none (drop --device)"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> cpu,
                     CpuBackend::Create(CpuBackendOptions{options.threads}));
    choice.description = cpu->Describe();
    choice.backend = std::move(cpu);
    return choice;
  }
  if (options.name == "cuda") {
#ifdef TANDEM_HAVE_CUDA
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> cuda,
                     CudaBackend::Create(CudaBackendOptions{.device = options.device}));
    choice.description = cuda->Describe();
    if (options.measure_bandwidth) {
      ASSIGN_OR_RETURN(choice.device_bandwidth, cuda->MeasureCopyBandwidth(size_t{1} << 30));
    }
    choice.backend = std::move(cuda);
    return choice;
#else
    return absl::FailedPreconditionError(
        "--backend cuda: this build has no CUDA backend (configure with -DTANDEM_WITH_CUDA=ON "
        "where nvcc is installed), or use --backend cpu");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend is '", std::string(options.name), "'; use cpu or cuda"));
}

}  // namespace tandem
