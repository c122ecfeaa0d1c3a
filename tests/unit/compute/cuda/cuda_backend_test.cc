// The CUDA backend's operations against the CPU backend (the numerical
// reference), op by op on fresh random inputs, with f32 and 16-bit weights
// and KV; attention is in cuda_attention_test.cc, whole engines in
// cuda_engine_test.cc. Outputs are poisoned (NaN) before each call so that
// an element the CUDA backend fails to write shows up. Every test skips with
// "no CUDA device" on machines without one (cuda_create_test.cc runs there
// instead).
#include "common/compute/cuda/cuda_backend.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/compute/compute_testing.h"
#include "tests/unit/compute/cuda/cuda_testing.h"

namespace tandem {
namespace {

using ::tandem::testing::kNaN;
using ::tandem::testing::RandomFloats;
using ::tandem::testing::WorstError;

using ::tandem::testing::CudaVsCpu;
using ::tandem::testing::kNaN;
using ::tandem::testing::MakeSequences;
using ::tandem::testing::Narrowed;
using ::tandem::testing::RandomFloats;
using ::tandem::testing::RelativeL2;
using ::tandem::testing::RoundTrip;
using ::tandem::testing::ScaledError;
using ::tandem::testing::Sequences;
using ::tandem::testing::WorstError;
using ::tandem::testing::WriteKvRows;
using ::testing::HasSubstr;

constexpr double kTolerance = 1e-4;

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

// The q/k norms over heads of a qkv row, in place: per head (Qwen3) and over
// a whole projection (heads = 1).
TEST_F(CudaVsCpu, RmsNormHeads) {
  const struct {
    int heads, head_dim, stride;
  } cases[] = {{16, 128, 4096}, {8, 64, 1024}, {1, 2048, 4096}, {4, 32, 200}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "heads=" << c.heads << " head_dim=" << c.head_dim);
    constexpr int kRows = 7;
    Pair x = Upload(RandomFloats(size_t(kRows) * c.stride, -3, 3, rng_));
    Pair w = Upload(RandomFloats(c.head_dim, 0.5, 1.5, rng_));
    cpu_->RmsNormHeads(x.cpu, c.stride, w.cpu, kRows, c.heads, c.head_dim, 1e-6f);
    cuda_->RmsNormHeads(x.cuda, c.stride, w.cuda, kRows, c.heads, c.head_dim, 1e-6f);
    EXPECT_LE(ScaledError(Cuda(x), Cpu(x)), kTolerance);
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

TEST_F(CudaVsCpu, WriteKv) {
  const int kv_dim = 128;
  Sequences seqs = MakeSequences({21, 38, 6}, kv_dim, rng_);
  const std::vector<AttentionRow> rows = WriteKvRows(seqs);
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

// An int8 cache: the same bytes and scales as the CPU backend's (int8_kv.h's
// rounding on both), including a head of zeros (scale 0), a head holding an
// infinity and one holding a NaN (NaN scale, zero bytes).
TEST_F(CudaVsCpu, WriteKvInt8) {
  const int kv_heads = 3, head_dim = 40, kv_dim = kv_heads * head_dim;
  for (int block_size : {16, 7}) {
    Sequences seqs = MakeSequences({21, 38, 6}, kv_dim, rng_, DType::kI8, block_size);
    seqs.layout.kv_heads = kv_heads;
    const std::vector<AttentionRow> rows = WriteKvRows(seqs);
    const int stride = 3 * kv_dim + 5;
    std::vector<float> kv = RandomFloats(rows.size() * stride, -3, 3, rng_);
    // Row 4, key head 0: largest 127, so the scale is 1 and 2.5 and -3.5
    // are ties, to even (2 and -4).
    kv[4 * stride] = 127.0f;
    kv[4 * stride + 1] = 2.5f;
    kv[4 * stride + 2] = -3.5f;
    for (int d = 0; d < head_dim; ++d) kv[stride + head_dim + d] = 0.0f;  // row 1, key head 1
    kv[2 * stride + 5] = std::numeric_limits<float>::infinity();          // row 2, key head 0
    kv[3 * stride + kv_dim + 2 + 2 * head_dim + 1] = kNaN;                // row 3, value head 2
    Pair pkv = Upload(kv);
    std::vector<uint8_t> bytes(seqs.layout.total_bytes());
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng_());
    Bytes cache = UploadBytes(bytes);
    for (int layer : {0, 1}) {
      cpu_->WriteKv(pkv.cpu, stride, pkv.cpu + kv_dim + 2, stride, rows, layer, seqs.layout,
                    cache.cpu);
      cuda_->WriteKv(pkv.cuda, stride, pkv.cuda + kv_dim + 2, stride, rows, layer, seqs.layout,
                     cache.cuda);
    }
    ASSERT_OK(cuda_->status());
    EXPECT_EQ(CudaBytes(cache), CpuBytes(cache)) << "blocks of " << block_size;
  }
}

TEST_F(CudaVsCpu, SupportsEveryPairingOfWeightAndKvTypes) {
  for (DType weights : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType kv : {DType::kF32, DType::kBF16, DType::kF16, DType::kI8}) {
      EXPECT_OK(cuda_->Supports(weights, kv)) << DTypeName(weights) << "/" << DTypeName(kv);
    }
  }
}

// Ops with 16-bit weights or KV, for f16 and bf16.
class CudaHalfOps : public CudaVsCpu, public ::testing::WithParamInterface<DType> {};

// The activations are rounded to the weights' type on the device (the
// tensor cores take one type): against a double product of the rounded
// operands the error is f32 summation (relative L2 1e-5); against the CPU
// backend, which may keep the activations in f32, that rounding shows:
// relative L2 within 1e-2 for bf16 (8 significant bits), 2e-3 for f16 (11).
TEST_P(CudaHalfOps, MatMul) {
  const DType dtype = GetParam();
  struct Case {
    int m, n, k;
  };
  // Up to 8 rows with k a multiple of 8 take the weight-streaming kernel:
  // k of 48 and 256 only its tail loop, 1032 one unrolled pass and a tail,
  // 4096 four passes; k of 65, or more rows, take cuBLAS.
  for (const Case& c : {Case{1, 64, 48}, Case{1, 300, 256}, Case{3, 37, 1032}, Case{8, 130, 4096},
                        Case{7, 33, 65}, Case{64, 256, 128}, Case{130, 96, 512}}) {
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "m=" << c.m << " n=" << c.n << " k=" << c.k << " accumulate=" << accumulate);
      const std::vector<float> x = RandomFloats(size_t(c.m) * c.k, -1, 1, rng_);
      const std::vector<float> w = RandomFloats(size_t(c.n) * c.k, -1, 1, rng_);
      const std::vector<float> before = accumulate ? RandomFloats(size_t(c.m) * c.n, -2, 2, rng_)
                                                   : std::vector<float>(size_t(c.m) * c.n, kNaN);
      Pair px = Upload(x), out = Upload(before);
      Bytes pw = UploadBytes(Narrowed(w, dtype));
      cpu_->MatMul(px.cpu, MatrixRef{pw.cpu, dtype}, out.cpu, c.m, c.n, c.k, accumulate);
      cuda_->MatMul(px.cuda, MatrixRef{pw.cuda, dtype}, out.cuda, c.m, c.n, c.k, accumulate);
      const std::vector<float> expected = Cpu(out), actual = Cuda(out);
      const std::vector<float> xr = RoundTrip(x, dtype), wr = RoundTrip(w, dtype);
      std::vector<double> exact(size_t(c.m) * c.n);
      for (int i = 0; i < c.m; ++i) {
        for (int j = 0; j < c.n; ++j) {
          double sum = accumulate ? before[size_t(i) * c.n + j] : 0.0;
          for (int t = 0; t < c.k; ++t)
            sum += double{xr[size_t(i) * c.k + t]} * wr[size_t(j) * c.k + t];
          exact[size_t(i) * c.n + j] = sum;
        }
      }
      EXPECT_LE(RelativeL2<double>(actual, exact), 1e-5);
      EXPECT_LE(RelativeL2(actual, expected), dtype == DType::kBF16 ? 1e-2 : 2e-3);
    }
  }
}

// The weight-streaming kernel and cuBLAS compute the same products (up to
// f32 summation order) for every row count the kernel takes, and a product
// the backend sends to cuBLAS with the kernel turned off equals itself.
TEST_P(CudaHalfOps, SkinnyProductMatchesCublas) {
  const DType dtype = GetParam();
  constexpr int kN = 515, kK = 2048;
  const std::vector<float> w = RandomFloats(size_t(kN) * kK, -1, 1, rng_);
  Bytes pw = UploadBytes(Narrowed(w, dtype));
  for (int m = 1; m <= 9; ++m) {
    SCOPED_TRACE(::testing::Message() << "m=" << m);
    const std::vector<float> x = RandomFloats(size_t(m) * kK, -1, 1, rng_);
    Pair px = Upload(x), streamed = Upload(std::vector<float>(size_t(m) * kN, kNaN)),
         general = Upload(std::vector<float>(size_t(m) * kN, kNaN));
    cuda_->set_skinny_max_rows(8);
    cuda_->MatMul(px.cuda, MatrixRef{pw.cuda, dtype}, streamed.cuda, m, kN, kK, false);
    cuda_->set_skinny_max_rows(0);
    cuda_->MatMul(px.cuda, MatrixRef{pw.cuda, dtype}, general.cuda, m, kN, kK, false);
    cuda_->set_skinny_max_rows(8);
    ASSERT_OK(cuda_->status());
    EXPECT_LE(RelativeL2(Cuda(streamed), Cuda(general)), 1e-5);
  }
}

// Widening is exact.
TEST_P(CudaHalfOps, Embed) {
  constexpr int kVocab = 50, kDim = 67;
  Bytes table = UploadBytes(Narrowed(RandomFloats(size_t(kVocab) * kDim, -1, 1, rng_), GetParam()));
  std::vector<int32_t> ids(13);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng_() % kVocab);
  Pair out = Poisoned(ids.size() * kDim);
  cpu_->Embed(MatrixRef{table.cpu, GetParam()}, ids, kDim, out.cpu);
  cuda_->Embed(MatrixRef{table.cuda, GetParam()}, ids, kDim, out.cuda);
  EXPECT_EQ(Cuda(out), Cpu(out));
}

// Rounding to nearest even, as the CPU backend rounds: the same bytes.
TEST_P(CudaHalfOps, WriteKv) {
  const int kv_dim = 96;
  Sequences seqs = MakeSequences({21, 38, 6}, kv_dim, rng_, GetParam());
  const std::vector<AttentionRow> rows = WriteKvRows(seqs);
  const int stride = 3 * kv_dim + 5;
  std::vector<float> kv = RandomFloats(rows.size() * stride, -3, 3, rng_);
  kv[7] = 1.0f + 1.0f / 256;  // halfway between two bf16 values: rounds to even
  kv[8] = 65504.0f * 2;       // past f16's largest: infinity
  Pair pkv = Upload(kv);
  Bytes cache =
      UploadBytes(Narrowed(RandomFloats(seqs.layout.total_elements(), -1, 1, rng_), GetParam()));
  for (int layer : {0, 1}) {
    cpu_->WriteKv(pkv.cpu, stride, pkv.cpu + kv_dim + 2, stride, rows, layer, seqs.layout,
                  cache.cpu);
    cuda_->WriteKv(pkv.cuda, stride, pkv.cuda + kv_dim + 2, stride, rows, layer, seqs.layout,
                   cache.cuda);
  }
  EXPECT_EQ(CudaBytes(cache), CpuBytes(cache));
}

INSTANTIATE_TEST_SUITE_P(Types, CudaHalfOps, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// A fault planted for tests fails the operation it lands on as a CUDA
// error would: kept, and every later operation skipped.
// Rows of a Llama-3 vocabulary with planted equal maxima and NaN, and
// short rows: the same index as the CPU backend's.
TEST_F(CudaVsCpu, ArgmaxMatchesTheCpuBackend) {
  for (const int n : {128256, 1000, 7, 1}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    constexpr int kRows = 6;
    std::vector<float> x = RandomFloats(size_t(kRows) * n, -8, 8, rng_);
    if (n > 100) {
      x[size_t(1) * n + 70] = x[size_t(1) * n + 90] = 9.0f;      // equal maxima
      x[size_t(2) * n] = kNaN;                                   // NaN in front
      x[size_t(2) * n + n - 1] = 9.5f;                           // largest last
      for (int i = 0; i < n; ++i) x[size_t(3) * n + i] = -1.0f;  // all equal
    }
    Pair px = Upload(x);
    Bytes ids = UploadBytes(std::vector<uint8_t>(kRows * sizeof(int32_t), 0xff));
    cpu_->Argmax(px.cpu, kRows, n, static_cast<int32_t*>(ids.cpu));
    cuda_->Argmax(px.cuda, kRows, n, static_cast<int32_t*>(ids.cuda));
    const std::vector<uint8_t> expected = CpuBytes(ids), actual = CudaBytes(ids);
    EXPECT_EQ(actual, expected);
    if (n > 100) {
      int32_t second = 0;
      std::memcpy(&second, actual.data() + sizeof(int32_t), sizeof(int32_t));
      EXPECT_EQ(second, 70);
    }
  }
}

TEST_F(CudaVsCpu, InjectedFaultIsKeptLikeACudaError) {
  Pair gate_up = Upload(RandomFloats(64, -1, 1, rng_)), out = Poisoned(32);
  cuda_->InjectFaultForTesting(/*after_operations=*/1);
  cuda_->SwiGlu(gate_up.cuda, out.cuda, 1, 32);
  ASSERT_OK(cuda_->status());
  cuda_->SwiGlu(gate_up.cuda, out.cuda, 1, 32);
  const absl::Status failed = cuda_->status();
  EXPECT_THAT(failed,
              ::tandem::testing::StatusIs(absl::StatusCode::kInternal,
                                          HasSubstr("LaunchFaultyKernel() failed: cudaError")));
  cuda_->RmsNorm(gate_up.cuda, gate_up.cuda, out.cuda, 1, 32, 1e-5f);
  EXPECT_EQ(cuda_->Synchronize(), failed);
  cuda_.reset();  // TearDown would expect OK
}

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

}  // namespace
}  // namespace tandem
