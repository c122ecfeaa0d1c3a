// Counter-based random numbers for sampling: Philox4x32-10 (Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3", SC 2011) from the Random123
// headers. The n-th number of a seed's stream is a pure function of (seed,
// n), so a sampler jumps to any point of its stream at no cost, and the CPU
// sampler and the CUDA one draw the same numbers for the same request.
// Compiled by nvcc the functions are __host__ __device__.
#ifndef TANDEM_COMMON_BASE_PHILOX_H_
#define TANDEM_COMMON_BASE_PHILOX_H_

#include <cstdint>

#include "common/base/host_device.h"
#if defined(__CUDACC__) && !defined(R123_CUDA_DEVICE)
#define R123_CUDA_DEVICE __host__ __device__
#endif
#include <Random123/philox.h>

namespace tandem {

// The four 32-bit words of Philox4x32-10 for counter `index` (low word first,
// the upper two words zero) under key `seed` (low word first).
TANDEM_HOST_DEVICE inline r123::Philox4x32::ctr_type PhiloxBlock(uint64_t seed, uint64_t index) {
  const r123::Philox4x32::ctr_type counter = {
      {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u}};
  const r123::Philox4x32::key_type key = {
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
  return r123::Philox4x32()(counter, key);
}

// Number `index` of the stream of `seed`: uniform in [0, 1) with 53 random
// bits (the top 53 of words 1:0), exactly representable in a double.
TANDEM_HOST_DEVICE inline double PhiloxUniform(uint64_t seed, uint64_t index) {
  const r123::Philox4x32::ctr_type r = PhiloxBlock(seed, index);
  const uint64_t bits = (static_cast<uint64_t>(r[1]) << 32) | r[0];
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_PHILOX_H_
