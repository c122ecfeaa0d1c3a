// The CUDA backend against the CPU backend (the numerical reference), op by
// op on fresh random inputs, and a whole engine on a synthetic GQA model.
// Outputs are poisoned (NaN) before each call so that an element the CUDA
// backend fails to write shows up. Every test skips with "no CUDA device"
// on machines without one (cuda_create_test.cc runs there instead).
#include "common/compute/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/engine/sampler.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/compute/compute_testing.h"

namespace tandem {
namespace {

using ::tandem::testing::kNaN;
using ::tandem::testing::RandomFloats;
using ::tandem::testing::WorstError;

constexpr double kTolerance = 1e-4;

// max_i |actual_i - expected_i| / max_i |expected_i|.
double ScaledError(std::span<const float> actual, std::span<const float> expected) {
  EXPECT_EQ(actual.size(), expected.size());
  double scale = 0.0;
  for (float e : expected) scale = std::max(scale, std::abs(double{e}));
  if (scale == 0.0) scale = 1.0;
  WorstError worst;
  for (size_t i = 0; i < actual.size() && i < expected.size(); ++i) {
    worst.Add(std::abs(double{actual[i]} - expected[i]) / scale);
  }
  return worst.value;
}

// Creates the CUDA backend, or skips the test when no device is present.
#define CREATE_CUDA_OR_SKIP(var)                       \
  auto var##_or = CudaBackend::Create();               \
  if (absl::IsFailedPrecondition(var##_or.status())) { \
    GTEST_SKIP() << var##_or.status().message();       \
  }                                                    \
  ASSERT_OK(var##_or.status());                        \
  std::unique_ptr<CudaBackend> var = std::move(var##_or).value()

// Both backends, and buffers mirrored on each.
class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    CREATE_CUDA_OR_SKIP(cuda);
    cuda_ = std::move(cuda);
    ASSERT_OK_AND_ASSIGN(cpu_, CpuBackend::Create());
  }
  void TearDown() override {
    if (cuda_ != nullptr) {
      EXPECT_OK(cuda_->Synchronize());
    }
  }

  // A buffer on each backend holding `values`.
  struct Pair {
    float* cpu;
    float* cuda;
    size_t n;
  };
  Pair Upload(const std::vector<float>& values) {
    auto c = cpu_->Allocate(values.size() * sizeof(float));
    auto g = cuda_->Allocate(values.size() * sizeof(float));
    EXPECT_OK(c.status());
    EXPECT_OK(g.status());
    Pair p{(*c)->floats(), (*g)->floats(), values.size()};
    std::copy(values.begin(), values.end(), p.cpu);
    cuda_->CopyToDevice(values.data(), p.cuda, values.size() * sizeof(float));
    buffers_.push_back(std::move(c).value());
    buffers_.push_back(std::move(g).value());
    return p;
  }
  Pair Poisoned(size_t n) { return Upload(std::vector<float>(n, kNaN)); }
  std::vector<float> Cpu(const Pair& p) const { return {p.cpu, p.cpu + p.n}; }
  std::vector<float> Cuda(const Pair& p) {
    std::vector<float> v(p.n);
    cuda_->CopyToHost(p.cuda, v.data(), v.size() * sizeof(float));
    EXPECT_OK(cuda_->status());
    return v;
  }

  std::unique_ptr<CudaBackend> cuda_;
  std::unique_ptr<CpuBackend> cpu_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  std::mt19937_64 rng_{20261122};
};

// Error per element relative to |out_before| + sum_k |x_k w_k|, the bound a
// float dot product obeys whatever the summation order.
TEST_F(CudaVsCpu, MatMul) {
  struct Case {
    int m, n, k;
  };
  for (const Case& c : {Case{1, 64, 48}, Case{1, 300, 257}, Case{7, 33, 65}, Case{64, 256, 128},
                        Case{130, 96, 512}}) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "m=" << c.m << " n=" << c.n << " k=" << c.k << " accumulate=" << accumulate);
      const std::vector<float> x = RandomFloats(size_t(c.m) * c.k, -1, 1, rng_);
      const std::vector<float> w = RandomFloats(size_t(c.n) * c.k, -1, 1, rng_);
      const std::vector<float> before = accumulate ? RandomFloats(size_t(c.m) * c.n, -2, 2, rng_)
                                                   : std::vector<float>(size_t(c.m) * c.n, kNaN);
      Pair px = Upload(x), pw = Upload(w), out = Upload(before);
      cpu_->MatMul(px.cpu, pw.cpu, out.cpu, c.m, c.n, c.k, accumulate);
      cuda_->MatMul(px.cuda, pw.cuda, out.cuda, c.m, c.n, c.k, accumulate);
      const std::vector<float> expected = Cpu(out), actual = Cuda(out);
      WorstError worst;
      for (int i = 0; i < c.m; ++i) {
        for (int j = 0; j < c.n; ++j) {
          double bound = accumulate ? std::abs(before[size_t(i) * c.n + j]) : 0.0;
          for (int t = 0; t < c.k; ++t) {
            bound += std::abs(double{x[size_t(i) * c.k + t]} * w[size_t(j) * c.k + t]);
          }
          const size_t at = size_t(i) * c.n + j;
          worst.Add(std::abs(double{actual[at]} - expected[at]) / bound);
        }
      }
      EXPECT_LE(worst.value, kTolerance);
    }
  }
}

TEST_F(CudaVsCpu, Embed) {
  constexpr int kVocab = 50, kDim = 67;
  Pair table = Upload(RandomFloats(size_t(kVocab) * kDim, -1, 1, rng_));
  std::vector<int32_t> ids(13);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng_() % kVocab);
  Pair out = Poisoned(ids.size() * kDim);
  cpu_->Embed(table.cpu, ids, kDim, out.cpu);
  cuda_->Embed(table.cuda, ids, kDim, out.cuda);
  EXPECT_EQ(ScaledError(Cuda(out), Cpu(out)), 0.0);
}

TEST_F(CudaVsCpu, RmsNorm) {
  for (int dim : {8, 64, 300, 4096}) {
    SCOPED_TRACE(dim);
    constexpr int kRows = 5;
    Pair x = Upload(RandomFloats(size_t(kRows) * dim, -3, 3, rng_));
    Pair w = Upload(RandomFloats(dim, 0.5, 1.5, rng_));
    Pair out = Poisoned(size_t(kRows) * dim);
    cpu_->RmsNorm(x.cpu, w.cpu, out.cpu, kRows, dim, 1e-5f);
    cuda_->RmsNorm(x.cuda, w.cuda, out.cuda, kRows, dim, 1e-5f);
    EXPECT_LE(ScaledError(Cuda(out), Cpu(out)), kTolerance);
  }
}

TEST_F(CudaVsCpu, Rope) {
  const AttentionShape shape{8, 2, 64};
  constexpr int kRows = 9, kMaxPosition = 100;
  const int half = shape.head_dim / 2;
  std::vector<float> cos_sin(size_t(kMaxPosition) * half * 2);
  for (int p = 0; p < kMaxPosition; ++p) {
    for (int i = 0; i < half; ++i) {
      const double angle = p * std::pow(10000.0, -2.0 * i / shape.head_dim);
      cos_sin[(size_t(p) * half + i) * 2] = static_cast<float>(std::cos(angle));
      cos_sin[(size_t(p) * half + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }
  // q and k inside one qkv row, as the engine lays them out.
  const int stride = (shape.n_heads + 2 * shape.n_kv_heads) * shape.head_dim;
  Pair table = Upload(cos_sin);
  Pair qkv = Upload(RandomFloats(size_t(kRows) * stride, -1, 1, rng_));
  std::vector<int32_t> positions(kRows);
  for (int32_t& p : positions) p = static_cast<int32_t>(rng_() % kMaxPosition);
  const int k_at = shape.n_heads * shape.head_dim;
  cpu_->Rope(qkv.cpu, stride, qkv.cpu + k_at, stride, positions, shape, table.cpu);
  cuda_->Rope(qkv.cuda, stride, qkv.cuda + k_at, stride, positions, shape, table.cuda);
  EXPECT_LE(ScaledError(Cuda(qkv), Cpu(qkv)), kTolerance);
}

TEST_F(CudaVsCpu, SwiGlu) {
  constexpr int kRows = 7, kHidden = 133;
  Pair gate_up = Upload(RandomFloats(size_t(kRows) * 2 * kHidden, -6, 6, rng_));
  Pair out = Poisoned(size_t(kRows) * kHidden);
  cpu_->SwiGlu(gate_up.cpu, out.cpu, kRows, kHidden);
  cuda_->SwiGlu(gate_up.cuda, out.cuda, kRows, kHidden);
  EXPECT_LE(ScaledError(Cuda(out), Cpu(out)), kTolerance);
}

// Sequences over shuffled blocks of one pool, for WriteKv and attention.
struct Sequences {
  KvLayout layout;
  std::vector<std::vector<int32_t>> blocks;  // per sequence
  std::vector<int> lengths;
};

Sequences MakeSequences(const std::vector<int>& lengths, int kv_dim, std::mt19937_64& rng) {
  Sequences s;
  s.layout.n_layers = 2;
  s.layout.block_size = 16;
  s.layout.kv_dim = kv_dim;
  s.lengths = lengths;
  int total = 0;
  for (int len : lengths) total += (len + 15) / 16;
  s.layout.num_blocks = total + 3;
  std::vector<int32_t> ids(s.layout.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  int at = 0;
  for (int len : lengths) {
    const int n = (len + 15) / 16;
    s.blocks.emplace_back(ids.begin() + at, ids.begin() + at + n);
    at += n;
  }
  return s;
}

TEST_F(CudaVsCpu, WriteKv) {
  const int kv_dim = 128;
  Sequences seqs = MakeSequences({21, 38, 6}, kv_dim, rng_);
  // A prefill chunk of sequence 0, decode rows of 1 and 2.
  std::vector<AttentionRow> rows;
  for (int p = 0; p < 21; ++p) rows.push_back({p, seqs.blocks[0]});
  rows.push_back({37, seqs.blocks[1]});
  rows.push_back({5, seqs.blocks[2]});
  const int stride = 3 * kv_dim + 5;
  Pair kv = Upload(RandomFloats(rows.size() * stride, -1, 1, rng_));
  Pair cache = Upload(RandomFloats(seqs.layout.total_elements(), -1, 1, rng_));
  for (int layer : {0, 1}) {
    cpu_->WriteKv(kv.cpu, stride, kv.cpu + kv_dim + 2, stride, rows, layer, seqs.layout, cache.cpu);
    cuda_->WriteKv(kv.cuda, stride, kv.cuda + kv_dim + 2, stride, rows, layer, seqs.layout,
                   cache.cuda);
  }
  EXPECT_EQ(Cuda(cache), Cpu(cache));
}

struct Query {
  int seq;
  int position;
};

class CudaAttention : public CudaVsCpu, public ::testing::WithParamInterface<AttentionShape> {
 protected:
  // Attention of `queries` over `lengths`-long sequences (layer 1 of 2),
  // CUDA against CPU.
  void Check(const std::vector<int>& lengths, const std::vector<Query>& queries) {
    const AttentionShape shape = GetParam();
    const int kv_dim = shape.n_kv_heads * shape.head_dim;
    Sequences seqs = MakeSequences(lengths, kv_dim, rng_);
    const KvLayout& layout = seqs.layout;
    std::vector<float> cache = RandomFloats(layout.total_elements(), -1, 1, rng_);
    // Slots past each sequence's end are NaN: reading them shows.
    for (size_t s = 0; s < lengths.size(); ++s) {
      for (int layer = 0; layer < layout.n_layers; ++layer) {
        for (int p = lengths[s]; p % layout.block_size != 0; ++p) {
          const int32_t block = seqs.blocks[s][p / layout.block_size];
          const int slot = p % layout.block_size;
          for (int d = 0; d < kv_dim; ++d) {
            cache[layout.KeyOffset(layer, block, slot, d)] = kNaN;
            cache[layout.ValueOffset(layer, block, slot) + d] = kNaN;
          }
        }
      }
    }
    std::vector<AttentionRow> rows;
    for (const Query& q : queries) rows.push_back({q.position, seqs.blocks[q.seq]});
    const int q_stride = (shape.n_heads + 2 * shape.n_kv_heads) * shape.head_dim + 3;
    Pair q = Upload(RandomFloats(rows.size() * q_stride, -2, 2, rng_));
    Pair kv = Upload(cache);
    Pair out = Poisoned(rows.size() * shape.n_heads * shape.head_dim);
    cpu_->PagedAttention(q.cpu, q_stride, rows, 1, layout, kv.cpu, shape, out.cpu);
    cuda_->PagedAttention(q.cuda, q_stride, rows, 1, layout, kv.cuda, shape, out.cuda);
    EXPECT_LE(ScaledError(Cuda(out), Cpu(out)), kTolerance);
  }
};

TEST_P(CudaAttention, DecodeRowAtContextEdges) {
  for (int len : {1, 15, 16, 17, 4095}) {
    SCOPED_TRACE(::testing::Message() << "context " << len);
    Check({len}, {{0, len - 1}});
  }
}

// Every position of short sequences, and the last 300 positions of a long
// one (the CPU backend's matrix-product path; on the GPU, enough rows that
// the context is not split, except for the single-KV-head shape).
TEST_P(CudaAttention, PrefillRowsAreCausal) {
  for (int len : {1, 15, 16, 17, 40}) {
    SCOPED_TRACE(::testing::Message() << "prefill " << len);
    std::vector<Query> queries;
    for (int p = 0; p < len; ++p) queries.push_back({0, p});
    Check({len}, queries);
  }
  std::vector<Query> queries;
  for (int p = 4095 - 300; p < 4095; ++p) queries.push_back({0, p});
  Check({4095}, queries);
}

TEST_P(CudaAttention, BatchMixesShortAndLongSequences) {
  const std::vector<int> lengths = {1, 4095, 2, 700, 17, 3000, 16};
  std::vector<Query> queries;
  for (int s : {0, 1, 2}) queries.push_back({s, lengths[s] - 1});
  for (int p = 600; p < 700; ++p) queries.push_back({3, p});  // a prefill chunk
  for (int s : {4, 5, 6}) queries.push_back({s, lengths[s] - 1});
  Check(lengths, queries);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Values(AttentionShape{8, 2, 64}, AttentionShape{32, 8, 128},
                                           AttentionShape{4, 4, 8}, AttentionShape{16, 1, 256},
                                           AttentionShape{6, 2, 40}),
                         [](const auto& info) {
                           return absl::StrCat("h", info.param.n_heads, "_kv",
                                               info.param.n_kv_heads, "_d", info.param.head_dim);
                         });

// An error is kept and later operations are skipped.
TEST_F(CudaVsCpu, FirstErrorIsSticky) {
  ASSERT_OK(cuda_->status());
  const AttentionShape too_wide{2, 1, 512};
  Sequences seqs = MakeSequences({3}, 512, rng_);
  const std::vector<AttentionRow> rows = {{2, seqs.blocks[0]}};
  Pair q = Poisoned(1024), cache = Poisoned(seqs.layout.total_elements()), out = Poisoned(1024);
  cuda_->PagedAttention(q.cuda, 1024, rows, 0, seqs.layout, cache.cuda, too_wide, out.cuda);
  EXPECT_EQ(cuda_->status().code(), absl::StatusCode::kUnimplemented);
  cuda_->SwiGlu(q.cuda, out.cuda, 1, 8);
  EXPECT_EQ(cuda_->status().code(), absl::StatusCode::kUnimplemented);
  cuda_.reset();  // TearDown would expect OK
}

ModelConfig GqaShape(int dim, int hidden, int layers, int heads, int kv_heads, int vocab) {
  return ModelConfig{.dim = dim,
                     .hidden_dim = hidden,
                     .n_layers = layers,
                     .n_heads = heads,
                     .n_kv_heads = kv_heads,
                     .vocab_size = vocab,
                     .seq_len = 160,
                     .shared_classifier = false};
}

class CudaEngine : public ::testing::TestWithParam<ModelConfig> {};

// Prefill logits, then 100 greedy steps on each engine: logits within 1e-4
// of the scale of the CPU engine's, tokens identical.
TEST_P(CudaEngine, MatchesCpuEngine) {
  CREATE_CUDA_OR_SKIP(cuda);
  CudaBackend* cuda_backend = cuda.get();
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(GetParam(), 7));
  ASSERT_OK_AND_ASSIGN(auto cpu, CpuBackend::Create());
  EngineOptions options;
  options.num_blocks = 32;
  ASSERT_OK_AND_ASSIGN(auto on_cpu, Engine::Create(*weights, std::move(cpu), options));
  ASSERT_OK_AND_ASSIGN(auto on_cuda, Engine::Create(*weights, std::move(cuda), options));
  ASSERT_OK(cuda_backend->status());

  std::mt19937_64 rng(11);
  const int vocab = GetParam().vocab_size;
  std::vector<int32_t> prompt(20);
  for (int32_t& id : prompt) id = static_cast<int32_t>(rng() % vocab);
  BlockTable cpu_table = on_cpu->NewSequence(), cuda_table = on_cuda->NewSequence();
  std::vector<int32_t> cpu_in = prompt, cuda_in = prompt;
  std::vector<int32_t> cpu_tokens, cuda_tokens;
  WorstError worst;
  for (int step = 0; step <= 100; ++step) {
    const BatchItem cpu_item{&cpu_table, cpu_in, true}, cuda_item{&cuda_table, cuda_in, true};
    ASSERT_OK_AND_ASSIGN(std::vector<float> expected, on_cpu->Step({&cpu_item, 1}));
    ASSERT_OK_AND_ASSIGN(std::vector<float> actual, on_cuda->Step({&cuda_item, 1}));
    ASSERT_OK(cuda_backend->status()) << "step " << step;
    worst.Add(ScaledError(actual, expected));
    if (step == 100) break;
    cpu_tokens.push_back(Argmax(expected));
    cuda_tokens.push_back(Argmax(actual));
    cpu_in = {cpu_tokens.back()};
    cuda_in = {cuda_tokens.back()};
  }
  EXPECT_LE(worst.value, kTolerance);
  EXPECT_EQ(cuda_tokens, cpu_tokens);
  on_cpu->Release(cpu_table);
  on_cuda->Release(cuda_table);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaEngine,
                         ::testing::Values(GqaShape(64, 96, 3, 8, 2, 101),
                                           GqaShape(256, 512, 2, 4, 2, 300),
                                           GqaShape(512, 1024, 2, 8, 2, 512)),
                         [](const auto& info) {
                           return absl::StrCat("dim", info.param.dim, "_h", info.param.n_heads,
                                               "_kv", info.param.n_kv_heads);
                         });

}  // namespace
}  // namespace tandem
