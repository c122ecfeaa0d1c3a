// Hugging Face config.json reading (ReadHubConfig in common/model/hub_model.h)
// on bad and edge input, each error with its code and a message naming the
// file and the field; the sizes, RoPE scaling, head_dim and sliding window it
// reads. The weights' loader and round trips are in hub_model_test.cc.
#include <cstdint>
#include <string>

#include "common/model/hub_model.h"
#include "common/model/model_config.h"
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
using ::testing::HasSubstr;

// A minimal valid Llama config.json.
Json LlamaConfig() {
  return Json{{"architectures", {"LlamaForCausalLM"}},
              {"hidden_size", 64},
              {"intermediate_size", 96},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"vocab_size", 256},
              {"max_position_embeddings", 128},
              {"rms_norm_eps", 1e-5},
              {"hidden_act", "silu"}};
}

// A folder holding only `config` as config.json.
std::string ConfigDir(const std::string& name, const Json& config) {
  const std::string dir = NewDir(name);
  WriteText(dir + "/config.json", config.dump(2));
  return dir;
}

// ----------------------------------------------------------- ReadHubConfig

TEST(ReadHubConfig, MissingConfigIsNotFound) {
  const std::string dir = NewDir("empty");
  EXPECT_THAT(ReadHubConfig(dir), StatusIs(absl::StatusCode::kNotFound, HasSubstr("config.json")));
  EXPECT_THAT(LoadHubModel(dir), StatusIs(absl::StatusCode::kNotFound, HasSubstr("config.json")));
}

TEST(ReadHubConfig, ConfigThatIsNotJsonObjectIsRefused) {
  for (const std::string text : {"{\"hidden_size\": 64,", "", "[1, 2]", "\"llama\""}) {
    SCOPED_TRACE(text);
    const std::string dir = NewDir("bad");
    WriteText(dir + "/config.json", text);
    EXPECT_THAT(ReadHubConfig(dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                             AllOf(HasSubstr("config.json"), HasSubstr("JSON"))));
  }
}

TEST(ReadHubConfig, UnknownOrMissingArchitectureIsRefused) {
  Json config = LlamaConfig();
  config["architectures"] = {"GPT2LMHeadModel"};
  EXPECT_THAT(ReadHubConfig(ConfigDir("gpt2", config)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("config.json"), HasSubstr("architectures"),
                             HasSubstr("GPT2LMHeadModel"))));
  config["architectures"] = {"LlamaForCausalLM", "MistralForCausalLM"};
  EXPECT_THAT(ReadHubConfig(ConfigDir("two", config)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("architectures")));
  config.erase("architectures");
  EXPECT_THAT(ReadHubConfig(ConfigDir("none", config)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("config.json"), HasSubstr("'architectures' is missing"))));
}

TEST(ReadHubConfig, AcceptsLlamaMistralAndQwen2) {
  for (const char* arch : {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}) {
    SCOPED_TRACE(arch);
    Json config = LlamaConfig();
    config["architectures"] = {arch};
    ASSERT_OK_AND_ASSIGN(ModelConfig c, ReadHubConfig(ConfigDir("ok", config)));
    EXPECT_EQ(c.dim, 64);
    EXPECT_EQ(c.hidden_dim, 96);
    EXPECT_EQ(c.n_layers, 2);
    EXPECT_EQ(c.n_heads, 4);
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.vocab_size, 256);
    EXPECT_EQ(c.seq_len, 128);
    EXPECT_EQ(c.head_dim(), 16);
    EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
    EXPECT_EQ(c.rope_layout, RopeLayout::kHalfSplit);
    EXPECT_FALSE(c.shared_classifier) << "tie_word_embeddings defaults to false";
    // Qwen 2 always has q/k/v biases.
    EXPECT_EQ(c.attention_bias, std::string(arch) == "Qwen2ForCausalLM");
  }
}

TEST(ReadHubConfig, ActivationOtherThanSiluIsRefused) {
  Json config = LlamaConfig();
  config["hidden_act"] = "gelu";
  EXPECT_THAT(
      ReadHubConfig(ConfigDir("gelu", config)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("config.json"), HasSubstr("hidden_act"), HasSubstr("gelu"))));
}

TEST(ReadHubConfig, MlpBiasIsRefused) {
  Json config = LlamaConfig();
  config["mlp_bias"] = true;
  EXPECT_THAT(ReadHubConfig(ConfigDir("mlp_bias", config)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("config.json"), HasSubstr("mlp_bias"))));
  config["mlp_bias"] = false;
  EXPECT_OK(ReadHubConfig(ConfigDir("no_mlp_bias", config)));
  config["mlp_bias"] = "yes";
  EXPECT_THAT(ReadHubConfig(ConfigDir("mlp_bias_string", config)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mlp_bias")));
}

TEST(ReadHubConfig, MissingRequiredSizeIsRefused) {
  for (const char* field : {"hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "vocab_size", "max_position_embeddings"}) {
    SCOPED_TRACE(field);
    Json config = LlamaConfig();
    config.erase(field);
    EXPECT_THAT(ReadHubConfig(ConfigDir("missing", config)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("config.json"), HasSubstr(field), HasSubstr("missing"))));
  }
}

TEST(ReadHubConfig, ImpossibleSizesAreRefused) {
  const struct {
    const char* field;
    Json value;
  } cases[] = {
      {"hidden_size", -64},
      {"hidden_size", 0},
      {"hidden_size", int64_t{1} << 40},
      {"hidden_size", 64.5},
      {"hidden_size", "64"},
      {"intermediate_size", int64_t{1} << 31},
      {"num_hidden_layers", -1},
      {"num_attention_heads", 0},
      {"num_key_value_heads", -2},
      {"vocab_size", 1'000'000'000},
      {"max_position_embeddings", uint64_t{18446744073709551615u}},
      {"head_dim", -16},
      {"rms_norm_eps", -1e-5},
      {"rope_theta", 0},
      {"tie_word_embeddings", "true"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.field << " = " << c.value.dump());
    Json config = LlamaConfig();
    config[c.field] = c.value;
    EXPECT_THAT(ReadHubConfig(ConfigDir("bad", config)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("config.json"), HasSubstr(c.field))));
  }
}

// Sizes each in range but impossible together (ModelConfig::Validate),
// still reported against the file.
TEST(ReadHubConfig, InconsistentSizesAreRefusedNamingTheFile) {
  Json config = LlamaConfig();
  config["hidden_size"] = 66;  // not divisible by 4 heads
  EXPECT_THAT(ReadHubConfig(ConfigDir("indivisible", config)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("config.json"), HasSubstr("n_heads"))));
  config = LlamaConfig();
  config["num_key_value_heads"] = 3;  // 4 heads in groups of 3
  EXPECT_THAT(ReadHubConfig(ConfigDir("groups", config)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("config.json"), HasSubstr("n_kv_heads"))));
  config = LlamaConfig();
  config["head_dim"] = 15;  // RoPE rotates pairs
  EXPECT_THAT(ReadHubConfig(ConfigDir("odd", config)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("config.json"), HasSubstr("odd"))));
}

TEST(ReadHubConfig, UnsupportedRopeScalingIsRefused) {
  for (const char* key : {"rope_type", "type"}) {
    for (const char* type : {"yarn", "dynamic", "longrope"}) {
      SCOPED_TRACE(::testing::Message() << key << " = " << type);
      Json config = LlamaConfig();
      config["rope_scaling"] = {{key, type}, {"factor", 4.0}};
      EXPECT_THAT(
          ReadHubConfig(ConfigDir("rope", config)),
          StatusIs(absl::StatusCode::kInvalidArgument,
                   AllOf(HasSubstr("config.json"), HasSubstr("rope_scaling"), HasSubstr(type))));
    }
  }
  Json config = LlamaConfig();
  config["rope_scaling"] = {{"factor", 4.0}};
  EXPECT_THAT(ReadHubConfig(ConfigDir("untyped", config)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rope_scaling")));
  config["rope_scaling"] = "linear";
  EXPECT_THAT(ReadHubConfig(ConfigDir("string", config)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rope_scaling")));
}

TEST(ReadHubConfig, ReadsLinearAndLlama3Scaling) {
  Json config = LlamaConfig();
  config["rope_scaling"] = nullptr;
  ASSERT_OK_AND_ASSIGN(ModelConfig none, ReadHubConfig(ConfigDir("null", config)));
  EXPECT_EQ(none.rope_scaling.type, RopeScaling::Type::kNone);

  config["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ASSERT_OK_AND_ASSIGN(ModelConfig linear, ReadHubConfig(ConfigDir("linear", config)));
  EXPECT_EQ(linear.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(linear.rope_scaling.factor, 2.0f);

  config["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 32.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 8192}};
  ASSERT_OK_AND_ASSIGN(ModelConfig llama3, ReadHubConfig(ConfigDir("llama3", config)));
  EXPECT_EQ(llama3.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(llama3.rope_scaling.factor, 32.0f);
  EXPECT_EQ(llama3.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(llama3.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(llama3.rope_scaling.original_max_position, 8192);
}

TEST(ReadHubConfig, Llama3ScalingWithoutItsFactorsIsRefused) {
  const Json full = {{"rope_type", "llama3"},
                     {"factor", 32.0},
                     {"low_freq_factor", 1.0},
                     {"high_freq_factor", 4.0},
                     {"original_max_position_embeddings", 8192}};
  for (const char* field :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    SCOPED_TRACE(field);
    Json config = LlamaConfig();
    config["rope_scaling"] = full;
    config["rope_scaling"].erase(field);
    EXPECT_THAT(ReadHubConfig(ConfigDir("llama3", config)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("config.json"), HasSubstr(field))));
  }
  // Present but impossible: low above high.
  Json config = LlamaConfig();
  config["rope_scaling"] = full;
  config["rope_scaling"]["low_freq_factor"] = 8.0;
  EXPECT_THAT(ReadHubConfig(ConfigDir("inverted", config)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("config.json"), HasSubstr("low_freq_factor"))));
}

TEST(ReadHubConfig, HeadDimEqualToDimOverHeadsIsTheDefault) {
  Json config = LlamaConfig();
  config["head_dim"] = 16;  // 64 / 4
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ReadHubConfig(ConfigDir("head_dim", config)));
  EXPECT_EQ(c.head_size, 0);
  EXPECT_EQ(c.head_dim(), 16);
  config["head_dim"] = nullptr;  // as some configs write it
  ASSERT_OK_AND_ASSIGN(ModelConfig null_head, ReadHubConfig(ConfigDir("null", config)));
  EXPECT_EQ(null_head.head_dim(), 16);
}

// Mistral Nemo: head_dim 128 with hidden_size 5120 and 32 heads, so the
// q projection is 4096 wide, not 5120.
TEST(ReadHubConfig, HeadDimDifferentFromDimOverHeadsIsUsed) {
  Json config = LlamaConfig();
  config["architectures"] = {"MistralForCausalLM"};
  config["hidden_size"] = 5120;
  config["intermediate_size"] = 14336;
  config["num_hidden_layers"] = 40;
  config["num_attention_heads"] = 32;
  config["num_key_value_heads"] = 8;
  config["head_dim"] = 128;
  config["vocab_size"] = 131072;
  config["max_position_embeddings"] = 1024000;
  config["sliding_window"] = nullptr;
  ASSERT_OK_AND_ASSIGN(ModelConfig c, ReadHubConfig(ConfigDir("nemo", config)));
  EXPECT_EQ(c.head_size, 128);
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.seq_len, 1024000) << "a null sliding_window does not cap";
}

// Mistral 7B v0.1 attends within a 4096 window: full attention is exact only
// up to it, so the context is capped there. Qwen 2 configs carry a
// sliding_window too but say use_sliding_window false.
TEST(ReadHubConfig, SlidingWindowCapsContextUnlessDisabled) {
  Json config = LlamaConfig();
  config["architectures"] = {"MistralForCausalLM"};
  config["max_position_embeddings"] = 32768;
  config["sliding_window"] = 4096;
  ASSERT_OK_AND_ASSIGN(ModelConfig mistral, ReadHubConfig(ConfigDir("mistral", config)));
  EXPECT_EQ(mistral.seq_len, 4096);

  config["sliding_window"] = 65536;  // wider than the context: no cap
  ASSERT_OK_AND_ASSIGN(ModelConfig wide, ReadHubConfig(ConfigDir("wide", config)));
  EXPECT_EQ(wide.seq_len, 32768);

  config["sliding_window"] = 4096;
  config["use_sliding_window"] = false;
  ASSERT_OK_AND_ASSIGN(ModelConfig off, ReadHubConfig(ConfigDir("off", config)));
  EXPECT_EQ(off.seq_len, 32768);

  config["architectures"] = {"Qwen2ForCausalLM"};
  config.erase("use_sliding_window");  // Qwen 2's default is off
  ASSERT_OK_AND_ASSIGN(ModelConfig qwen, ReadHubConfig(ConfigDir("qwen", config)));
  EXPECT_EQ(qwen.seq_len, 32768);

  config["sliding_window"] = -1;
  EXPECT_THAT(ReadHubConfig(ConfigDir("negative", config)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("config.json"), HasSubstr("sliding_window"))));
}
}  // namespace
}  // namespace tandem
