// FP8 E4M3 conversions against the format's definition worked out
// independently (ldexp of sign, exponent and mantissa; nearest value by
// brute force over all codes), hand-worked rounding cases, and per-channel
// and per-tensor quantization. The bit-for-bit comparison with CUDA's own
// conversion is fp8_reference_test.cc (built where the toolkit is).
#include "common/base/fp8.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

// The compile-time conversions a C++20 host build promises.
static_assert(FloatToFp8E4M3(448.0f) == 0x7E);
static_assert(FloatToFp8E4M3(-1.0f) == 0xB8);
static_assert(Fp8E4M3ToFloat(0x7E) == 448.0f);
static_assert(Fp8E4M3ToFloat(0x01) == 0x1p-9f);

// The value of `code` from the definition: (-1)^s * 2^(e-7) * (1 + m/8) for
// e > 0, (-1)^s * 2^-6 * (m/8) for e == 0; NaN for e == 15, m == 7.
double DefinedValue(int code) {
  const int s = code >> 7;
  const int e = (code >> 3) & 15;
  const int m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -magnitude : magnitude;
}

bool IsNaNCode(int code) { return (code & 0x7F) == 0x7F; }

// The nearest E4M3 code to x by brute force: the smallest distance over
// all finite codes of x's sign, ties to the even code (mantissa bit 0 clear),
// finite values beyond 448 to +-448 (satfinite), NaN to 0x7F.
uint8_t NearestCode(float x) {
  if (std::isnan(x)) return 0x7F;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double magnitude = std::fabs(static_cast<double>(x));
  if (magnitude > 448.0) return static_cast<uint8_t>(sign | 0x7E);
  int best = 0;
  double best_distance = magnitude;
  for (int code = 1; code < 0x7F; ++code) {
    const double distance = std::fabs(DefinedValue(code) - magnitude);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

TEST(Fp8E4M3, EveryCodeDecodesToItsDefinedValue) {
  for (int code = 0; code < 256; ++code) {
    SCOPED_TRACE(code);
    const float value = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
    const float table_value = Fp8E4M3Table()[code];
    if (IsNaNCode(code)) {
      EXPECT_TRUE(std::isnan(value));
      EXPECT_TRUE(std::isnan(table_value));
      continue;
    }
    const double defined = DefinedValue(code);
    EXPECT_EQ(static_cast<double>(value), defined);
    // Signed zeros: 0x80 is -0.
    EXPECT_EQ(std::signbit(value), (code & 0x80) != 0);
    EXPECT_EQ(std::bit_cast<uint32_t>(table_value), std::bit_cast<uint32_t>(value));
  }
  EXPECT_EQ(Fp8E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0xFE), -448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), 0x1p-6f);      // smallest normal
  EXPECT_EQ(Fp8E4M3ToFloat(0x07), 7 * 0x1p-9f);  // largest subnormal
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);
}

TEST(Fp8E4M3, EveryFiniteCodeRoundTrips) {
  int finite = 0;
  for (int code = 0; code < 256; ++code) {
    if (IsNaNCode(code)) continue;
    ++finite;
    EXPECT_EQ(FloatToFp8E4M3(Fp8E4M3ToFloat(static_cast<uint8_t>(code))), code) << code;
  }
  EXPECT_EQ(finite, 254);
}

TEST(Fp8E4M3, TiesGoToTheEvenCodeInEveryRange) {
  // Exponent 0: 1 (0x38), 1.125 (0x39), 1.25 (0x3A).
  EXPECT_EQ(FloatToFp8E4M3(1.0625f), 0x38);
  EXPECT_EQ(FloatToFp8E4M3(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(FloatToFp8E4M3(std::nextafter(1.0625f, 0.0f)), 0x38);
  EXPECT_EQ(FloatToFp8E4M3(1.1875f), 0x3A);
  EXPECT_EQ(FloatToFp8E4M3(-1.1875f), 0xBA);
  // A tie above an odd mantissa of 7 carries into the next binade:
  // 1.9375 is halfway from 1.875 (0x3F) to 2 (0x40).
  EXPECT_EQ(FloatToFp8E4M3(1.9375f), 0x40);
  // Exponent 8: 256 (0x78), 288 (0x79), 320 (0x7A).
  EXPECT_EQ(FloatToFp8E4M3(272.0f), 0x78);
  EXPECT_EQ(FloatToFp8E4M3(304.0f), 0x7A);
  // The smallest normal binade: 2^-6 (0x08) and 2^-6 * 1.125 (0x09).
  EXPECT_EQ(FloatToFp8E4M3(0x1.1p-6f), 0x08);
  EXPECT_EQ(FloatToFp8E4M3(0x1.3p-6f), 0x0A);
  // Exponent -3: 0.125 (0x20) and 0.140625 (0x21).
  EXPECT_EQ(FloatToFp8E4M3(0.1328125f), 0x20);
}

TEST(Fp8E4M3, SubnormalsCountUnitsOfTwoToTheMinusNine) {
  EXPECT_EQ(FloatToFp8E4M3(0x1p-9f), 0x01);
  // 2^-10 is halfway from 0 to 2^-9: zero is even.
  EXPECT_EQ(FloatToFp8E4M3(0x1p-10f), 0x00);
  EXPECT_EQ(FloatToFp8E4M3(-0x1p-10f), 0x80);
  EXPECT_EQ(FloatToFp8E4M3(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  EXPECT_EQ(FloatToFp8E4M3(3 * 0x1p-10f), 0x02);   // 1.5 units -> 2
  EXPECT_EQ(FloatToFp8E4M3(5 * 0x1p-10f), 0x02);   // 2.5 units -> 2
  EXPECT_EQ(FloatToFp8E4M3(7 * 0x1p-10f), 0x04);   // 3.5 units -> 4
  EXPECT_EQ(FloatToFp8E4M3(13 * 0x1p-10f), 0x06);  // 6.5 units -> 6
  // 7.5 units is halfway from the largest subnormal (0x07) to the smallest
  // normal, 8 units = 2^-6 (0x08): even wins, and the code is a normal.
  EXPECT_EQ(FloatToFp8E4M3(15 * 0x1p-10f), 0x08);
  EXPECT_EQ(FloatToFp8E4M3(std::nextafter(15 * 0x1p-10f, 0.0f)), 0x07);
  EXPECT_EQ(FloatToFp8E4M3(0x1p-11f), 0x00);
  // f32 subnormals are all far below 2^-10.
  EXPECT_EQ(FloatToFp8E4M3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(FloatToFp8E4M3(-std::numeric_limits<float>::denorm_min()), 0x80);
  EXPECT_EQ(FloatToFp8E4M3(FLT_MIN), 0x00);
}

TEST(Fp8E4M3, ZerosKeepTheirSign) {
  EXPECT_EQ(FloatToFp8E4M3(0.0f), 0x00);
  EXPECT_EQ(FloatToFp8E4M3(-0.0f), 0x80);
}

TEST(Fp8E4M3, LargeValuesSaturateToFourFortyEight) {
  EXPECT_EQ(FloatToFp8E4M3(448.0f), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(449.0f), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(432.0f), 0x7E);  // tie of 416 (0x7D) and 448: even
  EXPECT_EQ(FloatToFp8E4M3(std::nextafter(432.0f, 0.0f)), 0x7D);
  // 464 is halfway from 448 to 480 (the NaN code's place): 448 is even.
  EXPECT_EQ(FloatToFp8E4M3(464.0f), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(std::nextafter(464.0f, 1000.0f)), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(480.0f), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(-480.0f), 0xFE);
  EXPECT_EQ(FloatToFp8E4M3(1e30f), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(FLT_MAX), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(-FLT_MAX), 0xFE);
  EXPECT_EQ(FloatToFp8E4M3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(-std::numeric_limits<float>::infinity()), 0xFE);
}

TEST(Fp8E4M3, EveryNaNBecomesThePositiveNaNCode) {
  EXPECT_EQ(FloatToFp8E4M3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(FloatToFp8E4M3(-std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(FloatToFp8E4M3(std::bit_cast<float>(0x7F800001u)), 0x7F);  // signalling
  EXPECT_EQ(FloatToFp8E4M3(std::bit_cast<float>(0xFFFFFFFFu)), 0x7F);
  EXPECT_EQ(FloatToFp8E4M3(std::bit_cast<float>(0xFF800001u)), 0x7F);
}

// Every midpoint between adjacent codes and its two f32 neighbours, then a
// stride through every f32 from 2^-12 to 2^10 (all binades that round to
// something other than zero or 448), both signs, against the brute-force
// nearest code.
TEST(Fp8E4M3, EncodingIsTheNearestCode) {
  std::vector<float> inputs;
  for (int code = 0; code < 0x7E; ++code) {
    const float mid = static_cast<float>((DefinedValue(code) + DefinedValue(code + 1)) / 2);
    inputs.push_back(mid);
    inputs.push_back(std::nextafter(mid, 0.0f));
    inputs.push_back(std::nextafter(mid, 1000.0f));
  }
  for (uint32_t bits = 0x39800000u; bits < 0x44800000u; bits += 4099) {
    inputs.push_back(std::bit_cast<float>(bits));
  }
  for (float x : inputs) {
    for (float signed_x : {x, -x}) {
      ASSERT_EQ(FloatToFp8E4M3(signed_x), NearestCode(signed_x))
          << std::hexfloat << signed_x << " bits " << std::hex << std::bit_cast<uint32_t>(signed_x);
    }
  }
}

// Half the E4M3 quantum at |y|: 2^(e-3)/2 in the binade 2^e >= 2^-6,
// 2^-9 / 2 below it.
double HalfQuantum(double y) {
  y = std::fabs(y);
  if (y < 0x1p-6) return 0x1p-10;
  return std::ldexp(1.0, std::ilogb(y) - 4);
}

// |dequantized - w| <= half a quantum of w / scale, times the scale, with
// room for the f32 rounding of the division and of the product.
void ExpectWithinHalfQuantum(const std::vector<float>& w, const Fp8Quantized& q) {
  std::vector<float> out(w.size());
  DequantizeFp8(q, out.data());
  for (int r = 0; r < q.rows; ++r) {
    for (int c = 0; c < q.cols; ++c) {
      const double scale = q.scale_at(r, c);
      const size_t i = static_cast<size_t>(r) * q.cols + c;
      const double bound =
          HalfQuantum(w[i] / scale) * scale + std::fabs(static_cast<double>(w[i])) * 0x1p-21;
      EXPECT_LE(std::fabs(static_cast<double>(out[i]) - w[i]), bound)
          << "row " << r << " col " << c << " w " << w[i] << " got " << out[i];
    }
  }
}

std::vector<float> RandomWeights(int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    // Rows of very different magnitudes, as output channels have.
    const float row_scale = std::ldexp(1.0f, 3 * r - 12);
    for (int c = 0; c < cols; ++c) w[static_cast<size_t>(r) * cols + c] = normal(rng) * row_scale;
  }
  return w;
}

TEST(Fp8Quantize, PerChannelScaleIsRowAmaxOver448) {
  const int rows = 8, cols = 96;
  const std::vector<float> w = RandomWeights(rows, cols, 7);
  absl::StatusOr<Fp8Quantized> q = QuantizeFp8PerChannel(w.data(), rows, cols);
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_EQ(q->rows, rows);
  ASSERT_EQ(q->cols, cols);
  ASSERT_EQ(q->scales.size(), static_cast<size_t>(rows));
  ASSERT_EQ(q->codes.size(), w.size());
  for (int r = 0; r < rows; ++r) {
    float amax = 0.0f;
    int argmax = 0;
    for (int c = 0; c < cols; ++c) {
      if (std::fabs(w[r * cols + c]) > amax) {
        amax = std::fabs(w[r * cols + c]);
        argmax = c;
      }
    }
    EXPECT_EQ(q->scales[r], amax / 448.0f) << r;
    // The largest element uses the whole range: +-448.
    const uint8_t sign = w[r * cols + argmax] < 0 ? 0x80 : 0;
    EXPECT_EQ(q->codes[r * cols + argmax], sign | 0x7E) << r;
  }
  ExpectWithinHalfQuantum(w, *q);
}

TEST(Fp8Quantize, PerTensorHasOneScale) {
  const int rows = 6, cols = 40;
  const std::vector<float> w = RandomWeights(rows, cols, 11);
  absl::StatusOr<Fp8Quantized> q = QuantizeFp8PerTensor(w.data(), rows, cols);
  ASSERT_TRUE(q.ok()) << q.status();
  float amax = 0.0f;
  for (float x : w) amax = std::max(amax, std::fabs(x));
  ASSERT_EQ(q->scales.size(), 1u);
  EXPECT_EQ(q->scales[0], amax / 448.0f);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) EXPECT_EQ(q->scale_at(r, c), q->scales[0]);
  }
  ExpectWithinHalfQuantum(w, *q);
}

TEST(Fp8Quantize, ZeroRowGetsScaleOneAndStaysZero) {
  const std::vector<float> w = {1.0f, -2.0f, 3.0f, 0.0f, 0.0f, 0.0f};
  absl::StatusOr<Fp8Quantized> q = QuantizeFp8PerChannel(w.data(), 2, 3);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->scales[0], 3.0f / 448.0f);
  EXPECT_EQ(q->scales[1], 1.0f);
  EXPECT_THAT(std::vector<uint8_t>(q->codes.begin() + 3, q->codes.end()),
              ::testing::ElementsAre(0, 0, 0));
  std::vector<float> out(6);
  DequantizeFp8(*q, out.data());
  EXPECT_THAT(std::vector<float>(out.begin() + 3, out.end()), ::testing::ElementsAre(0, 0, 0));
  // A per-tensor all-zero matrix as well.
  const std::vector<float> zeros(4, 0.0f);
  absl::StatusOr<Fp8Quantized> z = QuantizeFp8PerTensor(zeros.data(), 2, 2);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ(z->scales[0], 1.0f);
}

// One outlier sets the scale; values below 2^-10 of it flush to signed zero
// (the error is then the value itself, under half the smallest subnormal).
TEST(Fp8Quantize, OneHugeValueFlushesTheSmallOnes) {
  const std::vector<float> w = {1e6f, 1.0f, -1.0f, 3000.0f, -0.5f, 1e5f};
  absl::StatusOr<Fp8Quantized> q = QuantizeFp8PerChannel(w.data(), 1, 6);
  ASSERT_TRUE(q.ok()) << q.status();
  const float scale = 1e6f / 448.0f;
  EXPECT_EQ(q->scales[0], scale);
  EXPECT_EQ(q->codes[0], 0x7E);
  EXPECT_EQ(q->codes[1], 0x00);  // 1 / scale = 4.5e-4 < 2^-10
  EXPECT_EQ(q->codes[2], 0x80);
  EXPECT_EQ(q->codes[4], 0x80);
  // 3000 / scale = 1.344: between 1.25 (0x3A) and 1.375 (0x3B), nearer 1.375.
  EXPECT_EQ(q->codes[3], 0x3B);
  ExpectWithinHalfQuantum(w, *q);
}

TEST(Fp8Quantize, ExtremeMagnitudes) {
  // amax / 448 underflows to zero: scale 1, every code zero.
  const std::vector<float> tiny = {std::numeric_limits<float>::denorm_min(), 0.0f};
  absl::StatusOr<Fp8Quantized> q = QuantizeFp8PerChannel(tiny.data(), 1, 2);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->scales[0], 1.0f);
  EXPECT_EQ(q->codes[0], 0x00);
  // FLT_MAX has a finite scale and maps to 448.
  const std::vector<float> huge = {FLT_MAX, -1e37f};
  q = QuantizeFp8PerChannel(huge.data(), 1, 2);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->scales[0], FLT_MAX / 448.0f);
  EXPECT_EQ(q->codes[0], 0x7E);
  ExpectWithinHalfQuantum(huge, *q);
}

TEST(Fp8Quantize, RefusesNonFiniteWeightsNamingTheRow) {
  std::vector<float> w(4 * 6, 0.25f);
  w[2 * 6 + 5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(QuantizeFp8PerChannel(w.data(), 4, 6).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row 2, column 5")));
  EXPECT_THAT(QuantizeFp8PerTensor(w.data(), 4, 6).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row 2, column 5")));
  w[2 * 6 + 5] = 0.0f;
  w[3 * 6 + 1] = -std::numeric_limits<float>::infinity();
  EXPECT_THAT(QuantizeFp8PerChannel(w.data(), 4, 6).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row 3, column 1")));
  EXPECT_THAT(QuantizeFp8PerTensor(w.data(), 4, 6).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row 3, column 1")));
}

TEST(Fp8Quantize, RefusesNegativeSizesAndAcceptsEmpty) {
  const float w = 1.0f;
  EXPECT_THAT(QuantizeFp8PerChannel(&w, -1, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(QuantizeFp8PerTensor(&w, 1, -1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  absl::StatusOr<Fp8Quantized> q = QuantizeFp8PerChannel(nullptr, 0, 5);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(q->codes.empty());
}

// DeepSeek-V3's layout: one scale per block, the last blocks of a row and
// of a column cut short (10 x 13 in 4 x 5 blocks is a 3 x 3 grid whose last
// row of blocks has 2 rows and last column 3 columns).
TEST(Fp8Quantize, PerBlockScaleIsBlockAmaxOver448) {
  const int rows = 10, cols = 13, br = 4, bc = 5;
  const std::vector<float> w = RandomWeights(rows, cols, 5);
  absl::StatusOr<Fp8Quantized> q = QuantizeFp8PerBlock(w.data(), rows, cols, br, bc);
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_EQ(q->grid_cols(), 3);
  ASSERT_EQ(q->scales.size(), 9u);
  for (int gr = 0; gr < 3; ++gr) {
    for (int gc = 0; gc < 3; ++gc) {
      float amax = 0.0f;
      for (int r = gr * br; r < std::min(rows, gr * br + br); ++r) {
        for (int c = gc * bc; c < std::min(cols, gc * bc + bc); ++c) {
          amax = std::max(amax, std::fabs(w[r * cols + c]));
        }
      }
      EXPECT_EQ(q->scales[gr * 3 + gc], amax / 448.0f) << gr << " " << gc;
    }
  }
  EXPECT_EQ(q->scale_at(9, 12), q->scales[8]);
  EXPECT_EQ(q->scale_at(3, 5), q->scales[1]);
  EXPECT_EQ(q->scale_at(4, 4), q->scales[3]);
  ExpectWithinHalfQuantum(w, *q);
  // One block per row of the matrix is the per-channel layout.
  absl::StatusOr<Fp8Quantized> rows_q = QuantizeFp8PerBlock(w.data(), rows, cols, 1, cols);
  absl::StatusOr<Fp8Quantized> channel = QuantizeFp8PerChannel(w.data(), rows, cols);
  ASSERT_TRUE(rows_q.ok() && channel.ok());
  EXPECT_EQ(rows_q->scales, channel->scales);
  EXPECT_EQ(rows_q->codes, channel->codes);
}

TEST(Fp8Quantize, PerBlockRefusesEmptyBlocksAndNamesANonFiniteWeight) {
  std::vector<float> w(6 * 6, 0.5f);
  EXPECT_THAT(QuantizeFp8PerBlock(w.data(), 6, 6, 0, 4).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 x 4 blocks")));
  w[4 * 6 + 5] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(QuantizeFp8PerBlock(w.data(), 6, 6, 4, 4).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row 4, column 5")));
}

TEST(Fp8Quantize, NaNCodeDequantizesToNaN) {
  Fp8Quantized q;
  q.rows = 1;
  q.cols = 3;
  q.block_cols = 3;
  q.codes = {0x7F, 0xFF, 0x38};
  q.scales = {2.0f};
  std::vector<float> out(3);
  DequantizeFp8(q, out.data());
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], 2.0f);
}

}  // namespace
}  // namespace tandem
