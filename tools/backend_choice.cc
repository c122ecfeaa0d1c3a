#include "tools/backend_choice.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/compute/cpu/cpu_backend.h"
#ifdef TANDEM_HAVE_CUDA
#include "common/compute/cuda/cuda_backend.h"
#endif

namespace tandem {

absl::StatusOr<BackendChoice> ChooseBackend(std::string_view name, int threads,
                                            bool measure_bandwidth) {
  BackendChoice choice;
  if (name == "cpu") {
    ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> cpu,
                     CpuBackend::Create(CpuBackendOptions{threads}));
    choice.description = cpu->Describe();
    choice.backend = std::move(cpu);
    return choice;
  }
  if (name == "cuda") {
#ifdef TANDEM_HAVE_CUDA
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> cuda, CudaBackend::Create());
    choice.description = cuda->Describe();
    if (measure_bandwidth) {
      ASSIGN_OR_RETURN(choice.device_bandwidth, cuda->MeasureCopyBandwidth(size_t{1} << 30));
    }
    choice.backend = std::move(cuda);
    return choice;
#else
    (void)measure_bandwidth;
    return absl::FailedPreconditionError(
        "--backend cuda: this build has no CUDA backend (configure with -DTANDEM_WITH_CUDA=ON "
        "where nvcc is installed), or use --backend cpu");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend is '", std::string(name), "'; use cpu or cuda"));
}

}  // namespace tandem
