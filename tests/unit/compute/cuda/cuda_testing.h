// Shared pieces of the CUDA backend tests: the backend or a skip, both
// backends with buffers mirrored on each, 16-bit conversions, paged
// sequences over a shuffled pool, and error measures.
#ifndef TANDEM_TESTS_UNIT_COMPUTE_CUDA_CUDA_TESTING_H_
#define TANDEM_TESTS_UNIT_COMPUTE_CUDA_CUDA_TESTING_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/kvcache/kv_layout.h"
#include "common/model/ggml_types.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/compute/compute_testing.h"

namespace tandem::testing {

// Creates the CUDA backend, or skips the test when no device is present.
#define CREATE_CUDA_OR_SKIP(var)                       \
  auto var##_or = CudaBackend::Create();               \
  if (absl::IsFailedPrecondition(var##_or.status())) { \
    GTEST_SKIP() << var##_or.status().message();       \
  }                                                    \
  ASSERT_OK(var##_or.status());                        \
  std::unique_ptr<CudaBackend> var = std::move(var##_or).value()

// max_i |actual_i - expected_i| / max_i |expected_i|.
inline double ScaledError(std::span<const float> actual, std::span<const float> expected) {
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

// ||actual - expected||_2 / ||expected||_2; infinite when a value is NaN.
template <typename E>
double RelativeL2(std::span<const float> actual, std::span<const E> expected) {
  EXPECT_EQ(actual.size(), expected.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < actual.size() && i < expected.size(); ++i) {
    if (std::isnan(actual[i])) return INFINITY;
    const double d = double{actual[i]} - double(expected[i]);
    diff += d * d;
    norm += double(expected[i]) * double(expected[i]);
  }
  return std::sqrt(diff / (norm > 0.0 ? norm : 1.0));
}
inline double RelativeL2(const std::vector<float>& actual, const std::vector<float>& expected) {
  return RelativeL2<float>(actual, expected);
}

// Values rounded to a 16-bit type, as stored (f32 values as they are).
inline std::vector<uint8_t> Narrowed(std::span<const float> values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &values[i], 4);
      continue;
    }
    const uint16_t h = dtype == DType::kBF16 ? Fp32ToBf16(values[i]) : Fp32ToFp16(values[i]);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
  return bytes;
}

// Each value rounded to `dtype` and back.
inline std::vector<float> RoundTrip(std::span<const float> values, DType dtype) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    out[i] = dtype == DType::kBF16  ? Bf16ToFp32(Fp32ToBf16(values[i]))
             : dtype == DType::kF16 ? Fp16ToFp32(Fp32ToFp16(values[i]))
                                    : values[i];
  }
  return out;
}

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

  // A buffer on each backend holding `bytes`.
  struct Bytes {
    void* cpu;
    void* cuda;
    size_t size;
  };
  Bytes UploadBytes(std::span<const uint8_t> bytes) {
    auto c = cpu_->Allocate(bytes.size());
    auto g = cuda_->Allocate(bytes.size());
    EXPECT_OK(c.status());
    EXPECT_OK(g.status());
    Bytes b{(*c)->data(), (*g)->data(), bytes.size()};
    std::copy(bytes.begin(), bytes.end(), static_cast<uint8_t*>(b.cpu));
    cuda_->CopyToDevice(bytes.data(), b.cuda, bytes.size());
    buffers_.push_back(std::move(c).value());
    buffers_.push_back(std::move(g).value());
    return b;
  }
  std::vector<uint8_t> CpuBytes(const Bytes& b) const {
    const uint8_t* p = static_cast<const uint8_t*>(b.cpu);
    return {p, p + b.size};
  }
  std::vector<uint8_t> CudaBytes(const Bytes& b) {
    std::vector<uint8_t> v(b.size);
    cuda_->CopyToHost(b.cuda, v.data(), v.size());
    EXPECT_OK(cuda_->status());
    return v;
  }

  // A buffer of floats on each backend.
  struct Pair {
    float* cpu;
    float* cuda;
    size_t n;
  };
  Pair Upload(const std::vector<float>& values) {
    const Bytes b = UploadBytes(
        {reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(float)});
    return Pair{static_cast<float*>(b.cpu), static_cast<float*>(b.cuda), values.size()};
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

// Sequences over shuffled blocks of one pool, for WriteKv and attention.
struct Sequences {
  KvLayout layout;
  std::vector<std::vector<int32_t>> blocks;  // per sequence
  std::vector<int> lengths;
};

inline Sequences MakeSequences(const std::vector<int>& lengths, int kv_dim, std::mt19937_64& rng,
                               DType dtype = DType::kF32, int block_size = 16) {
  Sequences s;
  s.layout.n_layers = 2;
  s.layout.block_size = block_size;
  s.layout.kv_dim = kv_dim;
  s.layout.dtype = dtype;
  s.lengths = lengths;
  int total = 0;
  for (int len : lengths) total += static_cast<int>(BlocksFor(len, block_size));
  s.layout.num_blocks = total + 3;
  std::vector<int32_t> ids(s.layout.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  int at = 0;
  for (int len : lengths) {
    const int n = static_cast<int>(BlocksFor(len, block_size));
    s.blocks.emplace_back(ids.begin() + at, ids.begin() + at + n);
    at += n;
  }
  return s;
}

// The rows WriteKv tests write for MakeSequences({21, 38, 6}, ...): a
// prefill chunk of sequence 0 (positions 0-20), then decode rows of
// sequence 1 at 37 and sequence 2 at 5.
inline std::vector<AttentionRow> WriteKvRows(const Sequences& seqs) {
  std::vector<AttentionRow> rows;
  for (int p = 0; p < 21; ++p) rows.push_back({p, seqs.blocks[0]});
  rows.push_back({37, seqs.blocks[1]});
  rows.push_back({5, seqs.blocks[2]});
  return rows;
}

// RandomCache for an int8 layout: random bytes in [-127, 127] and scales in
// [0.002, 0.02], but NaN scales for the slots past each sequence's end.
inline std::vector<uint8_t> RandomInt8Cache(const Sequences& seqs, std::mt19937_64& rng) {
  const KvLayout& layout = seqs.layout;
  std::vector<uint8_t> cache(layout.total_bytes());
  std::uniform_int_distribution<int> byte(-127, 127);
  for (uint8_t& b : cache) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.002f, 0.02f);
  auto put = [&](size_t offset, float value) {
    std::memcpy(cache.data() + offset, &value, sizeof value);
  };
  for (int layer = 0; layer < layout.n_layers; ++layer) {
    for (int32_t block = 0; block < layout.num_blocks; ++block) {
      for (int head = 0; head < layout.kv_heads; ++head) {
        for (int slot = 0; slot < layout.block_size; ++slot) {
          put(layout.KeyScaleOffset(layer, block, head) + slot * sizeof(float), scale(rng));
          put(layout.ValueScaleOffset(layer, block, head) + slot * sizeof(float), scale(rng));
        }
      }
    }
  }
  for (size_t s = 0; s < seqs.lengths.size(); ++s) {
    for (int layer = 0; layer < layout.n_layers; ++layer) {
      for (int p = seqs.lengths[s]; p % layout.block_size != 0; ++p) {
        const int32_t block = seqs.blocks[s][p / layout.block_size];
        const int slot = p % layout.block_size;
        for (int head = 0; head < layout.kv_heads; ++head) {
          put(layout.KeyScaleOffset(layer, block, head) + slot * sizeof(float), kNaN);
          put(layout.ValueScaleOffset(layer, block, head) + slot * sizeof(float), kNaN);
        }
      }
    }
  }
  return cache;
}

// A random cache for `seqs` (values in [-1, 1], in the layout's type) whose
// slots past each sequence's end hold NaN, so that reading them shows.
inline std::vector<uint8_t> RandomCache(const Sequences& seqs, std::mt19937_64& rng) {
  const KvLayout& layout = seqs.layout;
  if (layout.dtype == DType::kI8) return RandomInt8Cache(seqs, rng);
  std::vector<float> cache = RandomFloats(layout.total_elements(), -1, 1, rng);
  for (size_t s = 0; s < seqs.lengths.size(); ++s) {
    for (int layer = 0; layer < layout.n_layers; ++layer) {
      for (int p = seqs.lengths[s]; p % layout.block_size != 0; ++p) {
        const int32_t block = seqs.blocks[s][p / layout.block_size];
        const int slot = p % layout.block_size;
        for (int d = 0; d < layout.kv_dim; ++d) {
          cache[layout.KeyOffset(layer, block, slot, d)] = kNaN;
          cache[layout.ValueOffset(layer, block, slot) + d] = kNaN;
        }
      }
    }
  }
  return Narrowed(cache, layout.dtype);
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UNIT_COMPUTE_CUDA_CUDA_TESTING_H_
