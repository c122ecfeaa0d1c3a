// DeepSeek V2-Lite, V2 and V3 shapes (latent attention with and without a
// q rank, greedy, group-limited and sigmoid-with-bias routing, shared
// experts, a dense first layer, YaRN) written as hub folders and read back:
// the engine against the independent numpy reference (which expands every
// head's keys and values as DeepSeek's modeling code does), prefill and
// decode, in each attention form; a sequence continued from a copied prefix
// gives the same logits; the KV cache holds layers x (kv_lora_rank +
// qk_rope_head_dim) values a token. The same models as deepseek2 GGUF
// files.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/model/gguf.h"
#include "common/model/gguf_model.h"
#include "common/model/hub_model.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/engine/numpy_reference.h"

namespace tandem {
namespace {

using ::tandem::testing::MaxRelativeError;

struct DeepSeekCase {
  std::string name;
  ModelConfig config;
};

void PrintTo(const DeepSeekCase& c, std::ostream* os) { *os << c.name; }

class DeepSeekNumerics : public ::testing::TestWithParam<DeepSeekCase> {};

TEST_P(DeepSeekNumerics, EachFormMatchesTheNumpyReference) {
  const ModelConfig& config = GetParam().config;
  ASSERT_OK_AND_ASSIGN(auto original, MakeSyntheticModel(config, 23));
  const std::string dir = ::tandem::testing::TempDir() + "/deepseek-" + GetParam().name;
  HubWriteOptions options;
  options.dtype = DType::kF32;
  ASSERT_OK(WriteHubModel(*original, dir, options));
  ASSERT_OK_AND_ASSIGN(auto loaded, LoadHubModel(dir));
  EXPECT_EQ(loaded->Fingerprint(), original->Fingerprint());

  std::mt19937_64 rng(7);
  std::vector<int32_t> tokens(40);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % config.vocab_size);
  ASSERT_OK_AND_ASSIGN(const auto numpy, ::tandem::testing::NumpyReferenceLogits(dir, tokens));
  ASSERT_EQ(numpy.size(), tokens.size());
  const size_t vocab = config.vocab_size;

  for (const auto form :
       {LatentShape::Form::kCheaper, LatentShape::Form::kAbsorbed, LatentShape::Form::kExpanded}) {
    SCOPED_TRACE(static_cast<int>(form));
    ASSERT_OK_AND_ASSIGN(auto backend, CpuBackend::Create(CpuBackendOptions{.num_threads = 2}));
    ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(*loaded, std::move(backend),
                                                     EngineOptions{.latent_form = form}));
    // One latent vector a token and layer, no values.
    EXPECT_TRUE(engine->kv_layout().latent);
    EXPECT_EQ(engine->kv_layout().block_elements(),
              size_t(engine->kv_layout().block_size) *
                  (config.mla.kv_lora_rank + config.mla.qk_rope_head_dim));
    // 24 tokens as one prefill chunk (every row's logits), the rest one
    // decode step each.
    constexpr int kPrefill = 24;
    BlockTable table = engine->NewSequence();
    std::span<const int32_t> all(tokens);
    BatchItem chunk{&table, all.first(kPrefill), true};
    chunk.all_logits = true;
    ASSERT_OK_AND_ASSIGN(const std::vector<float> prefill, engine->Step({&chunk, 1}));
    double worst = 0;
    for (int i = 0; i < kPrefill; ++i) {
      worst = std::max(worst, MaxRelativeError({prefill.data() + i * vocab, vocab}, numpy[i]));
    }
    for (size_t i = kPrefill; i < tokens.size(); ++i) {
      const BatchItem item{&table, all.subspan(i, 1), true};
      ASSERT_OK_AND_ASSIGN(const std::vector<float> logits, engine->Step({&item, 1}));
      worst = std::max(worst, MaxRelativeError(logits, numpy[i]));
    }
    EXPECT_LT(worst, 1e-4);
    RecordProperty("worst_vs_numpy", std::to_string(worst));

    // A second sequence that copies the first 30 positions' latents and
    // goes on with a chunk of the rest sees the same logits.
    BlockTable copy = engine->NewSequence();
    ASSERT_OK(engine->CopySequence(table, 30, copy));
    BatchItem rest{&copy, all.subspan(30), true};
    rest.all_logits = true;
    ASSERT_OK_AND_ASSIGN(const std::vector<float> continued, engine->Step({&rest, 1}));
    double worst_continued = 0;
    for (size_t i = 30; i < tokens.size(); ++i) {
      worst_continued =
          std::max(worst_continued,
                   MaxRelativeError({continued.data() + (i - 30) * vocab, vocab}, numpy[i]));
    }
    EXPECT_LT(worst_continued, 1e-4);
    engine->Release(copy);
    engine->Release(table);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DeepSeekNumerics, ::testing::ValuesIn([] {
                           std::vector<DeepSeekCase> cases;
                           for (const auto& [name, config] : SmallDeepSeekShapes()) {
                             cases.push_back({name, config});
                           }
                           return cases;
                         }()),
                         [](const auto& info) {
                           std::string name = info.param.name;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The same models through llama.cpp's deepseek2 GGUF metadata: read back
// with the same fingerprint, they compute the same logits as from the hub
// folder, bit for bit.
TEST(DeepSeekGguf, WrittenAndReadBackComputesAsTheHubFolder) {
  for (const auto& [name, config] : SmallDeepSeekShapes()) {
    SCOPED_TRACE(name);
    ASSERT_OK_AND_ASSIGN(auto original, MakeSyntheticModel(config, 29));
    const std::string path = ::tandem::testing::TempDir() + "/" + name + ".gguf";
    ASSERT_OK(WriteGgufModel(*original, path));
    ASSERT_OK_AND_ASSIGN(auto loaded, LoadGgufModel(path));
    EXPECT_EQ(loaded->config.ToString(), config.ToString());
    EXPECT_EQ(loaded->Fingerprint(), original->Fingerprint());
    std::vector<int32_t> tokens(12);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 37 % 512);
    std::vector<std::vector<float>> logits;
    for (const ModelWeights* w : {original.get(), loaded.get()}) {
      ASSERT_OK_AND_ASSIGN(auto backend, CpuBackend::Create(CpuBackendOptions{.num_threads = 1}));
      ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(*w, std::move(backend), EngineOptions{}));
      BlockTable table = engine->NewSequence();
      BatchItem item{&table, tokens, true};
      item.all_logits = true;
      ASSERT_OK_AND_ASSIGN(std::vector<float> out, engine->Step({&item, 1}));
      logits.push_back(std::move(out));
      engine->Release(table);
    }
    EXPECT_EQ(logits[0], logits[1]);
  }
}

// A deepseek2 file without its latent rank, or with a gating function
// llama.cpp does not define, is refused naming the key.
TEST(DeepSeekGguf, MissingOrUnknownMetadataIsNamed) {
  const ModelConfig config = SmallDeepSeekShapes()[2].second;  // V3-like
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(config, 3));
  const std::string path = ::tandem::testing::TempDir() + "/deepseek-bad.gguf";
  ASSERT_OK(WriteGgufModel(*model, path));
  ASSERT_OK_AND_ASSIGN(GgufFile file, GgufFile::Open(path));
  // Rewrites one key's value in place: the same width, another meaning.
  auto patched = [&](const std::string& key, uint32_t value) -> std::string {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = bytes.find(key);
    EXPECT_NE(at, std::string::npos) << key;
    // key, then its uint32 type tag, then the value.
    std::memcpy(&bytes[at + key.size() + 4], &value, 4);
    const std::string out = path + ".patched";
    std::ofstream(out, std::ios::binary | std::ios::trunc) << bytes;
    return out;
  };
  EXPECT_THAT(LoadGgufModel(patched("deepseek2.expert_gating_func", 3)).status(),
              ::tandem::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                          ::testing::HasSubstr("deepseek2.expert_gating_func")));
  EXPECT_THAT(LoadGgufModel(patched("deepseek2.attention.kv_lora_rank", 0)).status(),
              ::tandem::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                          ::testing::HasSubstr("kv_lora_rank")));
}

}  // namespace
}  // namespace tandem
