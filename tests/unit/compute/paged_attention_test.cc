// CpuBackend::PagedAttention against a naive float64 attention over each
// sequence's logical (unpaged) keys and values.
//
// Batches mix the two paths of the backend: runs of >= 16 rows of one
// sequence at consecutive positions (a prefill chunk) go through matrix
// products (AttendTile), other rows through the row kernel (AttendGroup).
// Block tables are shuffled, non-contiguous block ids. Every cache float not
// holding a written position of the attended layer is NaN, as is the output
// before the call, so reading past a row's context, the wrong layer or the
// wrong block, or leaving an output unwritten, cannot pass.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::kNaN;
constexpr int kLayer = 1;  // of two: offsets must include the layer

// `count` rows of sequence `seq` at positions first, first + 1, ...
struct Segment {
  int seq;
  int first;
  int count;
};

struct Sequence {
  int length;                 // positions [0, length) hold K/V
  std::vector<float> keys;    // logical [length][kv_dim]
  std::vector<float> values;  // logical [length][kv_dim]
  std::vector<int32_t> blocks;
};

class AttentionCase {
 public:
  AttentionCase(const AttentionShape& shape, int block_size, const std::vector<int>& lengths,
                std::mt19937_64& rng, float q_scale = 2.0f)
      : shape_(shape), rng_(rng), q_scale_(q_scale) {
    layout_.n_layers = 2;
    layout_.block_size = block_size;
    layout_.kv_dim = shape.n_kv_heads * shape.head_dim;
    int needed = 0;
    for (int len : lengths) needed += (len + block_size - 1) / block_size + 1;
    layout_.num_blocks = needed + 3;  // a few never used
    std::vector<int32_t> ids(layout_.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    cache_.assign(layout_.total_elements(), kNaN);

    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    size_t next_id = 0;
    for (int len : lengths) {
      Sequence s;
      s.length = len;
      // Some tables hold a spare block past the context, as after Reserve.
      const int n_blocks = (len + block_size - 1) / block_size + static_cast<int>(rng_() % 2);
      s.blocks.assign(ids.begin() + next_id, ids.begin() + next_id + n_blocks);
      next_id += n_blocks;
      s.keys.resize(size_t(len) * layout_.kv_dim);
      s.values.resize(s.keys.size());
      for (float& f : s.keys) f = dist(rng_);
      for (float& f : s.values) f = dist(rng_);
      for (int t = 0; t < len; ++t) {
        const int32_t block = s.blocks[t / block_size];
        for (int d = 0; d < layout_.kv_dim; ++d) {
          cache_[layout_.KeyOffset(kLayer, block, t % block_size, d)] =
              s.keys[size_t(t) * layout_.kv_dim + d];
        }
        std::copy_n(s.values.begin() + size_t(t) * layout_.kv_dim, layout_.kv_dim,
                    cache_.begin() + layout_.ValueOffset(kLayer, block, t % block_size));
      }
      seqs_.push_back(std::move(s));
    }
  }

  // Runs PagedAttention on the rows of `segments`, in order, and returns the
  // largest per-row error |out - exact|_max / |exact|_max.
  double Run(CpuBackend& backend, const std::vector<Segment>& segments) {
    std::vector<AttentionRow> rows;
    std::vector<int> row_seq;
    for (const Segment& segment : segments) {
      const Sequence& s = seqs_[segment.seq];
      EXPECT_LE(segment.first + segment.count, s.length) << "bad test case";
      for (int i = 0; i < segment.count; ++i) {
        rows.push_back({segment.first + i, s.blocks});
        row_seq.push_back(segment.seq);
      }
    }
    // Queries sit in a fused [rows, q | k | v] buffer, so q_stride > width.
    const int q_width = shape_.n_heads * shape_.head_dim;
    const int q_stride = q_width + 2 * layout_.kv_dim;
    std::uniform_real_distribution<float> dist(-q_scale_, q_scale_);
    std::vector<float> q(rows.size() * q_stride);
    for (float& f : q) f = dist(rng_);
    std::vector<float> out(rows.size() * q_width, kNaN);

    backend.PagedAttention(q.data(), q_stride, rows, kLayer, layout_, cache_.data(), shape_,
                           out.data());

    double worst = 0.0;
    worst_row_ = -1;
    const int group = shape_.n_heads / shape_.n_kv_heads;
    const int hd = shape_.head_dim;
    std::vector<double> exact(q_width), scores;
    for (size_t r = 0; r < rows.size(); ++r) {
      const Sequence& s = seqs_[row_seq[r]];
      const int ctx = rows[r].position + 1;
      std::fill(exact.begin(), exact.end(), 0.0);
      for (int h = 0; h < shape_.n_heads; ++h) {
        const float* qh = q.data() + r * q_stride + h * hd;
        const size_t kv_off = size_t(h / group) * hd;
        scores.assign(ctx, 0.0);
        for (int t = 0; t < ctx; ++t) {
          const float* key = s.keys.data() + size_t(t) * layout_.kv_dim + kv_off;
          for (int i = 0; i < hd; ++i) scores[t] += double{qh[i]} * key[i];
          scores[t] /= std::sqrt(double(hd));
        }
        const double max = *std::max_element(scores.begin(), scores.end());
        double sum = 0.0;
        for (double& x : scores) sum += (x = std::exp(x - max));
        for (int t = 0; t < ctx; ++t) {
          const float* value = s.values.data() + size_t(t) * layout_.kv_dim + kv_off;
          for (int i = 0; i < hd; ++i) exact[h * hd + i] += scores[t] / sum * value[i];
        }
      }
      double max_diff = 0.0, scale = 0.0;
      for (int i = 0; i < q_width; ++i) {
        const double diff = std::abs(out[r * q_width + i] - exact[i]);
        if (!(diff <= max_diff)) max_diff = diff;  // NaN wins
        scale = std::max(scale, std::abs(exact[i]));
      }
      const double error = max_diff / scale;
      if (!(error <= worst)) {
        worst = error;
        worst_row_ = static_cast<int>(r);
      }
    }
    return worst;
  }

  int worst_row() const { return worst_row_; }

 private:
  AttentionShape shape_;
  std::mt19937_64& rng_;
  float q_scale_;
  KvLayout layout_;
  std::vector<float> cache_;
  std::vector<Sequence> seqs_;
  int worst_row_ = -1;
};

// Parameter: the backend's thread count; 0 is every core, 3 and 7 split the
// work unevenly (and oversubscribe small machines, which is harmless here).
class PagedAttentionTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(backend_, CpuBackend::Create({.num_threads = GetParam()}));
  }

  std::unique_ptr<CpuBackend> backend_;
  std::mt19937_64 rng_{31337};
};

// MHA, GQA, MQA; head dims 8, 48, 64.
const AttentionShape kShapes[] = {{4, 4, 8}, {8, 2, 48}, {4, 1, 64}, {6, 3, 64}};

::testing::Message Describe(const AttentionShape& s, int block_size) {
  return ::testing::Message() << "heads " << s.n_heads << "/" << s.n_kv_heads << " head_dim "
                              << s.head_dim << " block_size " << block_size;
}

// One fixed batch covering the boundaries: contexts 1, 15, 16, 17, 100, 300;
// runs of 15 (row kernel), 16 (tiles) and 300 (several 64-row tiles); runs
// that start mid-sequence, so the causal mask must hide written later
// positions; and neighbouring rows of different sequences whose positions
// happen to continue each other, which must not be taken for one run.
TEST_P(PagedAttentionTest, MixedBatchMatchesNaive) {
  const std::vector<int> lengths = {300, 1, 15, 16, 17, 100, 20, 40, 33};
  const std::vector<Segment> segments = {
      {1, 0, 1},  {0, 0, 300}, {2, 14, 1},  {3, 0, 16}, {4, 2, 15}, {5, 99, 1},
      {6, 19, 1}, {7, 20, 20}, {5, 40, 30}, {8, 10, 5}, {4, 16, 1}, {8, 32, 1},
  };
  for (const AttentionShape& shape : kShapes) {
    for (int block_size : {16, 7}) {
      SCOPED_TRACE(Describe(shape, block_size));
      AttentionCase c(shape, block_size, lengths, rng_);
      EXPECT_LE(c.Run(*backend_, segments), 1e-5) << "worst row " << c.worst_row();
    }
  }
}

// Decode-only and prefill-only batches: all rows through one path.
TEST_P(PagedAttentionTest, SinglePathBatchesMatchNaive) {
  const std::vector<int> lengths = {1, 15, 16, 17, 100, 300};
  std::vector<Segment> decode, prefill;
  for (int s = 0; s < static_cast<int>(lengths.size()); ++s) {
    decode.push_back({s, lengths[s] - 1, 1});
    if (lengths[s] >= 16) prefill.push_back({s, 0, lengths[s]});
  }
  for (const AttentionShape& shape : kShapes) {
    SCOPED_TRACE(Describe(shape, 16));
    AttentionCase c(shape, 16, lengths, rng_);
    EXPECT_LE(c.Run(*backend_, decode), 1e-5) << "decode, worst row " << c.worst_row();
    EXPECT_LE(c.Run(*backend_, prefill), 1e-5) << "prefill, worst row " << c.worst_row();
  }
}

// Random sequences, block sizes (1: every position its own block) and
// segments (decode rows, whole prompts, chunks) in random order.
TEST_P(PagedAttentionTest, RandomBatchesMatchNaive) {
  for (int trial = 0; trial < 12; ++trial) {
    const AttentionShape& shape = kShapes[rng_() % std::size(kShapes)];
    const int block_sizes[] = {1, 3, 16, 32};
    const int block_size = block_sizes[rng_() % std::size(block_sizes)];
    std::vector<int> lengths;
    std::vector<Segment> segments;
    const int n_seqs = 1 + static_cast<int>(rng_() % 6);
    for (int s = 0; s < n_seqs; ++s) {
      const int len = 1 + static_cast<int>(rng_() % 300);
      lengths.push_back(len);
      const int first = static_cast<int>(rng_() % len);
      switch (rng_() % 3) {
        case 0:
          segments.push_back({s, len - 1, 1});
          break;
        case 1:
          segments.push_back({s, 0, len});
          break;
        default:
          segments.push_back({s, first, 1 + static_cast<int>(rng_() % (len - first))});
      }
    }
    std::shuffle(segments.begin(), segments.end(), rng_);
    SCOPED_TRACE(Describe(shape, block_size) << " trial " << trial);
    AttentionCase c(shape, block_size, lengths, rng_);
    EXPECT_LE(c.Run(*backend_, segments), 1e-5) << "worst row " << c.worst_row();
  }
}

// Scores of several hundred, far beyond float's exp range: softmax must
// subtract the row maximum. The tolerance is looser because float rounding
// of such scores alone shifts the softmax weights by a few 1e-5 relative.
TEST_P(PagedAttentionTest, LargeScoresStayFinite) {
  const std::vector<int> lengths = {300, 40};
  const std::vector<Segment> segments = {{1, 39, 1}, {0, 0, 300}, {1, 10, 5}};
  for (const AttentionShape& shape : kShapes) {
    SCOPED_TRACE(Describe(shape, 16));
    AttentionCase c(shape, 16, lengths, rng_, /*q_scale=*/300.0f);
    EXPECT_LE(c.Run(*backend_, segments), 1e-4) << "worst row " << c.worst_row();
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, PagedAttentionTest, ::testing::Values(0, 3, 7),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "threads" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace tandem
