#include "common/compute/cpu/blas_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace tandem::cpu {
namespace {

const char* CoretypeForThisCpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;  // let OpenBLAS decide
}

absl::StatusOr<BlasLibrary> Load() {
  if (const char* core = CoretypeForThisCpu()) setenv("OPENBLAS_CORETYPE", core, /*replace=*/0);
  BlasLibrary lib;
  lib.path = TANDEM_OPENBLAS_LIBRARY;
  void* handle = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load OpenBLAS from ", lib.path, ": ", dlerror(),
                     "; install libopenblas0-openmp (scripts/install-deps.sh does)"));
  }
  bool missing = false;
  auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    missing |= fn == nullptr;
  };
  get(lib.sgemm, "cblas_sgemm");
  get(lib.sgemv, "cblas_sgemv");
  get(lib.set_num_threads, "openblas_set_num_threads");
  get(lib.get_config, "openblas_get_config");
  get(lib.get_corename, "openblas_get_corename");
  get(lib.get_parallel, "openblas_get_parallel");
  if (missing) {
    return absl::FailedPreconditionError(
        absl::StrCat(lib.path, " lacks the CBLAS/OpenBLAS functions the CPU backend calls"));
  }
  // The handle stays open for the life of the process.
  return lib;
}

}  // namespace

absl::StatusOr<const BlasLibrary*> LoadBlasLibrary() {
  static const absl::StatusOr<BlasLibrary>* const loaded = new absl::StatusOr<BlasLibrary>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace tandem::cpu
