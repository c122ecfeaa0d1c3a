#include "common/base/philox.h"

#include <cmath>
#include <cstdint>
#include <set>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// Random123's known-answer vectors for Philox4x32-10 (its kat_vectors file):
// a counter of zeros, of ones, and pi's digits, each with its key.
TEST(Philox, KnownAnswers) {
  struct Case {
    r123::Philox4x32::ctr_type counter;
    r123::Philox4x32::key_type key;
    r123::Philox4x32::ctr_type want;
  };
  const Case cases[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       {{0xffffffff, 0xffffffff}},
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       {{0xa4093822, 0x299f31d0}},
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(r123::Philox4x32()(c.counter, c.key), c.want);
  }
  // PhiloxBlock puts the index in counter words 0-1 and the seed in the key.
  EXPECT_EQ(PhiloxBlock(0, 0), cases[0].want);
  EXPECT_EQ(PhiloxBlock(0xffffffffffffffffULL, 0x00000000ffffffffULL),
            r123::Philox4x32()({{0xffffffff, 0, 0, 0}}, {{0xffffffff, 0xffffffff}}));
  EXPECT_EQ(PhiloxBlock(0x299f31d0a4093822ULL, 0x85a308d3243f6a88ULL),
            r123::Philox4x32()({{0x243f6a88, 0x85a308d3, 0, 0}}, {{0xa4093822, 0x299f31d0}}));
}

TEST(Philox, UniformTakesTheTop53BitsOfWordsOneAndZero) {
  // Words 1:0 of the zero block are 0xe169c58d'6627e8d5.
  EXPECT_EQ(PhiloxUniform(0, 0), static_cast<double>(0xe169c58d6627e8d5ULL >> 11) * 0x1.0p-53);
  double sum = 0.0;
  std::set<double> seen;
  constexpr int kN = 100000;
  for (int i = 0; i < kN; ++i) {
    const double u = PhiloxUniform(42, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    seen.insert(u);
  }
  // Mean 1/2 with standard error sqrt(1/12 / N) ~ 0.0009: 5 sigma.
  EXPECT_NEAR(sum / kN, 0.5, 0.0046);
  EXPECT_EQ(seen.size(), static_cast<size_t>(kN));
  // Neighbouring seeds and indexes give unrelated numbers.
  EXPECT_NE(PhiloxUniform(1, 0), PhiloxUniform(0, 1));
  EXPECT_NE(PhiloxUniform(1, 0), PhiloxUniform(1, uint64_t{1} << 32));
}

}  // namespace
}  // namespace tandem
