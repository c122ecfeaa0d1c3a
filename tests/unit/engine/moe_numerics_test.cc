// Mixture-of-experts models (Mixtral, Qwen2-MoE with its shared expert and
// sparse step, Qwen3-MoE with a dense layer, OLMoE with whole-projection q/k
// norms) written as hub folders and read back: the engine against the
// independent numpy reference, prefill and decode alike, and the router's
// load counted per layer and expert.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/base/logging.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
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

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

HubWriteOptions F32Folder() {
  HubWriteOptions options;
  options.dtype = DType::kF32;
  return options;
}

struct MoeCase {
  std::string name;
  ModelConfig config;
};

void PrintTo(const MoeCase& c, std::ostream* os) { *os << c.name; }

class MoeNumerics : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeNumerics, PrefillAndDecodeMatchTheNumpyReference) {
  const ModelConfig& config = GetParam().config;
  ASSERT_OK_AND_ASSIGN(auto original, MakeSyntheticModel(config, 21));
  const std::string dir = ::tandem::testing::TempDir() + "/moe-" + GetParam().name;
  HubWriteOptions options;
  options.dtype = DType::kF32;
  ASSERT_OK(WriteHubModel(*original, dir, options));
  ASSERT_OK_AND_ASSIGN(auto loaded, LoadHubModel(dir));
  EXPECT_EQ(loaded->Fingerprint(), original->Fingerprint());

  std::mt19937_64 rng(5);
  std::vector<int32_t> tokens(40);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % config.vocab_size);
  ASSERT_OK_AND_ASSIGN(const auto numpy, ::tandem::testing::NumpyReferenceLogits(dir, tokens));
  ASSERT_EQ(numpy.size(), tokens.size());

  ASSERT_OK_AND_ASSIGN(auto backend, CpuBackend::Create());
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(*loaded, std::move(backend), EngineOptions{}));
  // The first 24 tokens as one prefill chunk (every row's logits), the rest
  // one decode step each.
  constexpr int kPrefill = 24;
  BlockTable table = engine->NewSequence();
  std::span<const int32_t> all(tokens);
  BatchItem chunk{&table, all.first(kPrefill), true};
  chunk.all_logits = true;
  ASSERT_OK_AND_ASSIGN(const std::vector<float> prefill, engine->Step({&chunk, 1}));
  double worst = 0;
  const size_t vocab = config.vocab_size;
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

  // Every token went to top_k experts of each sparse layer, and the router
  // spread them (no expert took every token).
  const auto& load = engine->expert_load();
  ASSERT_EQ(load.size(), static_cast<size_t>(config.n_layers));
  for (int l = 0; l < config.n_layers; ++l) {
    SCOPED_TRACE(l);
    if (!config.IsMoeLayer(l)) {
      EXPECT_TRUE(load[l].empty());
      continue;
    }
    ASSERT_EQ(load[l].size(), static_cast<size_t>(config.moe.n_experts));
    EXPECT_EQ(std::accumulate(load[l].begin(), load[l].end(), uint64_t{0}),
              tokens.size() * config.moe.top_k);
    EXPECT_LT(*std::max_element(load[l].begin(), load[l].end()), tokens.size());
  }
  engine->Release(table);
}

INSTANTIATE_TEST_SUITE_P(Architectures, MoeNumerics, ::testing::ValuesIn([] {
                           std::vector<MoeCase> cases;
                           for (const auto& [name, config] : SmallMoeShapes()) {
                             cases.push_back({name, config});
                           }
                           return cases;
                         }()),
                         [](const auto& info) {
                           std::string name = info.param.name;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// What a mixture-of-experts folder gets wrong is refused at load, naming
// the file and the field or tensor.
TEST(MoeLoad, BadFoldersAreRefusedNamingWhatIsWrong) {
  const ModelConfig config = SmallMoeShapes()[0].second;  // mixtral-small
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(config, 2));
  const std::string dir = ::tandem::testing::TempDir() + "/moe-bad";
  ASSERT_OK(WriteHubModel(*model, dir, F32Folder()));
  ASSERT_OK(LoadHubModel(dir).status());

  // More experts per token than experts.
  ModelConfig greedy = config;
  greedy.moe.top_k = 1;
  ASSERT_OK_AND_ASSIGN(auto one, MakeSyntheticModel(greedy, 2));
  const std::string topk_dir = ::tandem::testing::TempDir() + "/moe-topk";
  ASSERT_OK(WriteHubModel(*one, topk_dir, F32Folder()));
  std::string text = ReadText(topk_dir + "/config.json");
  const size_t at = text.find("\"num_experts_per_tok\": 1");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 24, "\"num_experts_per_tok\": 9");
  WriteText(topk_dir + "/config.json", text);
  EXPECT_THAT(
      LoadHubModel(topk_dir),
      ::tandem::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                  ::testing::AllOf(::testing::HasSubstr("config.json"),
                                                   ::testing::HasSubstr("num_experts_per_tok"))));

  // A config that says more experts than the folder holds: the first
  // missing expert's tensor is named.
  text = ReadText(dir + "/config.json");
  const size_t experts = text.find("\"num_local_experts\": 4");
  ASSERT_NE(experts, std::string::npos);
  text.replace(experts, 22, "\"num_local_experts\": 5");
  WriteText(dir + "/config.json", text);
  EXPECT_THAT(LoadHubModel(dir),
              ::tandem::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                          ::testing::HasSubstr("block_sparse_moe.gate.weight")));
}

}  // namespace
}  // namespace tandem
