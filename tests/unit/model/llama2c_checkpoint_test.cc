#include "common/model/llama2c_checkpoint.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/gguf_model.h"
#include "common/model/model_weights.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/model/weights_testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ExpectSameWeights;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string CheckpointTempPath(const std::string& name) {
  return ::tandem::testing::TempDir() + "/" + name;
}

std::string CheckpointReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string CheckpointWriteBytes(const std::string& name, const std::string& bytes) {
  const std::string path = CheckpointTempPath(name);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  return path;
}

// A llama2.c header followed by `floats` zero weights.
std::string Checkpoint(const std::vector<int32_t>& header, size_t floats) {
  std::string bytes(header.size() * 4 + floats * 4, '\0');
  std::memcpy(bytes.data(), header.data(), header.size() * 4);
  return bytes;
}

void CheckpointExpectInvalid(const std::string& bytes, const std::string& what) {
  const std::string path = CheckpointWriteBytes("bad.bin", bytes);
  EXPECT_THAT(
      LoadLlama2cCheckpoint(path).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(path), HasSubstr(what))));
}

TEST(Llama2cCheckpointTest, LoadsStories260K) {
  TANDEM_MODEL_FILE_OR_SKIP(path, "stories260K.bin");
  ASSERT_OK_AND_ASSIGN(auto w, LoadLlama2cCheckpoint(path));
  const ModelConfig& c = w->config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(w->classifier.data, w->token_embedding.data);
  ASSERT_EQ(w->layers.size(), 5u);
  EXPECT_EQ(w->layers[4].wk.size(), 32u * 64);
  EXPECT_EQ(w->layers[4].w2.size(), 64u * 172);
  // The embedding is the first tensor after the 28-byte header.
  const std::string bytes = CheckpointReadBytes(path);
  EXPECT_EQ(std::memcmp(w->token_embedding.data, bytes.data() + 28, 512 * 64 * 4), 0);
  // rms_final sits right before the two RoPE tables at the end.
  const size_t rope_bytes = 512 * 8 * 4;
  EXPECT_EQ(
      std::memcmp(w->rms_final.data, bytes.data() + bytes.size() - rope_bytes - 64 * 4, 64 * 4), 0);
}

TEST(Llama2cCheckpointTest, Stories260KRewritesToTheSameWeights) {
  TANDEM_MODEL_FILE_OR_SKIP(path, "stories260K.bin");
  ASSERT_OK_AND_ASSIGN(auto original, LoadLlama2cCheckpoint(path));
  const std::string copy = CheckpointTempPath("copy.bin");
  ASSERT_OK(WriteLlama2cCheckpoint(*original, copy));
  ASSERT_OK_AND_ASSIGN(auto loaded, LoadLlama2cCheckpoint(copy));
  ExpectSameWeights(*original, *loaded);
  EXPECT_EQ(CheckpointReadBytes(copy).size(), CheckpointReadBytes(path).size());
}

struct CheckpointShapeCase {
  const char* name;
  int n_heads, n_kv_heads;
  bool tied;
};

// The synthetic weights are one SplitMix64 sequence drawn in tensor order
// (the embedding, then layer 0's attention norm, then its q projection...),
// however many threads fill a matrix: a serial generator here gives the same
// values, bit for bit, at the start, the end and across the tensor seams.
TEST(SyntheticModelTest, ValuesFollowOneSerialSequenceInTensorOrder) {
  const ModelConfig c{.dim = 64,
                      .hidden_dim = 96,
                      .n_layers = 1,
                      .n_heads = 4,
                      .n_kv_heads = 2,
                      .vocab_size = 4099,
                      .seq_len = 16};
  const uint64_t seed = 9;
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(c, seed, DType::kF32));
  uint64_t state = seed * 0x2545F4914F6CDD1Dull + 1;
  auto next = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<float>((z >> 40) * 0x1.0p-23 - 1.0);
  };
  const float a_embed = std::sqrt(3.0f / 64.0f);
  const std::vector<float> embed = model->token_embedding.ToFloats();
  ASSERT_EQ(embed.size(), size_t{4099} * 64);
  for (size_t i = 0; i < embed.size(); ++i) {
    const float want = a_embed * next();
    ASSERT_EQ(embed[i], want) << "embedding value " << i;
  }
  const std::vector<float> norm = model->layers[0].rms_att.ToFloats();
  for (size_t i = 0; i < norm.size(); ++i) {
    const float want = 1.0f + 0.1f * next();
    ASSERT_EQ(norm[i], want) << "attention norm value " << i;
  }
  const std::vector<float> wq = model->layers[0].wq.ToFloats();
  for (size_t i = 0; i < wq.size(); ++i) {
    const float want = a_embed * next();
    ASSERT_EQ(wq[i], want) << "q projection value " << i;
  }
}

class SyntheticRoundTripTest : public ::testing::TestWithParam<CheckpointShapeCase> {};

// Synthetic weights through both writers and back, then across formats.
TEST_P(SyntheticRoundTripTest, BothFormatsGiveBackTheSameWeights) {
  const CheckpointShapeCase& s = GetParam();
  const ModelConfig c{.dim = 96,
                      .hidden_dim = 160,
                      .n_layers = 3,
                      .n_heads = s.n_heads,
                      .n_kv_heads = s.n_kv_heads,
                      .vocab_size = 70,
                      .seq_len = 48,
                      .shared_classifier = s.tied};
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(c, 3));
  const std::string bin = CheckpointTempPath(absl::StrCat(s.name, ".bin"));
  const std::string gguf = CheckpointTempPath(absl::StrCat(s.name, ".gguf"));
  ASSERT_OK(WriteLlama2cCheckpoint(*model, bin));
  ASSERT_OK(WriteGgufModel(*model, gguf));
  ASSERT_OK_AND_ASSIGN(auto from_bin, LoadModel(bin));
  ASSERT_OK_AND_ASSIGN(auto from_gguf, LoadModel(gguf));
  ExpectSameWeights(*model, *from_bin);
  ExpectSameWeights(*model, *from_gguf);
  EXPECT_EQ(from_bin->config.shared_classifier, s.tied);
  EXPECT_EQ(from_bin->classifier.data == from_bin->token_embedding.data, s.tied);

  const std::string again = CheckpointTempPath(absl::StrCat(s.name, ".again.bin"));
  ASSERT_OK(WriteLlama2cCheckpoint(*from_gguf, again));
  EXPECT_EQ(CheckpointReadBytes(again), CheckpointReadBytes(bin));
}

INSTANTIATE_TEST_SUITE_P(Shapes, SyntheticRoundTripTest,
                         ::testing::Values(CheckpointShapeCase{"mha", 6, 6, true},
                                           CheckpointShapeCase{"gqa", 6, 2, true},
                                           CheckpointShapeCase{"mqa", 6, 1, true},
                                           CheckpointShapeCase{"mha_untied", 4, 4, false},
                                           CheckpointShapeCase{"gqa_untied", 6, 3, false}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Llama2cCheckpointTest, RejectsTruncatedAndPaddedFiles) {
  const ModelConfig small{.dim = 32,
                          .hidden_dim = 48,
                          .n_layers = 2,
                          .n_heads = 4,
                          .n_kv_heads = 2,
                          .vocab_size = 20,
                          .seq_len = 16};
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(small, 1));
  const std::string good = CheckpointReadBytes([&] {
    const std::string path = CheckpointTempPath("good.bin");
    EXPECT_OK(WriteLlama2cCheckpoint(*model, path));
    return path;
  }());
  CheckpointExpectInvalid("", "fewer than the 28-byte llama2.c header");
  CheckpointExpectInvalid(good.substr(0, 10), "fewer than the 28-byte llama2.c header");
  // Right after the header, inside the embedding, inside a layer, 4 bytes short.
  for (size_t cut : {28ul, 100ul, good.size() / 2, good.size() - 4}) {
    SCOPED_TRACE(cut);
    CheckpointExpectInvalid(good.substr(0, cut), "the file is truncated");
  }
  CheckpointExpectInvalid(good + std::string(4, '\0'),
                          absl::StrCat("is ", good.size() + 4, " bytes but its header"));
}

TEST(Llama2cCheckpointTest, ParsesBytesInMemoryAndKeepsThemAlive) {
  const ModelConfig small{.dim = 32,
                          .hidden_dim = 48,
                          .n_layers = 2,
                          .n_heads = 4,
                          .n_kv_heads = 2,
                          .vocab_size = 20,
                          .seq_len = 16};
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(small, 1));
  const std::string path = CheckpointTempPath("in_memory.bin");
  ASSERT_OK(WriteLlama2cCheckpoint(*model, path));
  auto owned = std::make_shared<std::vector<float>>((CheckpointReadBytes(path).size() + 3) / 4);
  const std::string file = CheckpointReadBytes(path);
  std::memcpy(owned->data(), file.data(), file.size());
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(owned->data()),
                                       file.size());
  ASSERT_OK_AND_ASSIGN(auto parsed, ParseLlama2cCheckpoint(owned, bytes, "memory"));
  owned.reset();  // the weights hold the only reference now
  ExpectSameWeights(*model, *parsed);
  EXPECT_EQ(parsed->source, "memory");
  EXPECT_THAT(ParseLlama2cCheckpoint(nullptr, bytes.subspan(1, 40), "odd").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not 4-byte aligned")));
}

TEST(Llama2cCheckpointTest, RejectsImpossibleHeaders) {
  // dim, hidden, layers, heads, kv_heads, vocab, seq_len
  CheckpointExpectInvalid(Checkpoint({0, 48, 2, 4, 2, 20, 16}, 100), "dim is 0");
  CheckpointExpectInvalid(Checkpoint({-32, 48, 2, 4, 2, 20, 16}, 100), "dim is -32");
  CheckpointExpectInvalid(Checkpoint({32, 48, 2, 0, 2, 20, 16}, 100), "n_heads is 0");
  CheckpointExpectInvalid(Checkpoint({30, 48, 2, 4, 2, 20, 16}, 100), "not divisible by n_heads 4");
  CheckpointExpectInvalid(Checkpoint({32, 48, 2, 4, 3, 20, 16}, 100),
                          "not divisible by n_kv_heads 3");
  CheckpointExpectInvalid(Checkpoint({32, 48, 2, 4, 2, INT32_MIN, 16}, 100), "vocab_size is 0");
  CheckpointExpectInvalid(Checkpoint({32, 48, 2, 4, 2, 0, 16}, 100), "vocab_size is 0");
  CheckpointExpectInvalid(Checkpoint({32, 48, 2, 4, 2, 20, -1}, 100), "seq_len is -1");
  // Sizes whose tensor bytes would overflow 32 bits must still be checked
  // against the file, not trusted.
  CheckpointExpectInvalid(Checkpoint({1 << 20, 1 << 20, 4096, 2, 2, 1 << 22, 1 << 20}, 10),
                          "the file is truncated");
}

TEST(LoadModelTest, DispatchesOnTheMagic) {
  const ModelConfig small{.dim = 32,
                          .hidden_dim = 48,
                          .n_layers = 1,
                          .n_heads = 2,
                          .n_kv_heads = 2,
                          .vocab_size = 10,
                          .seq_len = 8};
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(small, 1));
  // A misleading name: the contents decide.
  const std::string gguf = CheckpointTempPath("model.bin");
  ASSERT_OK(WriteGgufModel(*model, gguf));
  ASSERT_OK_AND_ASSIGN(auto loaded, LoadModel(gguf));
  ExpectSameWeights(*model, *loaded);

  const std::string bin = CheckpointTempPath("model.gguf");
  ASSERT_OK(WriteLlama2cCheckpoint(*model, bin));
  ASSERT_OK_AND_ASSIGN(loaded, LoadModel(bin));
  ExpectSameWeights(*model, *loaded);

  const std::string bad_gguf =
      CheckpointWriteBytes("bad_gguf", CheckpointReadBytes(gguf).substr(0, 200));
  EXPECT_THAT(LoadModel(bad_gguf).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("GGUF file '" + bad_gguf)));
  const std::string bad_bin =
      CheckpointWriteBytes("bad_bin", CheckpointReadBytes(bin).substr(0, 200));
  EXPECT_THAT(LoadModel(bad_bin).status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                                    HasSubstr("is 200 bytes but its header")));
  const std::string tiny = CheckpointWriteBytes("tiny", "GG");
  EXPECT_THAT(LoadModel(tiny).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("28-byte")));
  EXPECT_THAT(LoadModel(CheckpointTempPath("absent")).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(LoadModelTest, VocabularyOnlyGgufIsRefused) {
  TANDEM_MODEL_FILE_OR_SKIP(path, "ggml-vocab-llama-spm.gguf");
  EXPECT_THAT(LoadModel(path).status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 AllOf(HasSubstr(path), HasSubstr("no tensors"))));
}

}  // namespace
}  // namespace tandem
