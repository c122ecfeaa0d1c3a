// LoadHubModel (common/model/hub_model.h) on bad and edge weights, each error
// naming the file and the tensor; and WriteHubModel -> ReadHubConfig /
// LoadHubModel round trips of synthetic models (config.json: hub_config_test.cc).
#include "common/model/hub_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/model/safetensors.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/model/hub_model_testing.h"

namespace tandem {
namespace {

using Json = nlohmann::json;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// ------------------------------------------------------------ LoadHubModel

TEST(LoadHubModel, WrittenFolderLoads) {
  const std::string dir = WriteModelDir("ok", SmallConfig(), DType::kBF16);
  ASSERT_OK_AND_ASSIGN(auto model, LoadHubModel(dir));
  EXPECT_EQ(model->dtype(), DType::kBF16);
  EXPECT_EQ(model->layers.size(), 2u);
  EXPECT_EQ(model->source, dir);
}

// hidden_size says 32 but the embedding is [256, 64]: the error names the
// tensor and both shapes.
TEST(LoadHubModel, ConfigContradictingTensorShapesIsRefused) {
  const std::string dir = WriteModelDir("shape", SmallConfig(), DType::kBF16);
  EditConfig(dir, [](Json& c) {
    c["hidden_size"] = 32;
    c.erase("head_dim");
  });
  EXPECT_THAT(LoadHubModel(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(dir), HasSubstr("model.embed_tokens.weight"),
                             HasSubstr("[256, 64]"), HasSubstr("[256, 32]"))));
  // Fewer KV heads than the k projection has rows.
  EditConfig(dir, [](Json& c) {
    c["hidden_size"] = 64;
    c["num_key_value_heads"] = 1;
  });
  EXPECT_THAT(LoadHubModel(dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("model.layers.0.self_attn.k_proj.weight"),
                                                HasSubstr("[32, 64]"), HasSubstr("[16, 64]"))));
}

TEST(LoadHubModel, MissingTensorIsRefused) {
  const std::string dir = WriteModelDir("missing", SmallConfig(), DType::kBF16);
  auto tensors = ReadTensors(dir);
  ASSERT_EQ(tensors.erase("model.layers.1.mlp.up_proj.weight"), 1u);
  WriteTensors(dir, tensors);
  EXPECT_THAT(LoadHubModel(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(dir), HasSubstr("model.layers.1.mlp.up_proj.weight"))));
}

// Layers the config does not count are tensors left over, not ignored.
TEST(LoadHubModel, UnexpectedTensorIsRefused) {
  const std::string dir = WriteModelDir("extra", SmallConfig(), DType::kBF16);
  auto tensors = ReadTensors(dir);
  tensors["model.layers.0.self_attn.q_norm.weight"] = {
      SafetensorsDType::kBF16, {16}, std::vector<uint8_t>(32, 0)};
  WriteTensors(dir, tensors);
  EXPECT_THAT(LoadHubModel(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(dir), HasSubstr("model.layers.0.self_attn.q_norm.weight"))));

  const std::string fewer = WriteModelDir("fewer_layers", SmallConfig(), DType::kBF16);
  EditConfig(fewer, [](Json& c) { c["num_hidden_layers"] = 1; });
  EXPECT_THAT(LoadHubModel(fewer),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.layers.1.")));
}

// Older checkpoints store RoPE's inverse frequencies; the model computes
// its own.
TEST(LoadHubModel, RotaryInvFreqIsTolerated) {
  const std::string dir = WriteModelDir("inv_freq", SmallConfig(), DType::kBF16);
  auto tensors = ReadTensors(dir);
  for (int l = 0; l < 2; ++l) {
    tensors["model.layers." + std::to_string(l) + ".self_attn.rotary_emb.inv_freq"] = {
        SafetensorsDType::kF32, {8}, std::vector<uint8_t>(32, 0)};
  }
  WriteTensors(dir, tensors);
  EXPECT_OK(LoadHubModel(dir));
}

TEST(LoadHubModel, TiedConfigAcceptsIdenticalLmHeadOnly) {
  ModelConfig config = SmallConfig();
  config.shared_classifier = true;
  const std::string dir = WriteModelDir("tied", config, DType::kBF16);
  auto tensors = ReadTensors(dir);
  ASSERT_EQ(tensors.count("lm_head.weight"), 0u);
  ASSERT_OK_AND_ASSIGN(auto plain, LoadHubModel(dir));
  EXPECT_EQ(plain->classifier.data, plain->token_embedding.data);

  tensors["lm_head.weight"] = tensors.at("model.embed_tokens.weight");
  WriteTensors(dir, tensors);
  ASSERT_OK_AND_ASSIGN(auto with_copy, LoadHubModel(dir));
  EXPECT_EQ(with_copy->classifier.data, with_copy->token_embedding.data);
  EXPECT_EQ(with_copy->Fingerprint(), plain->Fingerprint());

  tensors["lm_head.weight"].bytes[10] ^= 1;
  WriteTensors(dir, tensors);
  EXPECT_THAT(LoadHubModel(dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr(dir), HasSubstr("lm_head.weight"),
                                                HasSubstr("tie_word_embeddings"))));
}

TEST(LoadHubModel, UntiedConfigNeedsLmHead) {
  const std::string dir = WriteModelDir("untied", SmallConfig(), DType::kBF16);
  auto tensors = ReadTensors(dir);
  ASSERT_EQ(tensors.erase("lm_head.weight"), 1u);
  WriteTensors(dir, tensors);
  EXPECT_THAT(LoadHubModel(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lm_head.weight")));
}

TEST(LoadHubModel, MixedMatrixTypesAreRefused) {
  const std::string dir = WriteModelDir("mixed", SmallConfig(), DType::kBF16);
  auto tensors = ReadTensors(dir);
  TensorData& down = tensors.at("model.layers.0.mlp.down_proj.weight");
  std::vector<uint8_t> widened(down.bytes.size() * 2);
  for (size_t i = 0; i < down.bytes.size() / 2; ++i) {
    const uint32_t bits = uint32_t{down.bytes[2 * i]} << 16 | uint32_t{down.bytes[2 * i + 1]} << 24;
    std::memcpy(&widened[4 * i], &bits, 4);
  }
  down = {SafetensorsDType::kF32, down.shape, widened};
  WriteTensors(dir, tensors);
  EXPECT_THAT(LoadHubModel(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(dir), HasSubstr("model.layers.0.mlp.down_proj.weight"),
                             HasSubstr("f32"), HasSubstr("bf16"))));
}

// Norms are not matrices: an f32 norm beside bf16 matrices is fine.
TEST(LoadHubModel, NormsMayHaveTheirOwnType) {
  const std::string dir = WriteModelDir("norm_type", SmallConfig(), DType::kBF16);
  auto tensors = ReadTensors(dir);
  TensorData& norm = tensors.at("model.norm.weight");
  std::vector<uint8_t> widened(norm.bytes.size() * 2, 0);
  for (size_t i = 0; i < norm.bytes.size() / 2; ++i) {
    widened[4 * i + 2] = norm.bytes[2 * i];
    widened[4 * i + 3] = norm.bytes[2 * i + 1];
  }
  norm = {SafetensorsDType::kF32, norm.shape, widened};
  WriteTensors(dir, tensors);
  ASSERT_OK_AND_ASSIGN(auto model, LoadHubModel(dir));
  EXPECT_EQ(model->rms_final.dtype, DType::kF32);
  EXPECT_EQ(model->dtype(), DType::kBF16);
}

TEST(LoadHubModel, UnsupportedTensorTypeIsRefused) {
  const std::string dir = WriteModelDir("i64", SmallConfig(), DType::kBF16);
  auto tensors = ReadTensors(dir);
  tensors["model.norm.weight"] = {SafetensorsDType::kI64, {64}, std::vector<uint8_t>(64 * 8, 0)};
  WriteTensors(dir, tensors);
  EXPECT_THAT(LoadHubModel(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(dir), HasSubstr("model.norm.weight"), HasSubstr("I64"))));
}

// Other writers need not align tensors: a file written by hand with a
// header of odd length puts every tensor at an odd address. The loader must
// copy those (a misaligned f32 or bf16 load is undefined behaviour) and
// give the same weights.
TEST(LoadHubModel, MisalignedTensorsAreCopiedIntact) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::string dir = WriteModelDir("misaligned", SmallConfig(), dtype);
    ASSERT_OK_AND_ASSIGN(auto aligned, LoadHubModel(dir));
    const std::string fingerprint = aligned->Fingerprint();
    aligned.reset();

    Json header = Json::object();
    std::string data;
    for (const auto& [name, t] : ReadTensors(dir)) {
      header[name] = {{"dtype", std::string(SafetensorsDTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
      data.append(t.bytes.begin(), t.bytes.end());
    }
    std::string text = header.dump();
    if (text.size() % 2 == 0) text += ' ';  // 8 + odd: data starts at an odd offset
    std::string file(8, '\0');
    const uint64_t length = text.size();
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(length >> (8 * i));
    WriteText(dir + "/" + kSafetensorsSingleFile, file + text + data);

    ASSERT_OK_AND_ASSIGN(auto loaded, LoadHubModel(dir));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(loaded->token_embedding.data) % DTypeSize(dtype), 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(loaded->layers[1].w2.data) % DTypeSize(dtype), 0u);
    EXPECT_EQ(loaded->Fingerprint(), fingerprint);
  }
}

// Qwen 2's projections have biases whatever attention_bias says; a folder
// without them is not a Qwen 2 model.
TEST(LoadHubModel, Qwen2RequiresProjectionBiases) {
  ModelConfig config = SmallConfig();
  config.attention_bias = true;
  const std::string dir = WriteModelDir("qwen2", config, DType::kBF16);
  ASSERT_EQ(ReadJsonFile(dir + "/config.json")["architectures"][0], "Qwen2ForCausalLM");
  ASSERT_OK_AND_ASSIGN(auto model, LoadHubModel(dir));
  EXPECT_TRUE(model->config.attention_bias);
  EXPECT_EQ(model->layers[1].bk.size(), 32u);

  auto tensors = ReadTensors(dir);
  ASSERT_EQ(tensors.erase("model.layers.1.self_attn.k_proj.bias"), 1u);
  WriteTensors(dir, tensors);
  EXPECT_THAT(LoadHubModel(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(dir), HasSubstr("model.layers.1.self_attn.k_proj.bias"))));

  // A Llama folder relabelled Qwen 2 has no biases at all.
  const std::string llama = WriteModelDir("llama_as_qwen2", SmallConfig(), DType::kBF16);
  EditConfig(llama, [](Json& c) {
    c["architectures"] = {"Qwen2ForCausalLM"};
    c.erase("attention_bias");
  });
  EXPECT_THAT(LoadHubModel(llama), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("model.layers.0.self_attn.q_proj.bias")));
}

// --------------------------------------------------------------- Round trips

// Element i of a tensor rounded to `dtype` (ties to even), as a double.
double RoundTo(DType dtype, float x) {
  if (dtype == DType::kF32 || x == 0.0f) return x;
  const int mantissa_bits = dtype == DType::kBF16 ? 7 : 10;
  const int min_exp = dtype == DType::kBF16 ? -126 : -14;
  int e2;
  std::frexp(x, &e2);
  const double quantum = std::ldexp(1.0, std::max(e2 - 1, min_exp) - mantissa_bits);
  return std::nearbyint(x / quantum) * quantum;
}

// `got` holds `want` stored as `dtype`: the same bytes for f32, the values
// rounded otherwise. `row_of` maps a stored row to the original row (the
// RoPE permutation of q/k), `cols` elements a row.
void ExpectStored(const Tensor& got, const Tensor& want, DType dtype, const std::string& name,
                  const std::function<int64_t(int64_t)>& row_of = nullptr, int64_t cols = 1) {
  SCOPED_TRACE(name);
  ASSERT_EQ(got.dtype, dtype);
  ASSERT_EQ(got.numel, want.numel);
  int wrong = 0;
  for (int64_t i = 0; i < got.numel; ++i) {
    const int64_t from = row_of ? row_of(i / cols) * cols + i % cols : i;
    if (got.At(i) != RoundTo(dtype, want.At(from)) && ++wrong <= 3) {
      ADD_FAILURE() << "element " << i << " is " << got.At(i) << ", expected "
                    << RoundTo(dtype, want.At(from));
    }
  }
  EXPECT_EQ(wrong, 0);
}

void ExpectSameConfig(const ModelConfig& got, const ModelConfig& want) {
  EXPECT_EQ(got.dim, want.dim);
  EXPECT_EQ(got.hidden_dim, want.hidden_dim);
  EXPECT_EQ(got.n_layers, want.n_layers);
  EXPECT_EQ(got.n_heads, want.n_heads);
  EXPECT_EQ(got.n_kv_heads, want.n_kv_heads);
  EXPECT_EQ(got.vocab_size, want.vocab_size);
  EXPECT_EQ(got.seq_len, want.seq_len);
  EXPECT_EQ(got.rope_theta, want.rope_theta);
  EXPECT_EQ(got.norm_eps, want.norm_eps);
  EXPECT_EQ(got.shared_classifier, want.shared_classifier);
  EXPECT_EQ(got.head_dim(), want.head_dim());
  EXPECT_EQ(got.q_dim(), want.q_dim());
  EXPECT_EQ(got.attention_bias, want.attention_bias);
  EXPECT_EQ(got.rope_layout, RopeLayout::kHalfSplit);
  EXPECT_EQ(got.rope_scaling.type, want.rope_scaling.type);
  EXPECT_EQ(got.rope_scaling.factor, want.rope_scaling.factor);
  if (want.rope_scaling.type == RopeScaling::Type::kLlama3) {
    EXPECT_EQ(got.rope_scaling.low_freq_factor, want.rope_scaling.low_freq_factor);
    EXPECT_EQ(got.rope_scaling.high_freq_factor, want.rope_scaling.high_freq_factor);
    EXPECT_EQ(got.rope_scaling.original_max_position, want.rope_scaling.original_max_position);
  }
}

struct RoundTripCase {
  const char* name;
  ModelConfig config;
};

std::vector<RoundTripCase> RoundTripCases() {
  std::vector<RoundTripCase> cases;
  // Llama 3 style: GQA, tied, llama3 scaling, eps and theta that are not
  // short decimals in binary.
  ModelConfig llama = SmallConfig();
  llama.shared_classifier = true;
  llama.norm_eps = 1e-6f;
  llama.rope_theta = 500000.0f;
  llama.rope_scaling = {.type = RopeScaling::Type::kLlama3,
                        .factor = 32.0f,
                        .low_freq_factor = 1.0f,
                        .high_freq_factor = 4.0f,
                        .original_max_position = 8192};
  cases.push_back({"llama3", llama});
  // Qwen 2 style: q/k/v biases, untied, linear scaling.
  ModelConfig qwen = SmallConfig();
  qwen.attention_bias = true;
  qwen.rope_theta = 1000000.0f;
  qwen.rope_scaling = {.type = RopeScaling::Type::kLinear, .factor = 2.5f};
  cases.push_back({"qwen2", qwen});
  // Mistral Nemo style: head_size 24 with dim 64 and 4 heads (q_dim 96).
  ModelConfig nemo = SmallConfig();
  nemo.head_size = 24;
  nemo.n_kv_heads = 1;
  cases.push_back({"nemo", nemo});
  return cases;
}

// WriteHubModel then LoadHubModel gives the same config and weights: bytes
// for f32, values rounded to the type for f16 and bf16 (norms and biases,
// f32 in the synthetic model, are written in the folder's type too).
TEST(HubRoundTrip, ConfigAndWeightsSurvive) {
  for (const RoundTripCase& c : RoundTripCases()) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << c.name << " " << DTypeName(dtype));
      ASSERT_OK_AND_ASSIGN(auto original, MakeSyntheticModel(c.config, 11, DType::kF32));
      const std::string dir = NewDir(std::string(c.name) + "_" + std::string(DTypeName(dtype)));
      HubWriteOptions options;
      options.dtype = dtype;
      options.eos_ids = {2, 5};
      ASSERT_OK(WriteHubModel(*original, dir, options));

      ASSERT_OK_AND_ASSIGN(ModelConfig config, ReadHubConfig(dir));
      ExpectSameConfig(config, c.config);
      std::ifstream generation(dir + "/generation_config.json");
      EXPECT_EQ(nlohmann::json::parse(generation)["eos_token_id"], nlohmann::json({2, 5}));

      ASSERT_OK_AND_ASSIGN(auto loaded, LoadHubModel(dir));
      ExpectSameConfig(loaded->config, c.config);
      ExpectStored(loaded->token_embedding, original->token_embedding, dtype, "embedding");
      ExpectStored(loaded->rms_final, original->rms_final, dtype, "rms_final");
      if (c.config.shared_classifier) {
        EXPECT_EQ(loaded->classifier.data, loaded->token_embedding.data);
      } else {
        ExpectStored(loaded->classifier, original->classifier, dtype, "classifier");
      }
      for (int l = 0; l < c.config.n_layers; ++l) {
        const LayerWeights& got = loaded->layers[l];
        const LayerWeights& want = original->layers[l];
        const std::string at = "layer " + std::to_string(l) + " ";
        ExpectStored(got.rms_att, want.rms_att, dtype, at + "rms_att");
        ExpectStored(got.wq, want.wq, dtype, at + "wq");
        ExpectStored(got.wk, want.wk, dtype, at + "wk");
        ExpectStored(got.wv, want.wv, dtype, at + "wv");
        ExpectStored(got.wo, want.wo, dtype, at + "wo");
        ExpectStored(got.rms_ffn, want.rms_ffn, dtype, at + "rms_ffn");
        ExpectStored(got.w1, want.w1, dtype, at + "w1");
        ExpectStored(got.w2, want.w2, dtype, at + "w2");
        ExpectStored(got.w3, want.w3, dtype, at + "w3");
        if (c.config.attention_bias) {
          ExpectStored(got.bq, want.bq, dtype, at + "bq");
          ExpectStored(got.bk, want.bk, dtype, at + "bk");
          ExpectStored(got.bv, want.bv, dtype, at + "bv");
        } else {
          EXPECT_TRUE(got.bq.empty() && got.bk.empty() && got.bv.empty());
        }
      }
      if (dtype == DType::kF32) {
        EXPECT_EQ(loaded->Fingerprint(), original->Fingerprint())
            << "same config and bytes must give the same fingerprint";
      }
    }
  }
}

// A model with interleaved RoPE (llama2.c, GGUF) is written with the q/k
// rows of each head reordered for half-split RoPE, as hub checkpoints store
// them: stored row j * head_dim/2 + i is original row 2i + j.
TEST(HubRoundTrip, InterleavedModelIsWrittenWithPermutedQkRows) {
  ModelConfig config = SmallConfig();
  config.rope_layout = RopeLayout::kInterleaved;
  config.attention_bias = true;
  ASSERT_OK_AND_ASSIGN(auto original, MakeSyntheticModel(config, 3, DType::kF32));
  const std::string dir = NewDir("interleaved");
  HubWriteOptions options;
  options.dtype = DType::kF32;
  ASSERT_OK(WriteHubModel(*original, dir, options));
  ASSERT_OK_AND_ASSIGN(auto loaded, LoadHubModel(dir));
  EXPECT_EQ(loaded->config.rope_layout, RopeLayout::kHalfSplit);
  const int hd = config.head_dim(), half = hd / 2;
  const auto permuted = [hd, half](int64_t row) {
    const int64_t head = row / hd, within = row % hd;
    return head * hd + 2 * (within % half) + within / half;
  };
  for (int l = 0; l < config.n_layers; ++l) {
    const LayerWeights& got = loaded->layers[l];
    const LayerWeights& want = original->layers[l];
    ExpectStored(got.wq, want.wq, DType::kF32, "wq", permuted, config.dim);
    ExpectStored(got.wk, want.wk, DType::kF32, "wk", permuted, config.dim);
    ExpectStored(got.bq, want.bq, DType::kF32, "bq", permuted, 1);
    ExpectStored(got.bk, want.bk, DType::kF32, "bk", permuted, 1);
    ExpectStored(got.wv, want.wv, DType::kF32, "wv");  // not rotated: as is
    ExpectStored(got.bv, want.bv, DType::kF32, "bv");
  }
}

// The fingerprint depends on the model, not on how its files are split, and
// changes with any one weight.
TEST(HubRoundTrip, FingerprintIgnoresShardingAndSeesOneWeight) {
  ModelConfig config = SmallConfig();
  const std::string single = WriteModelDir("single", config, DType::kBF16);
  const std::string sharded = WriteModelDir("sharded", config, DType::kBF16, 8192);
  ASSERT_TRUE(std::filesystem::exists(sharded + "/" + kSafetensorsIndexFile));
  ASSERT_FALSE(std::filesystem::exists(sharded + "/" + kSafetensorsSingleFile));
  ASSERT_OK_AND_ASSIGN(auto a, LoadHubModel(single));
  ASSERT_OK_AND_ASSIGN(auto b, LoadHubModel(sharded));
  EXPECT_EQ(a->Fingerprint(), b->Fingerprint());

  auto tensors = ReadTensors(single);
  tensors.at("model.layers.1.self_attn.v_proj.weight").bytes[100] ^= 0x01;
  WriteTensors(single, tensors);
  ASSERT_OK_AND_ASSIGN(auto changed, LoadHubModel(single));
  EXPECT_NE(changed->Fingerprint(), b->Fingerprint());
}

}  // namespace
}  // namespace tandem
