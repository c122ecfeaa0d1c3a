// The roofline cost model: exact on a hand-computed step, and with its
// default shares it gives back tandem's own H100 figures
// (docs/benchmarks/gpu.md), from which those shares were taken.
#include "tools/sim/roofline.h"

#include <cmath>

#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tools/sim/stand_in_model.h"

namespace tandem::sim {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

RooflineCost H100Llama3_8B() {
  return RooflineCost{.config = Llama3_8BShape(),
                      .weight_bytes = 2,
                      .kv_bytes = 2,
                      .device = FindDevice("h100").value()};
}

StepShape Decode(int batch, int context) {
  return StepShape{.items = batch,
                   .tokens = batch,
                   .attended = int64_t{batch} * context,
                   .logit_rows = batch,
                   .decode_tokens = batch,
                   .decode_attended = int64_t{batch} * context};
}

StepShape Prefill(int tokens) {
  return StepShape{.items = 1,
                   .tokens = tokens,
                   .attended = int64_t{tokens} * (tokens + 1) / 2,
                   .logit_rows = 1};
}

double TokensPerSecond(const RooflineCost& cost, const StepShape& shape) {
  return shape.tokens / absl::ToDoubleSeconds(cost(shape));
}

TEST(Roofline, AHandComputedStep) {
  // Memory-bound by construction: 1 MB/s, compute without limit.
  const RooflineCost cost{.config = ModelConfig{.dim = 4,
                                                .hidden_dim = 8,
                                                .n_layers = 2,
                                                .n_heads = 2,
                                                .n_kv_heads = 1,
                                                .vocab_size = 10,
                                                .seq_len = 64},
                          .weight_bytes = 2,
                          .kv_bytes = 2,
                          .device = {.name = "test", .memory_bandwidth = 1e6, .flops = 1e30},
                          .efficiency = {.bandwidth = 1.0,
                                         .compute = 1.0,
                                         .per_logit = absl::ZeroDuration(),
                                         .per_step = absl::ZeroDuration()}};
  // Layers: (2 x 4 x 4 + 2 x 2 x 4 + 3 x 4 x 8) params x 2 layers x 2 bytes.
  EXPECT_EQ(cost.LayerWeightBytes(), 576);
  EXPECT_EQ(cost.ClassifierBytes(), 80);
  EXPECT_EQ(cost.KvBytesPerToken(), 16);
  // One decode row over 5 keys: the weights, 5 keys read and 1 written,
  // the classifier: 576 + 96 + 80 bytes at 1 MB/s.
  EXPECT_EQ(cost(Decode(1, 5)), absl::Microseconds(752));
  EXPECT_EQ(cost(StepShape{}), absl::ZeroDuration());
}

// Qwen3-30B-A3B on an H200: the device holds every expert, a token
// multiplies with 8 of 128, and a step reads the experts its tokens touch:
// 8 of each layer at one token, E (1 - (1 - k/E)^t) in expectation at t,
// nearly all 128 at a 512-token prefill chunk.
TEST(Roofline, MixtureOfExpertsStepsReadTheExpertsTheirTokensTouch) {
  const RooflineCost cost{.config = Qwen3_30B_A3BShape(),
                          .weight_bytes = 2,
                          .kv_bytes = 2,
                          .device = FindDevice("h200").value()};
  const double d = 2048, layers = 48, expert = 3 * d * 768 * 2;
  // q (32 x 128), k and v (4 x 128) and o; the router of 128 experts.
  const double dense = layers * (2 * 4096 * d + 2 * 512 * d + 128 * d) * 2;
  EXPECT_DOUBLE_EQ(cost.LayerWeightBytes(), dense + layers * 128 * expert);
  EXPECT_DOUBLE_EQ(cost.StepWeightBytes(1), dense + layers * 8 * expert);
  for (int tokens : {2, 16, 64, 512}) {
    SCOPED_TRACE(tokens);
    const double touched = 128 * (1 - std::pow(1 - 8.0 / 128, tokens));
    EXPECT_NEAR(cost.StepWeightBytes(tokens), dense + layers * touched * expert, 1.0);
  }
  EXPECT_GT(cost.StepWeightBytes(512), dense + layers * 127.9 * expert);
  EXPECT_DOUBLE_EQ(cost.ActiveLayerParams(), dense / 2 + layers * 8 * expert / 2);
  // About 3.3 B active parameters of 30.5 B: the "A3B" of its name.
  EXPECT_NEAR((cost.ActiveLayerParams() + 2 * 151936 * d) / 1e9, 3.3, 0.1);
  EXPECT_NEAR(Qwen3_30B_A3BShape().NumParameters() / 1e9, 30.5, 0.2);
  // A decode step of 1 reads 8 experts per layer; one of 32 reads about 108.
  EXPECT_LT(cost(Decode(1, 1024)) * 4, cost(Decode(32, 1024)));
}

// DeepSeek-V3 and Kimi K2 (latent attention): the active and total
// parameters their papers give, 70,272 bytes of bf16 KV a token (the latent
// and the rope key), and neither fits one H200.
TEST(Roofline, LatentAttentionShapesCostTheirOwnWeightsAndKv) {
  const RooflineCost v3{.config = DeepSeekV3Shape(),
                        .weight_bytes = 2,
                        .kv_bytes = 2,
                        .device = FindDevice("h200").value()};
  const double v3_embeddings = 2.0 * 129280 * 7168;
  EXPECT_NEAR((v3.ActiveLayerParams() + v3_embeddings) / 1e9, 37.55, 0.01);  // "37B activated"
  EXPECT_NEAR(DeepSeekV3Shape().NumParameters() / 1e9, 671.0, 0.1);
  EXPECT_DOUBLE_EQ(v3.KvBytesPerToken(), 70272);
  // A Llama-3-70B token's KV is 4.7x that.
  const RooflineCost llama{.config = Llama3_70BShape(), .weight_bytes = 2, .kv_bytes = 2};
  EXPECT_NEAR(llama.KvBytesPerToken() / v3.KvBytesPerToken(), 4.66, 0.01);
  // A decode position costs each of the 128 heads a score over 512 + 64
  // values and a sum of 512.
  EXPECT_GT(v3(Decode(1, 4096)), v3(Decode(1, 16)));
  EXPECT_THAT(DeviceKvBlocks(v3, 16, 0.9),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("several devices")));
  const RooflineCost kimi{.config = KimiK2Shape(), .weight_bytes = 2, .kv_bytes = 2};
  EXPECT_NEAR((kimi.ActiveLayerParams() + 2.0 * 163840 * 7168) / 1e9, 32.86, 0.01);
  EXPECT_NEAR(KimiK2Shape().NumParameters() / 1e12, 1.03, 0.01);  // "1T"
  // The stand-in the simulator runs keeps DeepSeek's routing, with a GQA
  // attention of its own, and scales its KV bytes to the target's.
  const ModelConfig stand_in = StandInConfig(DeepSeekV3Shape());
  EXPECT_OK(stand_in.Validate());
  EXPECT_FALSE(stand_in.is_mla());
  EXPECT_EQ(stand_in.moe.n_group, 8);
  EXPECT_DOUBLE_EQ(KvByteScale(DeepSeekV3Shape(), DType::kBF16, DType::kF32),
                   70272.0 / KvBytesPerToken(stand_in, DType::kF32));
}

TEST(Roofline, TheDefaultSharesGiveBackTandemsH100Figures) {
  const RooflineCost cost = H100Llama3_8B();
  // tandem-engine-bench, bf16 weights and KV: decode from a 1024-token
  // prompt over 32 steps (a context of about 1040), prefill in one step.
  struct Point {
    StepShape shape;
    double measured;
  };
  for (const Point& p :
       {Point{Decode(1, 1040), 116.9}, Point{Decode(8, 1040), 704}, Point{Decode(32, 1040), 1402},
        Point{Prefill(512), 31067}, Point{Prefill(2048), 31566}}) {
    const double predicted = TokensPerSecond(cost, p.shape);
    EXPECT_NEAR(predicted / p.measured, 1.0, 0.05)
        << p.shape.tokens << " tokens: " << predicted << " against " << p.measured;
  }
  // A faster memory speeds up decode, not prefill.
  RooflineCost h200 = cost;
  h200.device = FindDevice("h200").value();
  EXPECT_GT(TokensPerSecond(h200, Decode(1, 1040)), 1.3 * TokensPerSecond(cost, Decode(1, 1040)));
  EXPECT_NEAR(TokensPerSecond(h200, Prefill(2048)) / TokensPerSecond(cost, Prefill(2048)), 1.0,
              0.01);
}

TEST(Roofline, DevicePoolsAndRefusals) {
  // (72 GB - 16.06 GB of weights) / (16 tokens x 128 KiB).
  ASSERT_OK_AND_ASSIGN(const int blocks, DeviceKvBlocks(H100Llama3_8B(), 16, 0.9));
  EXPECT_NEAR(blocks, 26674, 2);
  RooflineCost big = H100Llama3_8B();
  big.config = Llama3_70BShape();
  EXPECT_THAT(DeviceKvBlocks(big, 16, 0.9),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("several devices")));
  EXPECT_THAT(DeviceKvBlocks(H100Llama3_8B(), 16, 1.5),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(0, 1]")));
  EXPECT_THAT(FindDevice("tpu"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("h100, h200 or a100")));
}

TEST(StandInModel, KeepsWhatSchedulingReadsAndShrinksTheRest) {
  const ModelConfig target = Llama3_70BShape();
  const ModelConfig stand_in = StandInConfig(target);
  EXPECT_OK(stand_in.Validate());
  EXPECT_EQ(stand_in.vocab_size, target.vocab_size);
  EXPECT_EQ(stand_in.seq_len, target.seq_len);
  EXPECT_EQ(stand_in.n_layers, target.n_layers);
  EXPECT_LT(stand_in.NumParameters(), 2 * int64_t{target.vocab_size} * 2 + 10000);
  // Cut to the ids a workload sends, never above the target's.
  EXPECT_EQ(StandInConfig(target, 512).vocab_size, 512);
  EXPECT_EQ(StandInConfig(target, 1 << 20).vocab_size, target.vocab_size);
  // Llama-3-8B in bf16: 128 KiB of KV per token; the f32 stand-in's 512 B.
  EXPECT_EQ(KvBytesPerToken(Llama3_8BShape(), DType::kBF16), 131072);
  EXPECT_EQ(KvByteScale(Llama3_8BShape(), DType::kBF16, DType::kF32), 256);
}

}  // namespace
}  // namespace tandem::sim
