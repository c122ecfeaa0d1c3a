// The CPU backend with 16-bit KV caches (bf16, f16): WriteKv and
// PagedAttention against float64 references computed from the 16-bit values
// widened by the tests' own conversions (half_precision_fixture.h), so that
// a kernel sharing a conversion bug with the backend cannot pass. The weights
// (MatMul, Embed, AddBias, RoPE) are in half_precision_test.cc.
//
// Tolerances, and why:
// - Attention over a bf16 / f16 KV cache: against the same attention over
//   the rounded keys and values, f32 accuracy (1e-5 of the output's
//   largest element; observed below 1e-6); against unrounded keys and
//   values (or an f32 cache), K and V rounded by up to 2^-8 (bf16) or 2^-11
//   (f16) relative move the output by about that much (observed up to
//   3.4e-3 and 4.6e-4): 1e-2 for bf16, 1e-3 for f16.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/compute_testing.h"
#include "tests/unit/compute/half_precision_fixture.h"

namespace tandem {
namespace {

using ::tandem::testing::kGuard;
using ::tandem::testing::kNaN;
using ::tandem::testing::RandomFloats;
using ::tandem::testing::WorstError;

// ------------------------------------------------- WriteKv, PagedAttention

constexpr int kKvLayer = 1;  // of two: offsets must include the layer

// A NaN (in `dtype`) whose payload varies with the element index: reading
// an unwritten slot poisons the output, and any stray write changes a byte.
void FillSentinel(DType dtype, std::vector<uint8_t>& cache) {
  const size_t n = cache.size() / DTypeSize(dtype);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kF32) {
      const uint32_t bits = 0x7f800000u | static_cast<uint32_t>(1 + i % 0x3fffff);
      std::memcpy(&cache[4 * i], &bits, 4);
    } else {
      const uint16_t bits = dtype == DType::kBF16 ? static_cast<uint16_t>(0x7f80 | (1 + i % 0x7f))
                                                  : static_cast<uint16_t>(0x7c00 | (1 + i % 0x3ff));
      std::memcpy(&cache[2 * i], &bits, 2);
    }
  }
}

double ElementAt(DType dtype, const std::vector<uint8_t>& cache, size_t index) {
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, &cache[4 * index], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &cache[2 * index], 2);
  return BitsToFloat(dtype, h);
}

struct KvSequence {
  int length;
  std::vector<float> keys, values;  // logical [length][kv_dim], f32
  std::vector<int32_t> blocks;
};

// Sequences with random K/V written through WriteKv into caches of every
// dtype, then attended through PagedAttention.
class KvCase {
 public:
  KvCase(const AttentionShape& shape, int block_size, const std::vector<int>& lengths,
         std::mt19937_64& rng)
      : shape_(shape), rng_(rng) {
    base_.n_layers = 2;
    base_.block_size = block_size;
    base_.kv_dim = shape.n_kv_heads * shape.head_dim;
    int needed = 0;
    for (int len : lengths) needed += (len + block_size - 1) / block_size;
    base_.num_blocks = needed + 3;  // a few never used
    std::vector<int32_t> ids(base_.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    size_t next = 0;
    for (int len : lengths) {
      KvSequence s;
      s.length = len;
      const int n_blocks = (len + block_size - 1) / block_size;
      s.blocks.assign(ids.begin() + next, ids.begin() + next + n_blocks);
      next += n_blocks;
      s.keys = RandomFloats(size_t(len) * base_.kv_dim, -1.0f, 1.0f, rng_);
      s.values = RandomFloats(size_t(len) * base_.kv_dim, -1.0f, 1.0f, rng_);
      seqs_.push_back(std::move(s));
    }
  }

  KvLayout Layout(DType dtype) const {
    KvLayout layout = base_;
    layout.dtype = dtype;
    return layout;
  }

  // A sentinel-filled cache of `dtype` with every position of every
  // sequence written by WriteKv: the rows interleave sequences and come in
  // two calls, K and V in a fused [k | gap | v | gap] buffer.
  std::vector<uint8_t> WriteCache(CpuBackend& backend, DType dtype) const {
    const KvLayout layout = Layout(dtype);
    std::vector<uint8_t> cache(layout.total_bytes());
    FillSentinel(dtype, cache);
    std::vector<std::pair<int, int>> order;  // (sequence, position)
    for (size_t s = 0; s < seqs_.size(); ++s) {
      for (int t = 0; t < seqs_[s].length; ++t) order.push_back({static_cast<int>(s), t});
    }
    std::mt19937_64 shuffle_rng(static_cast<uint64_t>(order.size()));
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    const int kv = base_.kv_dim, stride = 2 * kv + 5;
    const size_t split = order.size() / 3;
    for (auto [begin, end] : {std::pair{size_t{0}, split}, std::pair{split, order.size()}}) {
      std::vector<float> fused((end - begin) * stride, kGuard);
      std::vector<AttentionRow> rows;
      for (size_t r = begin; r < end; ++r) {
        const auto [s, t] = order[r];
        const KvSequence& seq = seqs_[s];
        float* row = fused.data() + (r - begin) * stride;
        std::copy_n(seq.keys.begin() + size_t(t) * kv, kv, row);
        std::copy_n(seq.values.begin() + size_t(t) * kv, kv, row + kv + 2);
        rows.push_back({t, seq.blocks});
      }
      backend.WriteKv(fused.data(), stride, fused.data() + kv + 2, stride, rows, kKvLayer, layout,
                      cache.data());
    }
    return cache;
  }

  // Checks that each written element is its f32 value rounded to `dtype`
  // (nearest, ties to even) and that every other byte kept its sentinel.
  void ExpectWrittenExactly(DType dtype, const std::vector<uint8_t>& cache) const {
    const KvLayout layout = Layout(dtype);
    std::vector<uint8_t> untouched(cache.size());
    FillSentinel(dtype, untouched);
    std::vector<bool> written(layout.total_elements(), false);
    int wrong = 0;
    for (const KvSequence& s : seqs_) {
      for (int t = 0; t < s.length; ++t) {
        const int32_t block = s.blocks[t / layout.block_size];
        const int slot = t % layout.block_size;
        for (int d = 0; d < layout.kv_dim; ++d) {
          const size_t key = layout.KeyOffset(kKvLayer, block, slot, d);
          const size_t value = layout.ValueOffset(kKvLayer, block, slot) + d;
          for (auto [index, want] : {std::pair{key, s.keys[size_t(t) * layout.kv_dim + d]},
                                     std::pair{value, s.values[size_t(t) * layout.kv_dim + d]}}) {
            written[index] = true;
            const double got = ElementAt(dtype, cache, index);
            if (got != RoundTo(dtype, want) && ++wrong <= 5) {
              ADD_FAILURE() << "position " << t << " dim " << d << ": stored " << got << " for "
                            << want << ", expected " << RoundTo(dtype, want);
            }
          }
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "elements stored wrongly";
    const size_t element = layout.element_bytes();
    size_t stray = 0;
    for (size_t i = 0; i < written.size(); ++i) {
      if (!written[i] && std::memcmp(&cache[i * element], &untouched[i * element], element) != 0) {
        ++stray;
      }
    }
    EXPECT_EQ(stray, 0u) << "elements outside the written slots changed";
  }

  struct Errors {
    double vs_rounded = 0.0;  // vs exact attention over the rounded K/V
    double vs_exact = 0.0;    // vs exact attention over the f32 K/V
    std::vector<float> out;
  };

  // PagedAttention of `rows_of` ((sequence, first position, count) runs)
  // with the given queries over `cache`; errors per row as
  // max |out - exact| / max |exact|.
  Errors Attend(CpuBackend& backend, DType dtype, const std::vector<uint8_t>& cache,
                const std::vector<std::tuple<int, int, int>>& runs,
                const std::vector<float>& q) const {
    std::vector<AttentionRow> rows;
    std::vector<int> row_seq;
    for (const auto& [s, first, count] : runs) {
      for (int i = 0; i < count; ++i) {
        rows.push_back({first + i, seqs_[s].blocks});
        row_seq.push_back(s);
      }
    }
    const int q_width = shape_.n_heads * shape_.head_dim;
    EXPECT_EQ(q.size(), rows.size() * q_width) << "bad test case";
    Errors e;
    e.out.assign(rows.size() * q_width, kNaN);
    backend.PagedAttention(q.data(), q_width, rows, kKvLayer, Layout(dtype), cache.data(), shape_,
                           e.out.data());
    WorstError vs_rounded, vs_exact;
    for (size_t r = 0; r < rows.size(); ++r) {
      const KvSequence& s = seqs_[row_seq[r]];
      const float* qr = q.data() + r * q_width;
      const std::vector<double> rounded =
          Reference(qr, s, rows[r].position, [dtype](float v) { return RoundTo(dtype, v); });
      const std::vector<double> exact =
          Reference(qr, s, rows[r].position, [](float v) { return double{v}; });
      vs_rounded.Add(::tandem::testing::RelativeRowError(e.out.data() + r * q_width, rounded));
      vs_exact.Add(::tandem::testing::RelativeRowError(e.out.data() + r * q_width, exact));
    }
    e.vs_rounded = vs_rounded.value;
    e.vs_exact = vs_exact.value;
    return e;
  }

  std::vector<float> RandomQueries(size_t rows) const {
    return RandomFloats(rows * shape_.n_heads * shape_.head_dim, -2.0f, 2.0f, rng_);
  }

 private:
  // Naive float64 attention of one row over K/V mapped through `kv`.
  template <typename Convert>
  std::vector<double> Reference(const float* q, const KvSequence& s, int position,
                                Convert kv) const {
    const int kv_dim = base_.kv_dim;
    return ::tandem::testing::NaiveAttention(
        q, [&](int t, int d) { return double{kv(s.keys[t * kv_dim + d])}; },
        [&](int t, int d) { return double{kv(s.values[t * kv_dim + d])}; }, position, shape_);
  }

  AttentionShape shape_;
  std::mt19937_64& rng_;
  KvLayout base_;
  std::vector<KvSequence> seqs_;
};

// GQA, MQA and MHA; head_dim 64 and 48 (WeightedValues<4> and <3>) and 40
// (the generic loop).
const AttentionShape kKvShapes[] = {{8, 2, 64}, {6, 3, 48}, {4, 1, 48}, {4, 4, 40}};

::testing::Message DescribeKv(const AttentionShape& s, int block_size) {
  return ::testing::Message() << "heads " << s.n_heads << "/" << s.n_kv_heads << " head_dim "
                              << s.head_dim << " block_size " << block_size;
}

// Relative error of 16-bit KV attention against f64 over unrounded K/V and
// against the f32 cache's output.
double Tolerance16(DType dtype) { return dtype == DType::kBF16 ? 1e-2 : 1e-3; }

// WriteKv into f32, bf16 and f16 caches, then PagedAttention for decode
// rows (the row kernel, AttendGroup) and prefill runs of >= 16 rows (the
// tile path, AttendTile), with block sizes 16 (full-block vector scores)
// and 7 (partial blocks everywhere).
TEST_P(HalfPrecisionTest, PagedAttentionOver16BitCacheMatchesF32) {
  const std::vector<int> lengths = {40, 17, 1, 100, 16};
  // (sequence, first position, count)
  const std::vector<std::tuple<int, int, int>> decode = {
      {0, 39, 1}, {1, 16, 1}, {2, 0, 1}, {3, 99, 1}, {4, 15, 1}, {3, 50, 1}, {0, 7, 1}};
  const std::vector<std::tuple<int, int, int>> prefill = {
      {0, 0, 40}, {3, 20, 80}, {4, 0, 16}, {1, 2, 15}};  // the last: 15 rows, row kernel
  for (const AttentionShape& shape : kKvShapes) {
    for (int block_size : {16, 7}) {
      SCOPED_TRACE(DescribeKv(shape, block_size));
      KvCase c(shape, block_size, lengths, rng_);
      std::vector<uint8_t> caches[3];
      const DType dtypes[3] = {DType::kF32, DType::kBF16, DType::kF16};
      for (int i = 0; i < 3; ++i) {
        SCOPED_TRACE(DTypeName(dtypes[i]));
        caches[i] = c.WriteCache(*backend_, dtypes[i]);
        c.ExpectWrittenExactly(dtypes[i], caches[i]);
      }
      for (const auto* runs : {&decode, &prefill}) {
        SCOPED_TRACE(runs == &decode ? "decode rows" : "prefill runs");
        size_t n_rows = 0;
        for (const auto& run : *runs) n_rows += std::get<2>(run);
        const std::vector<float> q = c.RandomQueries(n_rows);
        const KvCase::Errors f32 = c.Attend(*backend_, DType::kF32, caches[0], *runs, q);
        EXPECT_LE(f32.vs_exact, 1e-5);
        for (int i = 1; i < 3; ++i) {
          SCOPED_TRACE(DTypeName(dtypes[i]));
          const KvCase::Errors half = c.Attend(*backend_, dtypes[i], caches[i], *runs, q);
          EXPECT_LE(half.vs_rounded, 1e-5);
          EXPECT_LE(half.vs_exact, Tolerance16(dtypes[i]));
          double diff = 0.0, scale = 0.0;
          for (size_t j = 0; j < f32.out.size(); ++j) {
            const double d = std::abs(double{half.out[j]} - f32.out[j]);
            if (!(d <= diff)) diff = d;
            scale = std::max(scale, std::abs(double{f32.out[j]}));
          }
          EXPECT_LE(diff / scale, Tolerance16(dtypes[i])) << "vs the f32 cache";
        }
      }
    }
  }
}

// WriteKv rounds to nearest, ties to even: values exactly halfway between
// two representable numbers go to the one with an even last bit, values a
// hair above halfway go up (truncation would fail the first and third).
TEST_P(HalfPrecisionTest, WriteKvRoundsToNearestEven) {
  struct Case {
    DType dtype;
    float input;
    double stored;
  };
  const Case cases[] = {
      // bf16 keeps 7 fraction bits: 1 + 2^-8 is halfway between 1 and
      // 1 + 2^-7.
      {DType::kBF16, 1.0f + 0x1p-8f, 1.0},
      {DType::kBF16, 1.0f + 3 * 0x1p-8f, 1.0 + 0x1p-6},
      {DType::kBF16, 1.0f + 0x1p-8f + 0x1p-20f, 1.0 + 0x1p-7},
      {DType::kBF16, -(1.0f + 0x1p-8f), -1.0},
      {DType::kBF16, 0x1.ffp0f, 2.0},  // ties up into the next binade
      // f16 keeps 10: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
      {DType::kF16, 1.0f + 0x1p-11f, 1.0},
      {DType::kF16, 1.0f + 3 * 0x1p-11f, 1.0 + 0x1p-9},
      {DType::kF16, 1.0f + 0x1p-11f + 0x1p-20f, 1.0 + 0x1p-10},
      {DType::kF16, -(1.0f + 3 * 0x1p-11f), -(1.0 + 0x1p-9)},
      // Subnormals (ulp 2^-24): halfway between 0 and 1 ulp goes to 0,
      // halfway between 1 and 2 ulp to 2.
      {DType::kF16, 0x1p-25f, 0.0},
      {DType::kF16, 0x1.8p-24f, 0x1p-23},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << DTypeName(c.dtype) << " " << c.input);
    ASSERT_EQ(RoundTo(c.dtype, c.input), c.stored) << "bad test case";
    KvLayout layout{.n_layers = 2, .num_blocks = 3, .block_size = 4, .kv_dim = 2, .dtype = c.dtype};
    std::vector<uint8_t> cache(layout.total_bytes());
    FillSentinel(c.dtype, cache);
    const std::vector<uint8_t> untouched = cache;
    const std::vector<int32_t> blocks = {2, 0};
    const float k[2] = {c.input, 0.5f}, v[2] = {-0.25f, c.input};
    const AttentionRow row{5, blocks};  // block 0, slot 1
    backend_->WriteKv(k, 2, v, 2, std::span<const AttentionRow>(&row, 1), kKvLayer, layout,
                      cache.data());
    EXPECT_EQ(ElementAt(c.dtype, cache, layout.KeyOffset(kKvLayer, 0, 1, 0)), c.stored);
    EXPECT_EQ(ElementAt(c.dtype, cache, layout.KeyOffset(kKvLayer, 0, 1, 1)), 0.5);
    EXPECT_EQ(ElementAt(c.dtype, cache, layout.ValueOffset(kKvLayer, 0, 1)), -0.25);
    EXPECT_EQ(ElementAt(c.dtype, cache, layout.ValueOffset(kKvLayer, 0, 1) + 1), c.stored);
    const size_t changed[4] = {
        layout.KeyOffset(kKvLayer, 0, 1, 0), layout.KeyOffset(kKvLayer, 0, 1, 1),
        layout.ValueOffset(kKvLayer, 0, 1), layout.ValueOffset(kKvLayer, 0, 1) + 1};
    for (size_t i = 0; i < layout.total_elements(); ++i) {
      if (std::find(std::begin(changed), std::end(changed), i) != std::end(changed)) continue;
      ASSERT_EQ(std::memcmp(&cache[2 * i], &untouched[2 * i], 2), 0) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace tandem
