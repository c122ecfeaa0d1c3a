// FP8 E4M3 conversions bit for bit against NVIDIA's own: the host code of
// the CUDA toolkit's cuda_fp8.hpp, compiled here by the host compiler (no
// GPU, no CUDA runtime). __nv_cvt_float_to_fp8(x, __NV_SATFINITE,
// __NV_E4M3) is what FloatToFp8E4M3 promises to match. (On sm_89+ devices
// the same call is the cvt.rn.satfinite.e4m3x2.f32 instruction; that path
// needs a GPU and is not compared here.)
//
// Coverage: encoding of every one of the 2^32 f32 bit patterns (both signs,
// zeros, subnormals, infinities, every NaN payload), split across the
// machine's cores; decoding of all 256 codes through
// __nv_cvt_fp8_to_halfraw, whose f16 holds every E4M3 value exactly.
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "common/base/float16.h"
#include "common/base/fp8.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

uint8_t NvidiaEncode(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

TEST(Fp8E4M3Reference, DecodingMatchesCudaForAllCodes) {
  for (int code = 0; code < 256; ++code) {
    SCOPED_TRACE(code);
    const __half_raw half =
        __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
    const float nvidia = Fp16ToFp32(half.x);
    const float ours = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
    if (std::isnan(nvidia)) {
      // CUDA's NaN is f16 0x7FFF: positive, the sign of 0xFF dropped.
      EXPECT_TRUE(std::isnan(ours));
      EXPECT_FALSE(std::signbit(nvidia));
      EXPECT_FALSE(std::signbit(ours));
      continue;
    }
    EXPECT_EQ(std::bit_cast<uint32_t>(ours), std::bit_cast<uint32_t>(nvidia));
  }
}

TEST(Fp8E4M3Reference, EncodingMatchesCudaForEveryFloat) {
  constexpr uint64_t kPatterns = uint64_t{1} << 32;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<uint64_t> mismatches{0};
  std::atomic<uint64_t> first_mismatch{kPatterns};
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const uint64_t begin = kPatterns * t / threads;
      const uint64_t end = kPatterns * (t + 1) / threads;
      uint64_t local = 0;
      uint64_t first = kPatterns;
      for (uint64_t bits = begin; bits < end; ++bits) {
        const float x = std::bit_cast<float>(static_cast<uint32_t>(bits));
        if (FloatToFp8E4M3(x) != NvidiaEncode(x)) {
          ++local;
          first = std::min(first, bits);
        }
      }
      mismatches += local;
      uint64_t seen = first_mismatch.load();
      while (first < seen && !first_mismatch.compare_exchange_weak(seen, first)) {
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  EXPECT_EQ(mismatches.load(), 0u);
  if (first_mismatch.load() != kPatterns) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(first_mismatch.load()));
    ADD_FAILURE() << "first mismatch: bits " << std::hex << first_mismatch.load() << " ("
                  << std::hexfloat << x << "): ours " << int{FloatToFp8E4M3(x)} << ", CUDA "
                  << int{NvidiaEncode(x)};
  }
}

// The behaviours the header documents, stated against CUDA directly so a
// toolkit that changes them fails here by name.
TEST(Fp8E4M3Reference, CudaHostBehaviourIsAsDocumented) {
  EXPECT_EQ(NvidiaEncode(-std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(NvidiaEncode(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(NvidiaEncode(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(NvidiaEncode(464.0f), 0x7E);
  EXPECT_EQ(NvidiaEncode(1e10f), 0x7E);
  EXPECT_EQ(NvidiaEncode(0x1p-10f), 0x00);
  EXPECT_EQ(NvidiaEncode(-0.0f), 0x80);
  EXPECT_EQ(NvidiaEncode(-std::numeric_limits<float>::denorm_min()), 0x80);
}

}  // namespace
}  // namespace tandem
