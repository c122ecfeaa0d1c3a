// What the CPU and the GPU share bit for bit, checked on the device: the
// sampler's Philox numbers, and the E4M3 encoding beside the device's own
// conversion instruction over every float. Skips without a device.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/base/fp8.h"
#include "common/base/philox.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/compute/cuda/kernels.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/cuda/cuda_testing.h"

namespace tandem {
namespace {

TEST(CudaSharedFunctions, PhiloxNumbersEqualTheHosts) {
  CREATE_CUDA_OR_SKIP(cuda);
  constexpr int kN = 1 << 16;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceBuffer> buffer, cuda->Allocate(kN * sizeof(double)));
  std::vector<double> got(kN);
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}}) {
    for (uint64_t start : {uint64_t{0}, (uint64_t{1} << 40) - 7}) {
      ASSERT_EQ(cuda::LaunchPhiloxUniform(seed, start, kN, static_cast<double*>(buffer->data())),
                cudaSuccess);
      cuda->CopyToHost(buffer->data(), got.data(), kN * sizeof(double));
      ASSERT_OK(cuda->Synchronize());
      for (int i = 0; i < kN; ++i) {
        ASSERT_EQ(got[i], PhiloxUniform(seed, start + i))
            << "seed " << seed << " index " << start + i;
      }
    }
  }
}

// Every one of the 2^32 float bit patterns: FloatToFp8E4M3 on the device
// equals the device's satfinite conversion; every 4099th also equals the
// host's FloatToFp8E4M3.
TEST(CudaSharedFunctions, Fp8EncodingEqualsTheDevicesConversionForEveryFloat) {
  CREATE_CUDA_OR_SKIP(cuda);
  constexpr int kChunk = 1 << 24;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceBuffer> ours, cuda->Allocate(kChunk));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceBuffer> native, cuda->Allocate(kChunk));
  std::vector<uint8_t> a(kChunk), b(kChunk);
  uint64_t mismatches = 0, host_checked = 0;
  for (uint64_t first = 0; first < (uint64_t{1} << 32); first += kChunk) {
    ASSERT_EQ(cuda::LaunchFp8E4M3Encode(static_cast<uint32_t>(first), kChunk,
                                        static_cast<uint8_t*>(ours->data()),
                                        static_cast<uint8_t*>(native->data())),
              cudaSuccess);
    cuda->CopyToHost(ours->data(), a.data(), kChunk);
    cuda->CopyToHost(native->data(), b.data(), kChunk);
    ASSERT_OK(cuda->Synchronize());
    if (std::memcmp(a.data(), b.data(), kChunk) != 0) {
      for (int i = 0; i < kChunk; ++i) {
        if (a[i] != b[i] && ++mismatches <= 5) {
          ADD_FAILURE() << "bits 0x" << std::hex << first + i << ": ours 0x" << int{a[i]}
                        << ", the device's 0x" << int{b[i]};
        }
      }
    }
    for (int i = static_cast<int>((4099 - first % 4099) % 4099); i < kChunk; i += 4099) {
      const uint32_t bits = static_cast<uint32_t>(first + i);
      float x;
      std::memcpy(&x, &bits, sizeof x);
      ASSERT_EQ(a[i], FloatToFp8E4M3(x)) << "bits 0x" << std::hex << bits;
      ++host_checked;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(host_checked, 1000000u);
}

}  // namespace
}  // namespace tandem
