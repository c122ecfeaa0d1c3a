#include "router/pool_identity.h"

#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

ModelIdentity Llama() {
  return ModelIdentity{.model = "Llama-3.2-1B",
                       .weights_fingerprint = "0123456789abcdef",
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
