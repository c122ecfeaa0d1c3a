// Random GGUF quantized blocks for tests: random integers and scales of a
// chosen size, so that products and whole models can be checked against
// the same weights widened to f32.
#ifndef TANDEM_TESTS_TESTING_QUANT_TESTING_H_
#define TANDEM_TESTS_TESTING_QUANT_TESTING_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/float16.h"
#include "common/base/quant_blocks.h"

namespace tandem::testing {

// Blocks of `dtype` for `n` elements (a whole number of blocks), every
// integer field random, each fp16 scale uniform in [scale / 2, scale]
// (K-type minima too; Q5_1's minimum of either sign), so that values are about `scale * 8` at most.
inline std::vector<uint8_t> RandomQuantBlocks(DType dtype, int64_t n, float scale,
                                              std::mt19937_64& rng) {
  std::vector<uint8_t> bytes(DTypeBytes(dtype, n));
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> dist(scale / 2, scale);
  auto fp16 = [&](uint8_t* at) {
    const uint16_t h = Fp32ToFp16(dist(rng));
    std::memcpy(at, &h, 2);
  };
  const size_t block = DTypeBlockBytes(dtype);
  for (size_t at = 0; at < bytes.size(); at += block) {
    uint8_t* b = bytes.data() + at;
    switch (dtype) {
      case DType::kQ8_0:
      case DType::kQ4_0:
      case DType::kQ5_0:
        fp16(b);
        break;
      case DType::kQ5_1:
        fp16(b);
        fp16(b + 2);  // the minimum, of either sign: values in [m, m + 31 d]
        b[3] ^= static_cast<uint8_t>((rng() & 1) << 7);
        break;
      case DType::kQ4_K:
      case DType::kQ5_K:
        // Sub-block scales are 6 bits (up to 63): keep d small beside them.
        fp16(b);
        fp16(b + 2);
        for (int i = 0; i < 2; ++i) {
          uint16_t h;
          std::memcpy(&h, b + 2 * i, 2);
          h = Fp32ToFp16(Fp16ToFp32(h) / 32);
          std::memcpy(b + 2 * i, &h, 2);
        }
        break;
      case DType::kQ6_K:
        fp16(b + offsetof(BlockQ6_K, d));
        for (int i = 0; i < 16; ++i) {
          // Scales in [-32, 31], d divided to match.
          b[offsetof(BlockQ6_K, scales) + i] =
              static_cast<uint8_t>(static_cast<int>(rng() % 64) - 32);
        }
        {
          uint16_t h;
          std::memcpy(&h, b + offsetof(BlockQ6_K, d), 2);
          h = Fp32ToFp16(Fp16ToFp32(h) / 32);
          std::memcpy(b + offsetof(BlockQ6_K, d), &h, 2);
        }
        break;
      default:
        break;
    }
  }
  return bytes;
}

// Multiplies every value of the blocks by about `factor`: each fp16 scale
// (and K-type minimum scale) times `factor`, rounded to fp16.
inline void ScaleQuantBlocks(DType dtype, std::vector<uint8_t>& bytes, float factor) {
  std::vector<size_t> fields;
  switch (dtype) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ5_0:
      fields = {0};
      break;
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
      fields = {0, 2};
      break;
    case DType::kQ6_K:
      fields = {offsetof(BlockQ6_K, d)};
      break;
    default:
      return;
  }
  for (size_t at = 0; at < bytes.size(); at += DTypeBlockBytes(dtype)) {
    for (size_t field : fields) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + at + field, 2);
      h = Fp32ToFp16(Fp16ToFp32(h) * factor);
      std::memcpy(bytes.data() + at + field, &h, 2);
    }
  }
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TESTING_QUANT_TESTING_H_
