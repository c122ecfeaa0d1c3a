#include "router/pool_identity.h"

#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/model_config.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ModelIdentity Llama() {
  return ModelIdentity{.model = "Llama-3.2-1B",
                       .weights_fingerprint = "0123456789abcdef",
                       .model_shape = "dim=2048 layers=16",
                       .kv_dtype = "bf16",
                       .block_size = 16,
                       .vocab_size = 128256};
}

TEST(DescribeDifferences, EmptyWhenTheyAgree) {
  EXPECT_EQ(DescribeDifferences(Llama(), Llama()), "");
}

TEST(DescribeDifferences, NamesEveryFieldThatDiffers) {
  ModelIdentity worker = Llama();
  worker.kv_dtype = "f32";
  EXPECT_EQ(DescribeDifferences(worker, Llama()), "has kv_dtype f32, the pool has bf16");
  worker.block_size = 32;
  worker.weights_fingerprint = "";
  worker.model = "other";
  worker.vocab_size = 32000;
  const std::string d = DescribeDifferences(worker, Llama());
  EXPECT_THAT(d, HasSubstr("has model 'other', the pool has 'Llama-3.2-1B'"));
  EXPECT_THAT(d, HasSubstr("has weights fingerprint (none), the pool has 0123456789abcdef"));
  EXPECT_THAT(d, HasSubstr("has kv_dtype f32, the pool has bf16"));
  EXPECT_THAT(d, HasSubstr("has block_size 32, the pool has 16"));
  EXPECT_THAT(d, HasSubstr("has vocab_size 32000, the pool has 128256"));
}

TEST(DescribeDifferences, NamesTheArchitectureFieldOfAnotherExpertLayout) {
  ModelConfig pool_config = SmallMoeShapes().front().second;
  ModelConfig worker_config = pool_config;
  worker_config.moe.n_experts *= 2;
  worker_config.qk_norm = QkNorm::kPerHead;
  ModelIdentity pool = Llama(), worker = Llama();
  pool.model_shape = pool_config.ShapeString();
  worker.model_shape = worker_config.ShapeString();
  worker.weights_fingerprint = "fedcba9876543210";
  const std::string d = DescribeDifferences(worker, pool);
  EXPECT_THAT(d, HasSubstr(absl::StrCat("has experts ", worker_config.moe.n_experts,
                                        ", the pool has ", pool_config.moe.n_experts)));
  EXPECT_THAT(d, HasSubstr("has qk_norm per-head, the pool has none"));
  EXPECT_THAT(d, HasSubstr("has weights fingerprint fedcba9876543210"));
  EXPECT_THAT(d, Not(HasSubstr("top_k")));
  // A dense worker in a mixture-of-experts pool: the pool's words it lacks.
  worker.model_shape = ModelConfig{.dim = pool_config.dim,
                                   .hidden_dim = pool_config.hidden_dim,
                                   .n_layers = pool_config.n_layers,
                                   .n_heads = pool_config.n_heads,
                                   .n_kv_heads = pool_config.n_kv_heads,
                                   .vocab_size = pool_config.vocab_size}
                           .ShapeString();
  EXPECT_THAT(
      DescribeDifferences(worker, pool),
      HasSubstr(absl::StrCat("has experts (none), the pool has ", pool_config.moe.n_experts)));
}

TEST(CheckTokenizerVocab, TheModelMayHaveMoreIdsButNotFewer) {
  EXPECT_EQ(CheckTokenizerVocab(128256, 128256), "");
  // Qwen2.5: 151665 tokenizer ids, embeddings padded to 151936 rows.
  EXPECT_EQ(CheckTokenizerVocab(151936, 151665), "");
  EXPECT_EQ(CheckTokenizerVocab(512, 0), "");  // no tokenizer
  EXPECT_EQ(CheckTokenizerVocab(512, 32000),
            "has vocab_size 512, smaller than the router's tokenizer (32000)");
}

TEST(ChoosePoolIdentity, NothingSeenKeepsTheCurrentIdentity) {
  EXPECT_EQ(ChoosePoolIdentity({}, std::nullopt), std::nullopt);
  EXPECT_EQ(ChoosePoolIdentity({}, Llama()), Llama());
}

TEST(ChoosePoolIdentity, TheMostFrequentIdentityWins) {
  ModelIdentity f32 = Llama();
  f32.kv_dtype = "f32";
  EXPECT_EQ(ChoosePoolIdentity({f32, Llama(), Llama()}, std::nullopt), Llama());
  // Also against the current identity: a redeploy past half the workers.
  EXPECT_EQ(ChoosePoolIdentity({f32, Llama(), Llama()}, f32), Llama());
}

TEST(ChoosePoolIdentity, TiesKeepTheCurrentIdentityThenTheFirstSeen) {
  ModelIdentity f32 = Llama();
  f32.kv_dtype = "f32";
  EXPECT_EQ(ChoosePoolIdentity({f32, Llama()}, Llama()), Llama());
  EXPECT_EQ(ChoosePoolIdentity({Llama(), f32}, f32), f32);
  EXPECT_EQ(ChoosePoolIdentity({f32, Llama()}, std::nullopt), f32);
  EXPECT_EQ(ChoosePoolIdentity({Llama(), f32}, std::nullopt), Llama());
}

TEST(ChoosePoolIdentity, ACurrentIdentityNoWorkerReportsGivesWay) {
  ModelIdentity f32 = Llama();
  f32.kv_dtype = "f32";
  EXPECT_EQ(ChoosePoolIdentity({f32}, Llama()), f32);
}

}  // namespace
}  // namespace tandem::router
