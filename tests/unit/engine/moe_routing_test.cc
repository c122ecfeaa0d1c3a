// ExpertRouter: each token's experts and weights by the rule of its config
// (softmax or sigmoid scores, a bias for the choice only, expert groups,
// renormalisation, a routed scale), against values worked out by hand; and
// the engine's refusal of latent attention on a backend that does not
// compute it.
#include "common/engine/moe_routing.h"

#include <cmath>
#include <memory>
#include <string_view>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/forwarding_backend.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;

struct Routed {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

Routed Route(const MoeConfig& m, const std::vector<float>& logits,
             const std::vector<float>& bias = {}) {
  ExpertRouter router(m);
  Routed r{std::vector<int32_t>(m.top_k), std::vector<float>(m.top_k)};
  router.Route(logits, bias, r.experts, r.weights);
  return r;
}

float Sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
// The logit whose sigmoid is p.
float Logit(double p) { return static_cast<float>(std::log(p / (1.0 - p))); }

TEST(ExpertRouter, SoftmaxTopKTakesTheLowerIndexAmongEquals) {
  MoeConfig m{.n_experts = 4, .top_k = 2, .expert_hidden = 1};
  const Routed r = Route(m, {1.0f, 3.0f, 2.0f, 3.0f});
  EXPECT_THAT(r.experts, ElementsAre(1, 3));
  const double sum = std::exp(-2.0) + 1.0 + std::exp(-1.0) + 1.0;
  EXPECT_THAT(r.weights, Pointwise(FloatNear(1e-6), {1.0 / sum, 1.0 / sum}));
  m.norm_topk_prob = true;
  EXPECT_THAT(Route(m, {1.0f, 3.0f, 2.0f, 3.0f}).weights, Pointwise(FloatNear(1e-6), {0.5f, 0.5f}));
}

TEST(ExpertRouter, ABiasSteersTheChoiceButNotTheWeights) {
  MoeConfig m{.n_experts = 4, .top_k = 2, .expert_hidden = 1, .norm_topk_prob = false};
  m.scoring = MoeConfig::Scoring::kSigmoid;
  m.score_bias = true;
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -1.0f};
  // Unbiased, experts 2 and 1 score best.
  EXPECT_THAT(Route(m, logits, {0, 0, 0, 0}).experts, ElementsAre(2, 1));
  // Expert 0's bias puts it first; its weight is its own score.
  Routed r = Route(m, logits, {3.0f, 0, 0, 0});
  EXPECT_THAT(r.experts, ElementsAre(0, 2));
  EXPECT_THAT(r.weights, Pointwise(FloatNear(1e-6), {Sigmoid(0.0f), Sigmoid(2.0f)}));
  // V3: renormalised, then scaled.
  m.norm_topk_prob = true;
  m.routed_scale = 2.5f;
  r = Route(m, logits, {3.0f, 0, 0, 0});
  const float sum = Sigmoid(0.0f) + Sigmoid(2.0f);
  EXPECT_THAT(r.weights,
              Pointwise(FloatNear(1e-6), {2.5f * Sigmoid(0.0f) / sum, 2.5f * Sigmoid(2.0f) / sum}));
}

// Eight experts in four groups of two; two groups may be chosen.
MoeConfig Grouped(MoeConfig::GroupScore score) {
  MoeConfig m{.n_experts = 8, .top_k = 2, .expert_hidden = 1};
  m.scoring = MoeConfig::Scoring::kSigmoid;
  m.n_group = 4;
  m.topk_group = 2;
  m.group_score = score;
  return m;
}

// Scores by group: {0.9, 0.01} {0.5, 0.5} {0.6, 0.45} {0.1, 0.1}.
std::vector<float> GroupLogits() {
  std::vector<float> z;
  for (double p : {0.9, 0.01, 0.5, 0.5, 0.6, 0.45, 0.1, 0.1}) z.push_back(Logit(p));
  return z;
}

TEST(ExpertRouter, GroupsScoredByTheirBestTwoKeepTheBestExpertOut) {
  // Sums 0.91, 1.0, 1.05, 0.2: groups 2 and 1 go on; expert 0, the best
  // alone, does not.
  const Routed r = Route(Grouped(MoeConfig::GroupScore::kBestTwo), GroupLogits());
  EXPECT_THAT(r.experts, ElementsAre(4, 2));  // 2 and 3 tie at 0.5: the lower
  EXPECT_THAT(r.weights, Pointwise(FloatNear(1e-6), {0.6f, 0.5f}));
}

TEST(ExpertRouter, GroupsScoredByTheirBestExpert) {
  // Bests 0.9, 0.5, 0.6, 0.1: groups 0 and 2.
  EXPECT_THAT(Route(Grouped(MoeConfig::GroupScore::kBest), GroupLogits()).experts,
              ElementsAre(0, 4));
}

TEST(ExpertRouter, GroupsSeeTheBiasedScores) {
  // A bias on expert 7 lifts group 3 above all.
  const Routed r =
      Route(Grouped(MoeConfig::GroupScore::kBestTwo), GroupLogits(), {0, 0, 0, 0, 0, 0, 0, 2.0f});
  EXPECT_THAT(r.experts, ElementsAre(7, 4));
  EXPECT_THAT(r.weights, Pointwise(FloatNear(1e-6), {0.1f, 0.6f}));
}

// A backend that says it has no latent attention (as CUDA's does for now).
class WithoutLatentAttention : public ::tandem::testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::string_view name() const override { return "restricted"; }
  absl::Status SupportsLatentAttention() const override {
    return Backend::SupportsLatentAttention();
  }
};

TEST(EngineLatentAttention, IsRefusedOnABackendWithoutIt) {
  ModelConfig c{.dim = 32,
                .hidden_dim = 48,
                .n_layers = 1,
                .n_heads = 2,
                .n_kv_heads = 2,
                .vocab_size = 64,
                .seq_len = 32};
  c.mla = MlaConfig{.q_lora_rank = 0,
                    .kv_lora_rank = 16,
                    .qk_nope_head_dim = 8,
                    .qk_rope_head_dim = 4,
                    .v_head_dim = 8};
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = MakeSyntheticModel(c, 1);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::unique_ptr<CpuBackend>> backend = CpuBackend::Create();
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_THAT(Engine::Create(**w, std::make_unique<WithoutLatentAttention>(*std::move(backend)),
                             EngineOptions{}),
              StatusIs(absl::StatusCode::kUnimplemented,
                       AllOf(HasSubstr("synthetic"), HasSubstr("multi-head latent attention"),
                             HasSubstr("the restricted backend"), HasSubstr("--backend cpu"))));
}

// DeepSeek-V3's cache holds 61 x (512 + 64) bf16 values a token: 70,272
// bytes against Llama-3-70B's 327,680 (80 layers, 8 KV heads of 128, keys
// and values), 4.7x less to hold and to ship.
TEST(EngineLatentAttention, ItsCacheHoldsTheLatentAndRopeKeyAlone) {
  const ModelConfig v3 = DeepSeekV3Shape();
  const ModelConfig llama70b = Llama3_70BShape();
  EngineOptions options{.block_size = 16, .num_blocks = 4, .kv_dtype = DType::kBF16};
  auto bytes_per_token = [&](const ModelConfig& c) {
    const KvLayout l = KvLayoutFor(c, options);
    return l.block_bytes() * l.n_layers / l.block_size;
  };
  EXPECT_EQ(bytes_per_token(v3), 70272u);
  EXPECT_EQ(bytes_per_token(llama70b), 327680u);
  EXPECT_EQ(static_cast<double>(v3.KvCacheValuesPerToken()) * 2, 70272.0);
  EXPECT_NEAR(327680.0 / 70272.0, 4.66, 0.01);
  const KvLayout l = KvLayoutFor(v3, options);
  EXPECT_TRUE(l.latent);
  EXPECT_EQ(l.kv_dim, 576);
  EXPECT_EQ(l.kv_heads, 1);
}

}  // namespace
}  // namespace tandem
