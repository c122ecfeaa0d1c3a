// The bandwidth and GEMM-rate measurements of limits.h, and the vector sums
// the read-bandwidth measurement streams memory through.
#include "tools/engine_bench/limits.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <vector>

#include "common/base/logging.h"
#include "tools/engine_bench/timing.h"
#ifdef TANDEM_HAVE_CUDA
#include "common/compute/cuda/cuda_backend.h"
#endif

namespace tandem::engine_bench {

namespace {

// Per-ISA clones, but not in the sanitizer builds that cannot run their
// IFUNC resolvers (see TANDEM_NO_TARGET_CLONES in the top CMakeLists.txt).
#ifdef TANDEM_NO_TARGET_CLONES
#define TANDEM_SUM_CLONES
#else
#define TANDEM_SUM_CLONES __attribute__((target_clones("avx512f", "arch=haswell", "default")))
#endif

// Sum of n floats (n a multiple of 64) in four 16-float vector
// accumulators, so that the loop is bound by memory, not by the latency of
// one accumulator.
using Floats16 = float __attribute__((vector_size(64)));
TANDEM_SUM_CLONES float SumFloats(const float* p, size_t n) {
  Floats16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  for (size_t i = 0; i < n; i += 64) {
    Floats16 v[4];
    std::memcpy(v, p + i, sizeof(v));
    a0 += v[0];
    a1 += v[1];
    a2 += v[2];
    a3 += v[3];
  }
  const Floats16 s = (a0 + a1) + (a2 + a3);
  float total = 0.0f;
  for (int j = 0; j < 16; ++j) total += s[j];
  return total;
}

// The same sum read as four streams a quarter of the range apart, 16
// floats of each per round, as a matrix-vector product reads four weight
// rows at once (n a multiple of 256).
TANDEM_SUM_CLONES float SumFloatStreams(const float* p, size_t n) {
  const size_t quarter = n / 4;
  Floats16 a[4] = {};
  for (size_t i = 0; i < quarter; i += 16) {
    for (int s = 0; s < 4; ++s) {
      Floats16 v;
      std::memcpy(&v, p + s * quarter + i, sizeof(v));
      a[s] += v;
    }
  }
  const Floats16 s = (a[0] + a[1]) + (a[2] + a[3]);
  float total = 0.0f;
  for (int j = 0; j < 16; ++j) total += s[j];
  return total;
}

}  // namespace

// Over 2 GiB (far larger than the caches), held as the backend holds
// weights (2 MiB pages, touched before use), the best of 8 runs of each of
// two patterns (one stream per thread, and four, as a matrix-vector product
// reads rows). (The earlier measurement, a loop over a 64-float array of
// lanes on a vector in 4 KiB pages, best of 3, read 5% to 13% less in runs
// interleaved with this one.) A shared machine's figure moves with its
// neighbours' load (33 to 60 GB/s within minutes on the 2-vCPU EPYC
// machines here), so a decode figure is set against the one measured in the
// same run.
double MeasureReadBandwidth(Backend& backend) {
  const size_t n = size_t{1} << 29;  // 2 GiB of floats
  auto buffer = backend.Allocate(n * sizeof(float));
  CHECK_OK(buffer.status());
  float* buf = (*buffer)->floats();
  std::fill(buf, buf + n, 1.0f);
  double best = 0.0;
  for (int rep = 0; rep < 16; ++rep) {
    float total = 0.0f;
    const auto t0 = Clock::now();
#pragma omp parallel reduction(+ : total)
    {
      const size_t per = n / omp_get_num_threads() / 256 * 256;
      const size_t begin = per * omp_get_thread_num();
      total += rep % 2 == 0 ? SumFloats(buf + begin, per) : SumFloatStreams(buf + begin, per);
    }
    const double bw = n * sizeof(float) / Seconds(Clock::now() - t0);
    // Ones sum exactly: at most 2^29 over 64 f32 lanes is 2^23 a lane.
    if (total != float(n)) std::cerr << "bandwidth check summed " << total << "\n";
    best = std::max(best, bw);
  }
  return best;
}

// 512 x 2048 x 768 on CPUs; a GPU needs far larger products to fill. Each
// timing covers `products` products, so that the wait for the last one is
// spread over them.
double MeasureGemmFlops(Backend& backend, int m, int n, int k, DType wtype, int products) {
  auto x = backend.Allocate(size_t{4} * m * k);
  auto w = backend.Allocate(DTypeSize(wtype) * n * k);
  auto out = backend.Allocate(size_t{4} * m * n);
  CHECK_OK(x.status());
  CHECK_OK(w.status());
  CHECK_OK(out.status());
  std::vector<float> host(static_cast<size_t>(std::max(m, n)) * k, 0.25f);
  backend.CopyToDevice(host.data(), (*x)->data(), size_t{4} * m * k);
  // 0.25 in every type: f32, f16 and bf16 bit patterns.
  const uint16_t quarter = wtype == DType::kF16 ? 0x3400 : 0x3e80;
  const std::vector<uint16_t> host16(wtype == DType::kF32 ? 0 : size_t(n) * k, quarter);
  backend.CopyToDevice(wtype == DType::kF32 ? static_cast<const void*>(host.data()) : host16.data(),
                       (*w)->data(), DTypeSize(wtype) * n * k);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {  // the first one warms up
    const auto t0 = Clock::now();
    for (int i = 0; i < products; ++i) {
      backend.MatMul((*x)->floats(), MatrixRef{(*w)->data(), wtype}, (*out)->floats(), m, n, k,
                     false);
    }
    backend.CopyToHost((*out)->floats(), host.data(), sizeof(float));  // waits for the products
    if (rep > 0) best = std::min(best, Seconds(Clock::now() - t0));
  }
  return 2.0 * m * n * k * products / best;
}

// How close decode's matrix products come to the memory bandwidth.
double MeasureSkinnyBandwidth(Backend& backend, int m, int n, int k, DType wtype) {
  return MeasureGemmFlops(backend, m, n, k, wtype, /*products=*/20) / (2.0 * m * n * k) *
         (double(DTypeSize(wtype)) * n * k);
}

double MeasureCublasSkinnyBandwidth(Backend& backend, int m, int n, int k, DType wtype) {
#ifdef TANDEM_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&backend)) {
    const int rows = cuda->skinny_max_rows();
    cuda->set_skinny_max_rows(0);
    const double rate = MeasureSkinnyBandwidth(backend, m, n, k, wtype);
    cuda->set_skinny_max_rows(rows);
    return rate;
  }
#else
  (void)backend, (void)m, (void)n, (void)k, (void)wtype;
#endif
  return 0.0;
}

// Without MatMul's rounding of the activations.
double MeasureCublasRate(Backend& backend, DType dtype, int m, int n, int k) {
#ifdef TANDEM_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&backend)) {
    auto rate = cuda->MeasureGemmRate(dtype, m, n, k);
    CHECK_OK(rate.status());
    return *rate;
  }
#else
  (void)backend, (void)dtype, (void)m, (void)n, (void)k;
#endif
  return 0.0;
}

}  // namespace tandem::engine_bench
