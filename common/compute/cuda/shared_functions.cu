// The device side of functions the CPU and the GPU share bit for bit
// (common/base/philox.h, common/base/fp8.h), launched over ranges so that a
// device run checks them against the host: the sampler's random numbers and
// the E4M3 encoding (ours beside the device's own conversion instruction).
#include <cuda_fp8.h>

#include <cstdint>

#include "common/base/fp8.h"
#include "common/base/philox.h"
#include "common/compute/cuda/kernels.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void PhiloxUniformKernel(uint64_t seed, uint64_t start, int n, double* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = PhiloxUniform(seed, start + static_cast<uint64_t>(i));
}

__global__ void Fp8EncodeKernel(uint32_t first_bits, int n, uint8_t* ours, uint8_t* device) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = __uint_as_float(first_bits + static_cast<uint32_t>(i));
  ours[i] = FloatToFp8E4M3(x);
  device[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

unsigned Blocks(int n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t LaunchPhiloxUniform(uint64_t seed, uint64_t start, int n, double* out) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  PhiloxUniformKernel<<<Blocks(n), kThreads>>>(seed, start, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchFp8E4M3Encode(uint32_t first_bits, int n, uint8_t* ours, uint8_t* device) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  Fp8EncodeKernel<<<Blocks(n), kThreads>>>(first_bits, n, ours, device);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
