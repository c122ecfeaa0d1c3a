#include "common/engine/engine_proto.h"

#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

// Every sampling field a worker receives reaches the sampler, and the
// unset optional ones take their "off" values.
TEST(SamplingFromProto, EveryFieldIsMapped) {
  v1::SamplingParams proto;
  proto.set_temperature(0.7f);
  proto.set_top_k(40);
  proto.set_top_p(0.9f);
  proto.set_min_p(0.05f);
  proto.set_seed(123);
  proto.set_presence_penalty(0.5f);
  proto.set_frequency_penalty(-0.25f);
  proto.set_repetition_penalty(1.1f);
  (*proto.mutable_logit_bias())[17] = -3.0f;
  (*proto.mutable_logit_bias())[2] = 1.5f;
  proto.set_min_tokens(4);
  const SamplingParams p = SamplingFromProto(proto);
  EXPECT_FLOAT_EQ(p.temperature, 0.7f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(p.seed, 123u);
  EXPECT_FLOAT_EQ(p.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.frequency_penalty, -0.25f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_THAT(p.logit_bias, ElementsAre(Pair(2, 1.5f), Pair(17, -3.0f)));
  EXPECT_EQ(p.min_tokens, 4);

  const SamplingParams unset = SamplingFromProto(v1::SamplingParams());
  EXPECT_FLOAT_EQ(unset.top_p, 1.0f);
  EXPECT_FLOAT_EQ(unset.min_p, 0.0f);
  EXPECT_FLOAT_EQ(unset.repetition_penalty, 1.0f);
  EXPECT_TRUE(unset.logit_bias.empty());
}

}  // namespace
}  // namespace tandem
