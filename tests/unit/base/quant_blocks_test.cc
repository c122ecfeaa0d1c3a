// GGUF block dequantization against values worked out by hand from the
// format, and against a step-by-step reference on random blocks (each
// product rounded on its own, as GGUF's reference rounds).
#include "common/base/quant_blocks.h"

#include <cstring>
#include <random>
#include <vector>

#include "common/base/float16.h"
#include "gtest/gtest.h"
#include "tests/testing/quant_testing.h"

namespace tandem {
namespace {

std::vector<float> Dequantize(DType dtype, const void* block) {
  std::vector<float> out(DTypeBlockElements(dtype));
  DequantizeRow(dtype, block, out.data(), static_cast<int64_t>(out.size()));
  return out;
}

TEST(QuantBlocks, SizesAreGgufs) {
  EXPECT_EQ(DTypeBytes(DType::kQ8_0, 64), 68u);
  EXPECT_EQ(DTypeBytes(DType::kQ4_0, 2048), 64u * 18);
  EXPECT_EQ(DTypeBytes(DType::kQ5_0, 1408), 44u * 22);
  EXPECT_EQ(DTypeBytes(DType::kQ5_1, 64), 48u);
  EXPECT_EQ(DTypeBytes(DType::kQ4_K, 2048), 8u * 144);
  EXPECT_EQ(DTypeBytes(DType::kQ5_K, 256), 176u);
  EXPECT_EQ(DTypeBytes(DType::kQ6_K, 512), 420u);
  EXPECT_EQ(DTypeBytes(DType::kBF16, 3), 6u);
  EXPECT_EQ(DTypeSize(DType::kQ4_K), 0u);
}

TEST(QuantBlocks, Q8_0ScalesSignedBytes) {
  BlockQ8_0 b{};
  b.d = 0x3800;  // 0.5
  b.qs[0] = -128;
  b.qs[1] = -1;
  b.qs[2] = 1;
  b.qs[31] = 127;
  const std::vector<float> y = Dequantize(DType::kQ8_0, &b);
  EXPECT_EQ(y[0], -64.0f);
  EXPECT_EQ(y[1], -0.5f);
  EXPECT_EQ(y[2], 0.5f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_EQ(y[31], 63.5f);
}

TEST(QuantBlocks, Q4_0TakesLowNibblesFirstAndCentresOnEight) {
  BlockQ4_0 b{};
  b.d = 0x4000;  // 2
  b.qs[0] = 0xf0;
  b.qs[15] = 0x19;
  const std::vector<float> y = Dequantize(DType::kQ4_0, &b);
  EXPECT_EQ(y[0], -16.0f);   // (0 - 8) * 2
  EXPECT_EQ(y[16], 14.0f);   // (15 - 8) * 2
  EXPECT_EQ(y[15], 2.0f);    // (9 - 8) * 2
  EXPECT_EQ(y[31], -14.0f);  // (1 - 8) * 2
  EXPECT_EQ(y[1], -16.0f);
}

// Bit i of qh is element i's fifth bit: elements 0-15 take the low
// nibbles and bits 0-15, elements 16-31 the high nibbles and bits 16-31.
TEST(QuantBlocks, Q5_0TakesTheFifthBitFromQhAndCentresOnSixteen) {
  BlockQ5_0 b{};
  b.d = 0x4000;  // 2
  b.qs[0] = 0xf0;
  b.qs[3] = 0x2a;
  b.qh[0] = 0x09;  // bits 0 and 3: elements 0 and 3
  b.qh[2] = 0x01;  // bit 16: element 16
  b.qh[3] = 0x80;  // bit 31: element 31
  const std::vector<float> y = Dequantize(DType::kQ5_0, &b);
  EXPECT_EQ(y[0], 0.0f);     // (0 + 16 - 16) * 2
  EXPECT_EQ(y[16], 30.0f);   // (15 + 16 - 16) * 2
  EXPECT_EQ(y[3], 20.0f);    // (10 + 16 - 16) * 2
  EXPECT_EQ(y[19], -28.0f);  // (2 - 16) * 2
  EXPECT_EQ(y[31], 0.0f);    // (0 + 16 - 16) * 2
  EXPECT_EQ(y[1], -32.0f);   // (0 - 16) * 2
}

TEST(QuantBlocks, Q5_1AddsItsMinimum) {
  BlockQ5_1 b{};
  b.d = 0x3800;  // 0.5
  b.m = 0xc000;  // -2
  b.qs[5] = 0x7f;
  b.qh[0] = 0x20;  // bit 5: element 5
  b.qh[2] = 0x20;  // bit 21: element 21
  const std::vector<float> y = Dequantize(DType::kQ5_1, &b);
  EXPECT_EQ(y[5], 0.5f * 31 - 2);
  EXPECT_EQ(y[21], 0.5f * 23 - 2);
  EXPECT_EQ(y[0], -2.0f);
}

TEST(QuantBlocks, Q4_KUnpacksSixBitScalesAndMinima) {
  BlockQ4_K b{};
  b.d = 0x3c00;        // 1
  b.dmin = 0x3800;     // 0.5
  b.scales[0] = 0xc3;  // sc0 = 3; its top bits are sc4's
  b.scales[4] = 0x47;  // m0 = 7; its top bits are m4's
  b.scales[1] = 2;     // sc1
  b.scales[5] = 4;     // m1
  b.scales[8] = 0x52;  // sc4 = 2 | 3 << 4 = 50, m4 = 5 | 1 << 4 = 21
  b.qs[0] = 0x9a;      // element 0 = 10 (sub-block 0), element 32 = 9 (sub-block 1)
  b.qs[64] = 0x0f;     // element 128 = 15 (sub-block 4)
  const std::vector<float> y = Dequantize(DType::kQ4_K, &b);
  EXPECT_EQ(y[0], 3 * 10 - 0.5f * 7);
  EXPECT_EQ(y[1], -3.5f);
  EXPECT_EQ(y[32], 2 * 9 - 0.5f * 4);
  EXPECT_EQ(y[128], 50 * 15 - 0.5f * 21);
  EXPECT_EQ(y[160], -0.5f * (static_cast<float>((b.scales[9] >> 4) | ((b.scales[5] >> 6) << 4))));
}

TEST(QuantBlocks, Q5_KAddsTheFifthBitPerChunk) {
  BlockQ5_K b{};
  b.d = 0x3c00;
  b.dmin = 0;
  b.scales[0] = 1;  // sc0
  b.qh[0] = 0x21;   // bit 0: element 0; bit 5 = 2 * 2 + 1: element 160
  b.qs[0] = 0x03;
  b.qs[64] = 0x40;     // element 160 = high nibble 4
  b.scales[9] = 0x03;  // sc5 = 3
  const std::vector<float> y = Dequantize(DType::kQ5_K, &b);
  EXPECT_EQ(y[0], 16 + 3);
  EXPECT_EQ(y[160], 3 * (16 + 4));
  EXPECT_EQ(y[128], 0.0f);  // sc4 = 0
}

TEST(QuantBlocks, Q6_KInterleavesQuartersAndCentresOn32) {
  BlockQ6_K b{};
  b.d = 0x3400;  // 0.25
  b.ql[0] = 0x5c;
  b.ql[32] = 0x01;
  b.qh[0] = 0x9c;  // bits 0-1: 0, 2-3: 3, 4-5: 1, 6-7: 2
  b.scales[0] = -3;
  b.scales[2] = 5;
  b.scales[4] = 2;
  b.scales[6] = 7;
  b.ql[64] = 0x3f;  // second half: element 128 = 15 | 0 << 4
  b.scales[8] = -1;
  const std::vector<float> y = Dequantize(DType::kQ6_K, &b);
  EXPECT_EQ(y[0], 0.25f * -3 * (12 - 32));
  EXPECT_EQ(y[32], 0.25f * 5 * ((1 | 3 << 4) - 32));
  EXPECT_EQ(y[64], 0.25f * 2 * ((5 | 1 << 4) - 32));
  EXPECT_EQ(y[96], 0.25f * 7 * ((0 | 2 << 4) - 32));
  EXPECT_EQ(y[128], 0.25f * -1 * (15 - 32));
  EXPECT_EQ(y[192], 0.25f * b.scales[12] * ((3 | 0) - 32));
}

// The formulas of quant_blocks.h, one rounding per operation.
float Reference(DType dtype, const uint8_t* block, int i) {
  auto half = [&](size_t at) {
    uint16_t h;
    std::memcpy(&h, block + at, 2);
    return Fp16ToFp32(h);
  };
  volatile float product;
  switch (dtype) {
    case DType::kQ8_0:
      product = half(0) * static_cast<float>(static_cast<int8_t>(block[2 + i]));
      return product;
    case DType::kQ4_0: {
      const int q = i < 16 ? block[2 + i] & 15 : block[2 + i - 16] >> 4;
      product = half(0) * static_cast<float>(q - 8);
      return product;
    }
    case DType::kQ5_0:
    case DType::kQ5_1: {
      const bool one = dtype == DType::kQ5_1;
      const uint8_t* qh = block + (one ? 4 : 2);
      const uint8_t* qs = qh + 4;
      int q = i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
      q |= ((qh[i / 8] >> (i % 8)) & 1) << 4;
      product = half(0) * static_cast<float>(one ? q : q - 16);
      return one ? product + half(2) : product;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool five = dtype == DType::kQ5_K;
      const uint8_t* qs = block + (five ? 48 : 16);
      const int c = i / 64, l = i % 32, j = i / 32;
      int q = (i % 64) < 32 ? qs[32 * c + l] & 15 : qs[32 * c + l] >> 4;
      if (five) q += ((block[16 + l] >> j) & 1) << 4;
      uint8_t sc, m;
      K4ScaleMin(block + 4, j, &sc, &m);
      volatile float d = half(0) * static_cast<float>(sc);
      volatile float min = half(2) * static_cast<float>(m);
      product = d * static_cast<float>(q);
      return product - min;
    }
    case DType::kQ6_K: {
      const int h = i / 128, r = i % 128, quarter = r / 32, l = r % 32;
      const uint8_t* ql = block + 64 * h;
      const uint8_t* qh = block + 128 + 32 * h;
      const int low = quarter == 0   ? ql[l] & 15
                      : quarter == 1 ? ql[l + 32] & 15
                      : quarter == 2 ? ql[l] >> 4
                                     : ql[l + 32] >> 4;
      const int q = (low | ((qh[l] >> (2 * quarter)) & 3) << 4) - 32;
      const int8_t sc = static_cast<int8_t>(block[192 + 8 * h + l / 16 + 2 * quarter]);
      volatile float d = half(208) * static_cast<float>(sc);
      product = d * static_cast<float>(q);
      return product;
    }
    default:
      return 0;
  }
}

TEST(QuantBlocks, RandomBlocksMatchTheFormulaBitForBit) {
  std::mt19937_64 rng(5);
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kQ5_1, DType::kQ4_K,
                      DType::kQ5_K, DType::kQ6_K}) {
    const int n = 4 * DTypeBlockElements(dtype);
    const std::vector<uint8_t> bytes = testing::RandomQuantBlocks(dtype, n, 0.1f, rng);
    std::vector<float> y(n);
    DequantizeRow(dtype, bytes.data(), y.data(), n);
    const size_t block_bytes = DTypeBlockBytes(dtype);
    const int block = DTypeBlockElements(dtype);
    for (int i = 0; i < n; ++i) {
      const float want = Reference(dtype, bytes.data() + i / block * block_bytes, i % block);
      ASSERT_EQ(std::memcmp(&y[i], &want, 4), 0)
          << DTypeName(dtype) << " element " << i << ": " << y[i] << " vs " << want;
    }
  }
}

}  // namespace
}  // namespace tandem
