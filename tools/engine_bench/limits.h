// The limits the engine bench sets its figures against, measured on the
// backend in the same run: the read bandwidth (the batch-1 decode ceiling),
// the GEMM rate (the prefill ceiling), and on a GPU the weight bandwidth of
// skinny products and cuBLAS's rate in 16-bit types.
#ifndef TANDEM_TOOLS_ENGINE_BENCH_LIMITS_H_
#define TANDEM_TOOLS_ENGINE_BENCH_LIMITS_H_

#include <utility>
#include <vector>

#include "common/base/dtype.h"
#include "common/compute/backend.h"

namespace tandem::engine_bench {

// The limits of one run, as the report sets the figures against them.
struct MeasuredLimits {
  // Read bandwidth on a CPU, the device's copy bandwidth on a GPU; bytes/s.
  double bandwidth = 0;
  // The fp32 GEMM rate, flops/s.
  double gemm_flops = 0;
  // cuBLAS's rate in each 16-bit weight type measured (GPU runs only).
  std::vector<std::pair<DType, double>> gemm16;
};

// Sustained read bandwidth with all threads over 2 GiB, in bytes per
// second: the ceiling for batch-1 decode, which reads every weight once per
// token.
double MeasureReadBandwidth(Backend& backend);

// Sustained matrix-product rate of the backend's MatMul on a product of
// m x n x k with `wtype` weights, operands in backend memory, in flops per
// second: the ceiling for prefill, which is mostly such products. Each
// timing covers `products` products in a row.
double MeasureGemmFlops(Backend& backend, int m, int n, int k, DType wtype = DType::kF32,
                        int products = 1);

// Weight bytes per second a skinny product of m rows streams through
// (n x k weights, read once).
double MeasureSkinnyBandwidth(Backend& backend, int m, int n, int k, DType wtype);

// The same through cuBLAS alone (the CUDA backend's weight-streaming kernel
// turned off for the measurement); 0 for another backend.
double MeasureCublasSkinnyBandwidth(Backend& backend, int m, int n, int k, DType wtype);

// cuBLAS's rate for an m x n x k product of `dtype` operands with f32
// accumulation, as the CUDA backend issues it; 0 for another backend or a
// build without CUDA.
double MeasureCublasRate(Backend& backend, DType dtype, int m, int n, int k);

}  // namespace tandem::engine_bench

#endif  // TANDEM_TOOLS_ENGINE_BENCH_LIMITS_H_
