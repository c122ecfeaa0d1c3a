// CUDA paged attention against the CPU backend, over f32, bf16, f16 and int8 KV
// caches holding the same values on both: decode rows (the paged-block
// kernel where it applies, and the per-row tiled kernel, context split
// over blocks) and prefill chunks (runs of 16 or more rows of
// one sequence at consecutive positions: the query-tiled kernel), alone and
// mixed in one batch, from position 0 or after a cached prefix. Both
// backends compute in f32 from the same keys and values, so the tolerance
// is f32's, relative L2 error 1e-5, except where the tiled kernel runs on
// the tensor cores (a 16-bit cache, head_dim 64 or 128, blocks of a
// multiple of 8 slots): it rounds queries and probabilities to the cache's
// type, within 1e-2 for bf16 (8 significant bits) and 2e-3 for f16 (11).
// An int8 cache (random bytes and scales) is read in f32 by both, within
// 1e-5. Skips without a device.
#include <algorithm>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/compute/cuda/kernels.h"
#include "gtest/gtest.h"
#include "tests/unit/compute/compute_testing.h"
#include "tests/unit/compute/cuda/cuda_testing.h"

namespace tandem {
namespace {

using ::tandem::testing::CudaVsCpu;
using ::tandem::testing::MakeSequences;
using ::tandem::testing::RandomCache;
using ::tandem::testing::RandomFloats;
using ::tandem::testing::RelativeL2;
using ::tandem::testing::Sequences;

struct Query {
  int seq;
  int position;
};

// Whether `queries` hold a run the tiled kernel takes: kMinPrefillRun (16)
// rows of one sequence at consecutive positions.
bool HasPrefillRun(const std::vector<Query>& queries) {
  int run = 1;
  for (size_t i = 1; i < queries.size(); ++i) {
    const bool next =
        queries[i].seq == queries[i - 1].seq && queries[i].position == queries[i - 1].position + 1;
    run = next ? run + 1 : 1;
    if (run >= 16) return true;
  }
  return false;
}

struct AttentionCase {
  AttentionShape shape;
  DType kv;
  int block_size;
};

void PrintTo(const AttentionCase& c, std::ostream* os) {
  *os << c.shape.n_heads << "/" << c.shape.n_kv_heads << " heads, head_dim " << c.shape.head_dim
      << ", " << DTypeName(c.kv) << " KV, blocks of " << c.block_size;
}

// Queries of sequence `seq` at positions [begin, end): a prefill chunk.
void AddChunk(std::vector<Query>& queries, int seq, int begin, int end) {
  for (int p = begin; p < end; ++p) queries.push_back({seq, p});
}

class CudaAttention : public CudaVsCpu, public ::testing::WithParamInterface<AttentionCase> {
 protected:
  // Attention of `queries` over `lengths`-long sequences (layer 1 of 2),
  // CUDA against CPU.
  void Check(const std::vector<int>& lengths, const std::vector<Query>& queries) {
    const AttentionShape shape = GetParam().shape;
    const int kv_dim = shape.n_kv_heads * shape.head_dim;
    Sequences seqs = MakeSequences(lengths, kv_dim, rng_, GetParam().kv, GetParam().block_size);
    seqs.layout.kv_heads = shape.n_kv_heads;  // an int8 cache's scales are per KV head
    std::vector<AttentionRow> rows;
    for (const Query& q : queries) rows.push_back({q.position, seqs.blocks[q.seq]});
    const int q_stride = (shape.n_heads + 2 * shape.n_kv_heads) * shape.head_dim + 3;
    Pair q = Upload(RandomFloats(rows.size() * q_stride, -2, 2, rng_));
    Bytes kv = UploadBytes(RandomCache(seqs, rng_));
    Pair out = Poisoned(rows.size() * shape.n_heads * shape.head_dim);
    cpu_->PagedAttention(q.cpu, q_stride, rows, 1, seqs.layout, kv.cpu, shape, out.cpu);
    cuda_->PagedAttention(q.cuda, q_stride, rows, 1, seqs.layout, kv.cuda, shape, out.cuda);
    const bool tensor_cores = (GetParam().kv == DType::kBF16 || GetParam().kv == DType::kF16) &&
                              (shape.head_dim == 64 || shape.head_dim == 128) &&
                              GetParam().block_size % 8 == 0 && HasPrefillRun(queries);
    const double tolerance = !tensor_cores ? 1e-5 : GetParam().kv == DType::kBF16 ? 1e-2 : 2e-3;
    const double error = RelativeL2(Cuda(out), Cpu(out));
    EXPECT_LE(error, tolerance);
    worst_ = std::max(worst_, error);
    // Where the paged-block decode kernel took the decode rows, the tiled
    // kernel must agree too (benchmarks may choose it).
    if (cuda::BlockDecodeApplies(seqs.layout, shape.n_heads, shape.n_kv_heads, shape.head_dim,
                                 kv.cuda)) {
      Pair tiled_out = Poisoned(rows.size() * shape.n_heads * shape.head_dim);
      cuda_->set_block_decode(false);
      cuda_->PagedAttention(q.cuda, q_stride, rows, 1, seqs.layout, kv.cuda, shape, tiled_out.cuda);
      cuda_->set_block_decode(true);
      const double tiled = RelativeL2(Cuda(tiled_out), Cpu(out));
      EXPECT_LE(tiled, tolerance) << "the tiled kernel";
      worst_ = std::max(worst_, tiled);
    }
  }
  // The largest error of the test, for the XML report.
  void TearDown() override {
    RecordProperty("worst_relative_l2", ::testing::PrintToString(worst_));
    CudaVsCpu::TearDown();
  }
  double worst_ = 0.0;
};

TEST_P(CudaAttention, DecodeRowAtContextEdges) {
  for (int len : {1, 15, 16, 17, 4095}) {
    SCOPED_TRACE(::testing::Message() << "context " << len);
    Check({len}, {{0, len - 1}});
  }
}

// Every position of short sequences (below 16 rows the per-row kernel, from
// 16 the tiled one, tiles cut short), and the last 300 positions of a long
// one (five tiles, the last of 44 rows, over 256 blocks).
TEST_P(CudaAttention, PrefillRowsAreCausal) {
  for (int len : {1, 15, 16, 17, 40, 64, 65, 130}) {
    SCOPED_TRACE(::testing::Message() << "prefill " << len);
    std::vector<Query> queries;
    AddChunk(queries, 0, 0, len);
    Check({len}, queries);
  }
  std::vector<Query> queries;
  AddChunk(queries, 0, 4095 - 300, 4095);
  Check({4095}, queries);
}

// Chunks that start after a cached prefix, at positions that are not
// multiples of the block or the tile.
TEST_P(CudaAttention, PrefillChunksAfterCachedPrefix) {
  struct Chunk {
    int prefix, length;
  };
  for (const Chunk& c :
       {Chunk{1, 16}, Chunk{37, 64}, Chunk{100, 65}, Chunk{1000, 130}, Chunk{2001, 300}}) {
    SCOPED_TRACE(::testing::Message() << "prefix " << c.prefix << ", chunk " << c.length);
    std::vector<Query> queries;
    AddChunk(queries, 0, c.prefix, c.prefix + c.length);
    Check({c.prefix + c.length}, queries);
  }
}

// Decode rows, short runs and prefill chunks of several sequences in one
// batch, as a chunked-prefill step carries them.
TEST_P(CudaAttention, BatchMixesDecodeRowsAndPrefillChunks) {
  const std::vector<int> lengths = {1, 4095, 2, 700, 17, 3000, 16, 90};
  std::vector<Query> queries;
  for (int s : {0, 1, 2}) queries.push_back({s, lengths[s] - 1});
  AddChunk(queries, 3, 600, 700);  // a chunk after a cached prefix
  for (int s : {4, 5}) queries.push_back({s, lengths[s] - 1});
  AddChunk(queries, 6, 0, 16);   // a whole short prompt
  AddChunk(queries, 7, 80, 90);  // a short run: per-row kernel
  Check(lengths, queries);
}

// A decode batch as a busy worker steps it: 40 rows of unequal contexts,
// so that short rows leave some of the long rows' context splits empty.
TEST_P(CudaAttention, ManyDecodeRowsOfUnequalContexts) {
  std::vector<int> lengths;
  std::vector<Query> queries;
  for (int s = 0; s < 40; ++s) {
    lengths.push_back(1 + (s * 997) % 1500);
    queries.push_back({s, lengths.back() - 1});
  }
  Check(lengths, queries);
}

std::vector<AttentionCase> Cases() {
  std::vector<AttentionCase> cases;
  for (const AttentionShape& shape :
       {AttentionShape{8, 2, 64}, AttentionShape{32, 8, 128}, AttentionShape{4, 4, 8},
        AttentionShape{16, 1, 256}, AttentionShape{6, 2, 40}}) {
    for (DType kv : {DType::kF32, DType::kBF16, DType::kF16}) cases.push_back({shape, kv, 16});
  }
  // Blocks of 12 slots: 16-byte loads of bf16 and f16 keys would cross
  // blocks, so those are read element by element.
  for (DType kv : {DType::kF32, DType::kBF16}) {
    cases.push_back({AttentionShape{8, 2, 64}, kv, 12});
    cases.push_back({AttentionShape{32, 8, 128}, kv, 12});
  }
  // An int8 cache: bytes times their token's scale, in f32 on both backends
  // (never the tensor cores), also in blocks of 7 slots.
  for (const AttentionShape& shape : {AttentionShape{8, 2, 64}, AttentionShape{32, 8, 128},
                                      AttentionShape{4, 4, 8}, AttentionShape{6, 2, 40}}) {
    cases.push_back({shape, DType::kI8, 16});
    cases.push_back({shape, DType::kI8, 7});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention, ::testing::ValuesIn(Cases()), [](const auto& info) {
  const AttentionCase& c = info.param;
  return absl::StrCat("h", c.shape.n_heads, "_kv", c.shape.n_kv_heads, "_d", c.shape.head_dim, "_",
                      std::string(DTypeName(c.kv)), "_bs", c.block_size);
});

}  // namespace
}  // namespace tandem
