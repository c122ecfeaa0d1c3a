// OpenBLAS, loaded at run time by the CPU backend.
//
// Why not link it: Debian builds OpenBLAS with DYNAMIC_ARCH, which picks its
// kernels by CPU model number in a constructor that runs when the library is
// loaded. Version 0.3.21 does not know recent Xeons (Sapphire and Emerald
// Rapids, models 143 and 207) and falls back to its "Prescott" SSE3 kernels,
// three to four times slower than the AVX-512 ones these CPUs run. Loading
// the library ourselves lets us set OPENBLAS_CORETYPE from the CPU's feature
// flags first (a value the user set wins). The OpenMP flavour is loaded so
// that BLAS and our kernels share libgomp's thread pool.
#ifndef TANDEM_COMMON_COMPUTE_CPU_BLAS_LIBRARY_H_
#define TANDEM_COMMON_COMPUTE_CPU_BLAS_LIBRARY_H_

#include <cblas.h>

#include <string>

#include "absl/status/statusor.h"

namespace tandem::cpu {

struct BlasLibrary {
  decltype(&cblas_sgemm) sgemm;
  decltype(&cblas_sgemv) sgemv;
  decltype(&openblas_set_num_threads) set_num_threads;
  decltype(&openblas_get_config) get_config;
  decltype(&openblas_get_corename) get_corename;
  decltype(&openblas_get_parallel) get_parallel;
  std::string path;
};

// Loads the library once per process; later calls return the same object.
// FAILED_PRECONDITION saying what to install when it is missing.
absl::StatusOr<const BlasLibrary*> LoadBlasLibrary();

}  // namespace tandem::cpu

#endif  // TANDEM_COMMON_COMPUTE_CPU_BLAS_LIBRARY_H_
