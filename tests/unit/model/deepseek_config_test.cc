// DeepSeek V2/V3 (and Kimi K2, a V3) read from config.json and their
// tensors: multi-head latent attention, DeepSeek's routing and YaRN, each
// field as the published configs give it, and each impossible combination
// refused naming the field. A small V3-shaped folder loads, its
// multi-token-prediction layer skipped, and in DeepSeek's block-scaled FP8
// loads as the bf16 folder of its widened values.
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/base/float16.h"
#include "common/base/fp8.h"
#include "common/model/hub_model.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/model/synthetic.h"
#include "common/model/tensor_list.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"
#include "tests/unit/model/hub_model_testing.h"

namespace tandem {
namespace {

using Json = nlohmann::json;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// DeepSeek-V3's config.json as published (quantization_config left out).
Json DeepSeekV3Json() {
  return Json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "seq_aux": true, "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
    "v_head_dim": 128, "vocab_size": 129280})");
}

// DeepSeek-V2-Lite's: no q rank, greedy softmax routing, two shared experts.
Json DeepSeekV2LiteJson() {
  return Json::parse(R"({
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false,
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v2", "moe_intermediate_size": 1408, "moe_layer_freq": 1,
    "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false,
    "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
    "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": null,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "seq_aux": true, "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy",
    "torch_dtype": "bfloat16", "use_cache": true, "v_head_dim": 128, "vocab_size": 102400})");
}

std::string DeepSeekDir(const std::string& name, const Json& config) {
  const std::string dir = NewDir(name);
  WriteText(dir + "/config.json", config.dump(2));
  return dir;
}

absl::StatusOr<ModelConfig> Read(const Json& config) {
  return ReadHubConfig(DeepSeekDir("deepseek", config));
}

TEST(DeepSeekConfig, V3IsReadAsPublished) {
  absl::StatusOr<ModelConfig> read = Read(DeepSeekV3Json());
  ASSERT_TRUE(read.ok()) << read.status();
  const ModelConfig& c = *read;
  ASSERT_TRUE(c.is_mla());
  EXPECT_EQ(c.mla.q_lora_rank, 1536);
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_EQ(c.mla.qk_nope_head_dim, 128);
  EXPECT_EQ(c.mla.qk_rope_head_dim, 64);
  EXPECT_EQ(c.mla.v_head_dim, 128);
  EXPECT_EQ(c.q_dim(), 128 * 192);
  EXPECT_EQ(c.attention_out_dim(), 128 * 128);
  EXPECT_EQ(c.rope_dim(), 64);
  EXPECT_EQ(c.rope_layout, RopeLayout::kInterleaved);
  const MoeConfig& m = c.moe;
  EXPECT_EQ(m.n_experts, 256);
  EXPECT_EQ(m.top_k, 8);
  EXPECT_EQ(m.expert_hidden, 2048);
  EXPECT_EQ(m.shared_hidden, 2048);
  EXPECT_FALSE(m.shared_gated);
  EXPECT_EQ(m.scoring, MoeConfig::Scoring::kSigmoid);
  EXPECT_TRUE(m.score_bias);
  EXPECT_EQ(m.n_group, 8);
  EXPECT_EQ(m.topk_group, 4);
  EXPECT_EQ(m.group_score, MoeConfig::GroupScore::kBestTwo);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_FLOAT_EQ(m.routed_scale, 2.5f);
  EXPECT_THAT(m.dense_layers, ElementsAre(0, 1, 2));
  EXPECT_FALSE(c.IsMoeLayer(2));
  EXPECT_TRUE(c.IsMoeLayer(3));
  EXPECT_TRUE(c.IsMoeLayer(60));
  const RopeScaling& r = c.rope_scaling;
  EXPECT_EQ(r.type, RopeScaling::Type::kYarn);
  EXPECT_FLOAT_EQ(r.factor, 40.0f);
  EXPECT_EQ(r.original_max_position, 4096);
  // 1/sqrt(192) * (0.1 ln 40 + 1)^2, from DeepSeek's formula in Python.
  EXPECT_NEAR(c.AttentionScale(), 0.1352337788608801, 1e-6);
  // About 671B weights; 37B of them active per token is the paper's figure,
  // the total counts every expert once (the MTP layer is not the model's).
  EXPECT_NEAR(c.NumParameters() / 1e9, 671.0, 1.0);
}

TEST(DeepSeekConfig, V2LiteIsReadAsPublished) {
  absl::StatusOr<ModelConfig> read = Read(DeepSeekV2LiteJson());
  ASSERT_TRUE(read.ok()) << read.status();
  const ModelConfig& c = *read;
  EXPECT_EQ(c.mla.q_lora_rank, 0);
  EXPECT_EQ(c.moe.scoring, MoeConfig::Scoring::kSoftmax);
  EXPECT_FALSE(c.moe.score_bias);
  EXPECT_EQ(c.moe.n_group, 1);  // greedy: no groups
  EXPECT_EQ(c.moe.shared_hidden, 2 * 1408);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_FLOAT_EQ(c.moe.routed_scale, 1.0f);
  EXPECT_THAT(c.moe.dense_layers, ElementsAre(0));
  EXPECT_NEAR(c.AttentionScale(), 0.1147213867929261, 1e-6);
  EXPECT_NEAR(c.NumParameters() / 1e9, 15.7, 0.1);  // "16B" in its card
  std::vector<TensorSpec> tensors = ModelTensors(c);
  int64_t total = 0;
  for (const TensorSpec& t : tensors) total += t.numel();
  EXPECT_EQ(total, c.NumParameters());
}

TEST(DeepSeekConfig, TheNamedShapesAreThePublishedConfigs) {
  absl::StatusOr<ModelConfig> v3 = Read(DeepSeekV3Json());
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(v3->ShapeString(), DeepSeekV3Shape().ShapeString());
  absl::StatusOr<ModelConfig> lite = Read(DeepSeekV2LiteJson());
  ASSERT_TRUE(lite.ok()) << lite.status();
  EXPECT_EQ(lite->ShapeString(), DeepSeekV2LiteShape().ShapeString());
  EXPECT_OK(KimiK2Shape().Validate());
  EXPECT_OK(NamedShape("deepseek-v3").status());
}

TEST(DeepSeekConfig, V2RoutingScalesOnlyWhatItDoesNotRenormalise) {
  Json j = DeepSeekV2LiteJson();
  j["topk_method"] = "group_limited_greedy";
  j["n_group"] = 8;
  j["topk_group"] = 3;
  j["routed_scaling_factor"] = 16.0;
  absl::StatusOr<ModelConfig> read = Read(j);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->moe.n_group, 8);
  EXPECT_EQ(read->moe.topk_group, 3);
  EXPECT_EQ(read->moe.group_score, MoeConfig::GroupScore::kBest);
  EXPECT_FLOAT_EQ(read->moe.routed_scale, 16.0f);
  j["norm_topk_prob"] = true;
  read = Read(j);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->moe.norm_topk_prob);
  EXPECT_FLOAT_EQ(read->moe.routed_scale, 1.0f);
}

TEST(DeepSeekConfig, YarnFrequenciesFollowDeepSeeksRamp) {
  absl::StatusOr<ModelConfig> read = Read(DeepSeekV3Json());
  ASSERT_TRUE(read.ok()) << read.status();
  const std::vector<float> f = read->RopeFrequencies();
  ASSERT_EQ(f.size(), 32u);
  // DeepSeek's yarn_find_correction_range gives the ramp [10, 23] here;
  // the values are its formula's, computed in Python (double).
  const std::map<int, double> expected = {{0, 1.0},
                                          {5, 0.23713737056616555},
                                          {10, 0.056234132519034905},
                                          {11, 0.03900692656714386},
                                          {15, 0.008334508951020777},
                                          {20, 0.0007905694150420945},
                                          {23, 3.33380358040831e-05},
                                          {24, 2.5e-05},
                                          {31, 3.3338035804083097e-06}};
  for (const auto& [i, want] : expected) {
    EXPECT_NEAR(f[i], want, want * 1e-5) << "pair " << i;
  }
}

TEST(DeepSeekConfig, TensorsOfAV3ShapeAreListedWithLatentAttention) {
  absl::StatusOr<ModelConfig> read = Read(DeepSeekV3Json());
  ASSERT_TRUE(read.ok()) << read.status();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const TensorSpec& t : ModelTensors(*read)) {
    if (t.layer == 3 && t.expert <= 0) shapes[TensorRoleName(t.role)] = t.shape;
  }
  EXPECT_THAT(shapes["wq_a"], ElementsAre(1536, 7168));
  EXPECT_THAT(shapes["q_a_norm"], ElementsAre(1536));
  EXPECT_THAT(shapes["wq_b"], ElementsAre(128 * 192, 1536));
  EXPECT_THAT(shapes["wkv_a"], ElementsAre(512 + 64, 7168));
  EXPECT_THAT(shapes["kv_a_norm"], ElementsAre(512));
  EXPECT_THAT(shapes["wkv_b"], ElementsAre(128 * (128 + 128), 512));
  EXPECT_THAT(shapes["wo"], ElementsAre(7168, 128 * 128));
  EXPECT_THAT(shapes["router_bias"], ElementsAre(256));
  EXPECT_THAT(shapes["shared_gate"], ElementsAre(2048, 7168));
  EXPECT_EQ(shapes.count("wq"), 0u);
  EXPECT_EQ(shapes.count("wk"), 0u);
  EXPECT_EQ(shapes.count("shared_expert_gate"), 0u);  // DeepSeek's are ungated
}

TEST(DeepSeekConfig, RoutingAndAttentionFieldsChangeTheShapeText) {
  absl::StatusOr<ModelConfig> base = Read(DeepSeekV3Json());
  ASSERT_TRUE(base.ok()) << base.status();
  for (const char* key : {"routed_scaling_factor", "topk_group", "kv_lora_rank", "q_lora_rank",
                          "qk_nope_head_dim", "v_head_dim"}) {
    SCOPED_TRACE(key);
    Json j = DeepSeekV3Json();
    j[key] = key == std::string("routed_scaling_factor") ? Json(2.0) : Json(j[key].get<int>() / 2);
    absl::StatusOr<ModelConfig> other = Read(j);
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_NE(other->ShapeString(), base->ShapeString());
  }
  Json j = DeepSeekV3Json();
  j["rope_scaling"]["mscale"] = 0.5;
  j["rope_scaling"]["mscale_all_dim"] = 0.5;
  absl::StatusOr<ModelConfig> other = Read(j);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE(other->ShapeString(), base->ShapeString());
}

TEST(DeepSeekConfig, ImpossibleFieldsAreRefusedByName) {
  struct Case {
    const char* what;
    std::function<void(Json&)> change;
    const char* named;
  };
  const std::vector<Case> cases = {
      {"groups that do not divide the experts", [](Json& j) { j["n_group"] = 3; }, "n_group"},
      {"more groups chosen than there are", [](Json& j) { j["topk_group"] = 9; }, "topk_group"},
      {"too few experts in the chosen groups",
       [](Json& j) {
         j["n_routed_experts"] = 16;
         j["topk_group"] = 2;
       },
       "topk_group"},
      {"V3 with softmax scores", [](Json& j) { j["scoring_func"] = "softmax"; }, "scoring_func"},
      {"V3 with another top-k method", [](Json& j) { j["topk_method"] = "greedy"; }, "topk_method"},
      {"a rank missing", [](Json& j) { j.erase("kv_lora_rank"); }, "kv_lora_rank"},
      {"an odd rope width", [](Json& j) { j["qk_rope_head_dim"] = 63; }, "qk_rope_head_dim"},
      {"a zero value width", [](Json& j) { j["v_head_dim"] = 0; }, "v_head_dim"},
      {"MoE every other layer", [](Json& j) { j["moe_layer_freq"] = 2; }, "moe_layer_freq"},
      {"a rotation rescaled", [](Json& j) { j["rope_scaling"]["mscale"] = 0.5; }, "mscale"},
      {"another rope scaling", [](Json& j) { j["rope_scaling"]["type"] = "dynamic"; },
       "rope_scaling"},
      {"a yarn field DeepSeek has not", [](Json& j) { j["rope_scaling"]["truncate"] = false; },
       "truncate"},
      {"a Qwen field", [](Json& j) { j["decoder_sparse_step"] = 1; }, "decoder_sparse_step"},
      {"q/k/v biases", [](Json& j) { j["attention_bias"] = true; }, "biases"},
      {"uninterleaved rope", [](Json& j) { j["rope_interleave"] = false; }, "rope_interleave"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Json j = DeepSeekV3Json();
    c.change(j);
    EXPECT_THAT(Read(j), StatusIs(absl::StatusCode::kInvalidArgument,
                                  AllOf(HasSubstr("config.json"), HasSubstr(c.named))));
  }
}

TEST(DeepSeekConfig, DeepSeekFieldsAndYarnAreRefusedForOtherArchitectures) {
  Json llama = {{"architectures", {"LlamaForCausalLM"}},
                {"hidden_size", 64},
                {"intermediate_size", 96},
                {"num_hidden_layers", 2},
                {"num_attention_heads", 4},
                {"vocab_size", 256},
                {"max_position_embeddings", 128}};
  Json with_rank = llama;
  with_rank["kv_lora_rank"] = 16;
  EXPECT_THAT(Read(with_rank), StatusIs(absl::StatusCode::kInvalidArgument,
                                        AllOf(HasSubstr("kv_lora_rank"), HasSubstr("Llama"))));
  Json with_yarn = llama;
  with_yarn["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  EXPECT_THAT(Read(with_yarn), StatusIs(absl::StatusCode::kInvalidArgument,
                                        AllOf(HasSubstr("yarn"), HasSubstr("linear, llama3"))));
}

// A V3 of toy size: layer 0 dense, layer 1 with 4 experts in 2 groups, and
// one multi-token-prediction layer after them.
Json TinyV3Json() {
  Json j = DeepSeekV3Json();
  j["hidden_size"] = 32;
  j["intermediate_size"] = 48;
  j["num_hidden_layers"] = 2;
  j["num_attention_heads"] = 2;
  j["num_key_value_heads"] = 2;
  j["q_lora_rank"] = 16;
  j["kv_lora_rank"] = 16;
  j["qk_nope_head_dim"] = 8;
  j["qk_rope_head_dim"] = 4;
  j["v_head_dim"] = 8;
  j["n_routed_experts"] = 4;
  j["num_experts_per_tok"] = 2;
  j["n_group"] = 2;
  j["topk_group"] = 1;
  j["moe_intermediate_size"] = 8;
  j["first_k_dense_replace"] = 1;
  j["vocab_size"] = 64;
  j["max_position_embeddings"] = 64;
  return j;
}

// The hub names of DeepSeek's tensors, written out here as the published
// checkpoints spell them.
std::vector<std::pair<std::string, std::vector<int64_t>>> TinyV3Tensors(int layers, bool shared) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> t = {
      {"model.embed_tokens.weight", {64, 32}},
      {"model.norm.weight", {32}},
      {"lm_head.weight", {64, 32}}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (auto [name, shape] : std::vector<std::pair<const char*, std::vector<int64_t>>>{
             {"input_layernorm.weight", {32}},
             {"post_attention_layernorm.weight", {32}},
             {"self_attn.q_a_proj.weight", {16, 32}},
             {"self_attn.q_a_layernorm.weight", {16}},
             {"self_attn.q_b_proj.weight", {2 * 12, 16}},
             {"self_attn.kv_a_proj_with_mqa.weight", {16 + 4, 32}},
             {"self_attn.kv_a_layernorm.weight", {16}},
             {"self_attn.kv_b_proj.weight", {2 * (8 + 8), 16}},
             {"self_attn.o_proj.weight", {32, 2 * 8}}}) {
      t.push_back({p + name, shape});
    }
    if (l == 0) {
      t.push_back({p + "mlp.gate_proj.weight", {48, 32}});
      t.push_back({p + "mlp.up_proj.weight", {48, 32}});
      t.push_back({p + "mlp.down_proj.weight", {32, 48}});
      continue;
    }
    t.push_back({p + "mlp.gate.weight", {4, 32}});
    t.push_back({p + "mlp.gate.e_score_correction_bias", {4}});
    for (const std::string e : {"mlp.experts.0.", "mlp.experts.1.", "mlp.experts.2.",
                                "mlp.experts.3.", "mlp.shared_experts."}) {
      if (!shared && e == "mlp.shared_experts.") continue;
      t.push_back({p + e + "gate_proj.weight", {8, 32}});
      t.push_back({p + e + "up_proj.weight", {8, 32}});
      t.push_back({p + e + "down_proj.weight", {32, 8}});
    }
  }
  return t;
}

void WriteTinyV3(const std::string& dir, const std::vector<std::string>& extra,
                 bool shared = true) {
  SafetensorsWriter writer;
  float next = 0.0f;
  auto add = [&](const std::string& name, const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float> values(n);
    for (float& v : values) v = (next += 1.0f) / 1024.0f;
    const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
    ASSERT_TRUE(writer
                    .Add(name, SafetensorsDType::kF32, shape,
                         std::span<const uint8_t>(bytes, values.size() * sizeof(float)))
                    .ok())
        << name;
  };
  for (const auto& [name, shape] : TinyV3Tensors(2, shared)) add(name, shape);
  for (const std::string& name : extra) add(name, {4, 4});
  ASSERT_TRUE(writer.WriteFolder(dir).ok());
  Json config = TinyV3Json();
  if (!shared) config["n_shared_experts"] = 0;
  WriteText(dir + "/config.json", config.dump(2));
}

TEST(DeepSeekModel, AV3FolderLoadsWithItsPredictionLayerSkipped) {
  const std::string dir = NewDir("tiny-v3");
  WriteTinyV3(dir, {"model.layers.2.eh_proj.weight", "model.layers.2.self_attn.q_a_proj.weight"});
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadHubModel(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelWeights& m = **w;
  EXPECT_TRUE(m.config.is_mla());
  ASSERT_EQ(m.layers.size(), 2u);
  EXPECT_EQ(m.layers[1].wkv_b.numel, 2 * 16 * 16);
  EXPECT_EQ(m.layers[1].router_bias.numel, 4);
  EXPECT_EQ(m.layers[1].expert_down.size(), 4u);
  EXPECT_EQ(m.layers[0].w1.numel, 48 * 32);
  EXPECT_EQ(m.layers[1].wq.numel, 0);  // the q rank replaces wq
}

TEST(DeepSeekModel, WithoutSharedExpertsTheExpertsAreStillUnderMlp) {
  const std::string dir = NewDir("tiny-v3-unshared");
  WriteTinyV3(dir, {}, /*shared=*/false);
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadHubModel(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->config.moe.shared_hidden, 0);
  EXPECT_EQ((*w)->layers[1].expert_up[3].numel, 8 * 32);
}

TEST(DeepSeekModel, ATensorOfNoLayerIsStillRefused) {
  const std::string dir = NewDir("tiny-v3-extra");
  WriteTinyV3(dir, {"model.layers.3.eh_proj.weight"});  // past the one MTP layer
  EXPECT_THAT(LoadHubModel(dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("model.layers.3.eh_proj.weight")));
}

std::vector<uint8_t> Bf16Bytes(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = Fp32ToBf16(values[i]);
    std::memcpy(&bytes[2 * i], &h, 2);
  }
  return bytes;
}

// Every projection of a V3-shaped folder (attention, dense MLP, routed and
// shared experts) as F8_E4M3 codes with F32 weight_scale_inv blocks, the
// router, norms, embedding and classifier left in bf16 as DeepSeek-V3's
// checkpoint leaves them, and an FP8 prediction layer to skip: the model
// loaded is, weight for weight, the bf16 folder of code * scale.
TEST(DeepSeekModel, AV3FolderInBlockFp8IsTheBf16FolderOfItsWidenedValues) {
  ModelConfig config;
  for (const auto& [name, c] : SmallDeepSeekShapes()) {
    if (name == "deepseek-v3-small") config = c;
  }
  ASSERT_TRUE(config.is_mla());
  ASSERT_OK_AND_ASSIGN(auto original, MakeSyntheticModel(config, 5));
  const std::string fp8_dir = NewDir("v3-fp8"), plain_dir = NewDir("v3-fp8-widened");
  HubWriteOptions options;
  options.dtype = DType::kBF16;
  ASSERT_OK(WriteHubModel(*original, fp8_dir, options));
  ASSERT_OK(WriteHubModel(*original, plain_dir, options));
  const std::map<std::string, TensorData> stored = ReadTensors(fp8_dir);
  std::map<std::string, TensorData> fp8 = stored, plain = stored;
  constexpr int kRows = 16, kCols = 32;  // small blocks, so that matrices span several
  int quantized = 0, multi_block = 0;
  for (const auto& [name, t] : stored) {
    if (t.shape.size() != 2 ||
        !(name.ends_with("_proj.weight") || name.ends_with("_proj_with_mqa.weight"))) {
      continue;
    }
    ASSERT_EQ(t.dtype, SafetensorsDType::kBF16) << name;
    const int rows = static_cast<int>(t.shape[0]), cols = static_cast<int>(t.shape[1]);
    std::vector<float> values(t.bytes.size() / 2);
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, &t.bytes[2 * i], 2);
      values[i] = Bf16ToFp32(h);
    }
    ASSERT_OK_AND_ASSIGN(Fp8Quantized q,
                         QuantizeFp8PerBlock(values.data(), rows, cols, kRows, kCols));
    const int64_t grid_rows = (rows + kRows - 1) / kRows;
    if (grid_rows * q.grid_cols() > 1) ++multi_block;
    std::vector<uint8_t> scales(q.scales.size() * 4);
    std::memcpy(scales.data(), q.scales.data(), scales.size());
    fp8[name] = {SafetensorsDType::kF8E4M3, t.shape, q.codes};
    fp8[name + "_scale_inv"] = {SafetensorsDType::kF32, {grid_rows, q.grid_cols()}, scales};
    DequantizeFp8(q, values.data());
    plain[name] = {SafetensorsDType::kBF16, t.shape, Bf16Bytes(values)};
    ++quantized;
  }
  // 5 attention projections a layer, the dense layer's 3, and each sparse
  // layer's 16 routed experts and shared expert of 3.
  EXPECT_EQ(quantized, 3 * 5 + 3 + 2 * (16 + 1) * 3);
  EXPECT_GT(multi_block, 20);
  const std::string mtp = "model.layers." + std::to_string(config.n_layers) + ".eh_proj.weight";
  fp8[mtp] = {SafetensorsDType::kF8E4M3, {8, 8}, std::vector<uint8_t>(64, 0x38)};
  fp8[mtp + "_scale_inv"] = {SafetensorsDType::kF32, {1, 1}, {0, 0, 128, 63}};  // 1.0f
  WriteTensors(fp8_dir, fp8);
  WriteTensors(plain_dir, plain);
  EditConfig(fp8_dir, [&](Json& c) {
    c["num_nextn_predict_layers"] = 1;
    c["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"activation_scheme", "dynamic"},
                                {"weight_block_size", {kRows, kCols}}};
  });
  ASSERT_OK_AND_ASSIGN(auto from_fp8, LoadHubModel(fp8_dir));
  ASSERT_OK_AND_ASSIGN(auto from_bf16, LoadHubModel(plain_dir));
  EXPECT_EQ(from_fp8->dtype(), DType::kBF16);
  EXPECT_EQ(from_fp8->Fingerprint(), from_bf16->Fingerprint());
  // The codes changed the values: the bf16 folder as first written is
  // another model.
  const std::string bf16_dir = NewDir("v3-bf16");
  ASSERT_OK(WriteHubModel(*original, bf16_dir, options));
  ASSERT_OK_AND_ASSIGN(auto unquantized, LoadHubModel(bf16_dir));
  EXPECT_NE(from_fp8->Fingerprint(), unquantized->Fingerprint());
}

}  // namespace
}  // namespace tandem
