// FP8 checkpoints in the compressed-tensors layout (common/model/hub_fp8.h):
// synthetic Llama folders whose projections are written as F8_E4M3 codes
// with per-channel or per-tensor scales load with every matrix equal, bit
// for bit, to DequantizeFp8 of the codes rounded to the model's type, and
// run like a 16-bit folder holding those values; bad scales, FP8 where it
// does not belong and unsupported quantization configs are refused.
#include "common/model/hub_fp8.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/base/float16.h"
#include "common/base/fp8.h"
#include "common/model/hub_model.h"
#include "common/model/model_weights.h"
#include "common/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/reference_model.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/model/hub_model_testing.h"

namespace tandem {
namespace {

using Json = nlohmann::json;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// kBlock is DeepSeek-V3's layout (quant_method "fp8"), in blocks of
// kBlockRows x kBlockCols, which cut SmallConfig's matrices short at their
// last row and column of blocks.
enum class Strategy { kChannel, kTensor, kBlock };
constexpr int kBlockRows = 24, kBlockCols = 40;

const char* StrategyName(Strategy s) {
  return s == Strategy::kChannel ? "channel" : s == Strategy::kTensor ? "tensor" : "block";
}

std::string ScaleSuffix(Strategy s) { return s == Strategy::kBlock ? "_scale_inv" : "_scale"; }

// quantization_config as DeepSeek-V3's config.json says it, in this test's
// block size.
Json BlockFp8QuantizationConfig() {
  return {{"quant_method", "fp8"},
          {"fmt", "e4m3"},
          {"activation_scheme", "dynamic"},
          {"weight_block_size", {kBlockRows, kBlockCols}}};
}

// quantization_config as llm-compressor writes it for FP8 weights with
// static per-tensor input scales, or the block layout's.
Json Fp8QuantizationConfig(Strategy strategy) {
  if (strategy == Strategy::kBlock) return BlockFp8QuantizationConfig();
  const Json weights = {{"num_bits", 8},
                        {"type", "float"},
                        {"strategy", strategy == Strategy::kChannel ? "channel" : "tensor"},
                        {"symmetric", true},
                        {"dynamic", false},
                        {"group_size", nullptr},
                        {"block_structure", nullptr},
                        {"observer", "minmax"}};
  const Json inputs = {{"num_bits", 8},       {"type", "float"},  {"strategy", "tensor"},
                       {"symmetric", true},   {"dynamic", false}, {"group_size", nullptr},
                       {"observer", "minmax"}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"quantization_status", "compressed"},
          {"kv_cache_scheme", nullptr},
          {"ignore", {"lm_head"}},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", weights},
              {"input_activations", inputs},
              {"output_activations", nullptr}}}}}};
}

std::vector<std::string> ProjectionNames(int n_layers) {
  std::vector<std::string> names;
  for (int l = 0; l < n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* m : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      names.push_back(p + m + ".weight");
    }
  }
  return names;
}

std::vector<uint8_t> F32Bytes(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// f32 values rounded to `dtype` as the loader rounds them (Fp32ToBf16 /
// Fp32ToFp16), as stored bytes.
std::vector<uint8_t> Rounded(const std::vector<float>& values, DType dtype) {
  if (dtype == DType::kF32) return F32Bytes(values);
  std::vector<uint8_t> bytes(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = dtype == DType::kBF16 ? Fp32ToBf16(values[i]) : Fp32ToFp16(values[i]);
    std::memcpy(&bytes[2 * i], &h, 2);
  }
  return bytes;
}

struct Fp8Folder {
  std::string dir;
  // What each projection's codes and scales are, to dequantize in the test.
  std::map<std::string, Fp8Quantized> quantized;
  // The folder's tensors as written (FP8 projections and their scales).
  std::map<std::string, TensorData> tensors;
};

// A synthetic SmallConfig model written in `dtype`, then every projection
// quantized to FP8 with `strategy` (embedding, norms and lm_head stay in
// `dtype`, as llm-compressor leaves them). Per-channel scales are [rows, 1]
// F32; per-tensor ones alternate between [] F32 and [1] BF16, so both
// shapes and a 16-bit scale are read; block scales are F32 weight_scale_inv.
// q_proj gets an input_scale.
Fp8Folder WriteFp8Folder(const std::string& name, Strategy strategy, DType dtype) {
  Fp8Folder f;
  f.dir = WriteModelDir(name, SmallConfig(), dtype);
  f.tensors = ReadTensors(f.dir);
  int i = 0;
  for (const std::string& weight : ProjectionNames(SmallConfig().n_layers)) {
    TensorData& t = f.tensors.at(weight);
    const std::vector<float> values =
        Tensor(t.bytes.data(), *ToDType(t.dtype),
               static_cast<int64_t>(t.bytes.size()) / static_cast<int64_t>(DTypeSize(dtype)))
            .ToFloats();
    const int rows = static_cast<int>(t.shape[0]), cols = static_cast<int>(t.shape[1]);
    auto q = strategy == Strategy::kChannel ? QuantizeFp8PerChannel(values.data(), rows, cols)
             : strategy == Strategy::kTensor
                 ? QuantizeFp8PerTensor(values.data(), rows, cols)
                 : QuantizeFp8PerBlock(values.data(), rows, cols, kBlockRows, kBlockCols);
    EXPECT_OK(q.status());
    if (!q.ok()) return f;
    if (strategy == Strategy::kBlock) {
      const int64_t grid_rows = (rows + kBlockRows - 1) / kBlockRows;
      f.tensors[weight + "_scale_inv"] = {
          SafetensorsDType::kF32, {grid_rows, q->grid_cols()}, F32Bytes(q->scales)};
    } else if (strategy == Strategy::kChannel) {
      f.tensors[weight + "_scale"] = {SafetensorsDType::kF32, {rows, 1}, F32Bytes(q->scales)};
    } else if (i++ % 2 == 0) {
      f.tensors[weight + "_scale"] = {SafetensorsDType::kF32, {}, F32Bytes(q->scales)};
    } else {
      const uint16_t h = Fp32ToBf16(q->scales[0]);
      q->scales[0] = Bf16ToFp32(h);  // the scale as stored
      f.tensors[weight + "_scale"] = {
          SafetensorsDType::kBF16, {1}, {static_cast<uint8_t>(h), static_cast<uint8_t>(h >> 8)}};
    }
    t = {SafetensorsDType::kF8E4M3, t.shape, q->codes};
    f.quantized[weight] = *std::move(q);
  }
  const std::string q_proj = "model.layers.0.self_attn.q_proj.";
  f.tensors[q_proj + "input_scale"] = {
      SafetensorsDType::kF32, {1}, F32Bytes(std::vector<float>{0.0125f})};
  WriteTensors(f.dir, f.tensors);
  EditConfig(f.dir, [&](Json& c) { c["quantization_config"] = Fp8QuantizationConfig(strategy); });
  return f;
}

// The values of `q` widened as the loader must: DequantizeFp8, then rounded.
std::vector<uint8_t> Widened(const Fp8Quantized& q, DType dtype) {
  std::vector<float> values(static_cast<size_t>(q.rows) * q.cols);
  DequantizeFp8(q, values.data());
  return Rounded(values, dtype);
}

const Tensor& Projection(const ModelWeights& w, const std::string& name) {
  const int layer = name[13] - '0';  // "model.layers.N."
  const LayerWeights& l = w.layers[layer];
  if (name.ends_with("q_proj.weight")) return l.wq;
  if (name.ends_with("k_proj.weight")) return l.wk;
  if (name.ends_with("v_proj.weight")) return l.wv;
  if (name.ends_with("o_proj.weight")) return l.wo;
  if (name.ends_with("gate_proj.weight")) return l.w1;
  if (name.ends_with("up_proj.weight")) return l.w3;
  return l.w2;
}

// Up to `n` greedy tokens after `prompt`, from the float64 reference.
std::vector<int32_t> GreedyTokens(const ModelWeights& w, std::vector<int32_t> tokens, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const std::vector<double> last = ::tandem::testing::ReferenceLogits(w, tokens).back();
    int32_t best = 0;
    for (size_t v = 1; v < last.size(); ++v) {
      if (last[v] > last[best]) best = static_cast<int32_t>(v);
    }
    out.push_back(best);
    tokens.push_back(best);
  }
  return out;
}

TEST(HubFp8, ProjectionsAreWidenedBitForBit) {
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (Strategy strategy : {Strategy::kChannel, Strategy::kTensor, Strategy::kBlock}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " " << StrategyName(strategy));
      const Fp8Folder f = WriteFp8Folder("fp8", strategy, dtype);
      ASSERT_OK_AND_ASSIGN(auto model, LoadHubModel(f.dir));
      EXPECT_EQ(model->dtype(), dtype);
      ASSERT_EQ(f.quantized.size(), 14u);
      for (const auto& [name, q] : f.quantized) {
        const Tensor& t = Projection(*model, name);
        ASSERT_EQ(t.dtype, dtype) << name;
        const std::vector<uint8_t> want = Widened(q, dtype);
        ASSERT_EQ(t.size_bytes(), want.size()) << name;
        EXPECT_EQ(std::memcmp(t.data, want.data(), want.size()), 0) << name;
      }
      // Unquantized tensors load as stored.
      const TensorData& embedding = f.tensors.at("model.embed_tokens.weight");
      EXPECT_EQ(
          std::memcmp(model->token_embedding.data, embedding.bytes.data(), embedding.bytes.size()),
          0);
    }
  }
}

// A bf16 folder holding exactly the widened values, without a
// quantization_config, is the same model: same fingerprint (config and
// every weight byte), same greedy tokens.
TEST(HubFp8, RunsLikeA16BitFolderOfTheWidenedValues) {
  for (Strategy strategy : {Strategy::kChannel, Strategy::kTensor, Strategy::kBlock}) {
    SCOPED_TRACE(StrategyName(strategy));
    const Fp8Folder f = WriteFp8Folder("fp8_run", strategy, DType::kBF16);
    std::map<std::string, TensorData> plain = f.tensors;
    for (const auto& [name, q] : f.quantized) {
      plain[name] = {SafetensorsDType::kBF16, plain[name].shape, Widened(q, DType::kBF16)};
      plain.erase(name + ScaleSuffix(strategy));
    }
    plain.erase("model.layers.0.self_attn.q_proj.input_scale");
    const std::string dir = WriteModelDir("fp8_run_bf16", SmallConfig(), DType::kBF16);
    WriteTensors(dir, plain);

    ASSERT_OK_AND_ASSIGN(auto fp8, LoadHubModel(f.dir));
    ASSERT_OK_AND_ASSIGN(auto bf16, LoadHubModel(dir));
    EXPECT_EQ(fp8->Fingerprint(), bf16->Fingerprint());
    const std::vector<int32_t> prompt = {1, 17, 200, 45, 3};
    const std::vector<int32_t> tokens = GreedyTokens(*fp8, prompt, 8);
    EXPECT_EQ(tokens, GreedyTokens(*bf16, prompt, 8));
    // FP8 keeps 3 mantissa bits; the widened model's last logits stay
    // within 10% (of the largest) of the original bf16 model's (5.3% per
    // channel, 5.5% per tensor and 6.2% in blocks measured).
    ASSERT_OK_AND_ASSIGN(auto original,
                         LoadHubModel(WriteModelDir("fp8_run_orig", SmallConfig(), DType::kBF16)));
    const std::vector<double> want = ::tandem::testing::ReferenceLogits(*original, prompt).back();
    const std::vector<double> got = ::tandem::testing::ReferenceLogits(*fp8, prompt).back();
    const std::vector<float> got_f(got.begin(), got.end());
    const double error = ::tandem::testing::MaxRelativeError(got_f, want);
    EXPECT_LT(error, 0.1);
    RecordProperty(std::string("error_") + StrategyName(strategy), std::to_string(error));
  }
}

// Early llm-compressor checkpoints name the same object compression_config.
TEST(HubFp8, CompressionConfigIsTheOlderName) {
  const Fp8Folder f = WriteFp8Folder("fp8_old_name", Strategy::kChannel, DType::kBF16);
  EditConfig(f.dir, [](Json& c) {
    c["compression_config"] = c["quantization_config"];
    c["compression_config"]["format"] = "naive-quantized";
    c.erase("quantization_config");
  });
  EXPECT_OK(LoadHubModel(f.dir).status());
}

TEST(HubFp8, MissingScaleIsRefused) {
  const Fp8Folder f = WriteFp8Folder("fp8_no_scale", Strategy::kChannel, DType::kBF16);
  auto tensors = f.tensors;
  const std::string weight = "model.layers.1.mlp.down_proj.weight";
  // DeepSeek-style checkpoints store weight_scale_inv (per 128x128 block).
  tensors[weight + "_scale_inv"] = tensors.at(weight + "_scale");
  ASSERT_EQ(tensors.erase(weight + "_scale"), 1u);
  WriteTensors(f.dir, tensors);
  EXPECT_THAT(LoadHubModel(f.dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(f.dir), HasSubstr("'" + weight + "'"),
                             HasSubstr(weight + "_scale'"), HasSubstr("has no"))));
}

TEST(HubFp8, ScaleOfWrongShapeOrTypeIsRefused) {
  const Fp8Folder f = WriteFp8Folder("fp8_scale_shape", Strategy::kChannel, DType::kBF16);
  const std::string weight = "model.layers.0.self_attn.k_proj.weight";  // [32, 64]
  const std::string scale = weight + "_scale";
  struct Case {
    SafetensorsDType dtype;
    std::vector<int64_t> shape;
    const char* says;
  };
  const Case cases[] = {
      {SafetensorsDType::kF32, {32, 2}, "[32, 2]"},  // two per row: a group strategy
      {SafetensorsDType::kF32, {64, 1}, "[64, 1]"},  // one per column
      {SafetensorsDType::kF32, {2}, "[2]"},
      {SafetensorsDType::kF32, {1, 1, 1}, "[1, 1, 1]"},
      {SafetensorsDType::kF64, {32, 1}, "F64"},
      {SafetensorsDType::kF8E4M3, {32, 1}, "F8_E4M3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    auto tensors = f.tensors;
    int64_t n = 1;
    for (int64_t s : c.shape) n *= s;
    const std::vector<uint8_t> ones = F32Bytes(std::vector<float>(n, 1.0f));
    tensors[scale] = {
        c.dtype, c.shape,
        std::vector<uint8_t>(ones.begin(), ones.begin() + n * SafetensorsDTypeSize(c.dtype))};
    if (c.dtype == SafetensorsDType::kF8E4M3) {
      tensors[scale].bytes.assign(n, 0x38);  // 1.0
    } else if (c.dtype == SafetensorsDType::kF64) {
      tensors[scale].bytes.assign(n * 8, 0);
    }
    WriteTensors(f.dir, tensors);
    EXPECT_THAT(LoadHubModel(f.dir),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(f.dir), HasSubstr(scale), HasSubstr(c.says))));
  }
}

TEST(HubFp8, NonPositiveOrNonFiniteScaleIsRefused) {
  const Fp8Folder f = WriteFp8Folder("fp8_scale_value", Strategy::kChannel, DType::kBF16);
  const std::string scale = "model.layers.1.self_attn.o_proj.weight_scale";  // [64, 1]
  for (float bad : {0.0f, -0.5f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(bad);
    auto tensors = f.tensors;
    std::vector<float> scales(64, 0.01f);
    scales[17] = bad;
    tensors[scale].bytes = F32Bytes(scales);
    WriteTensors(f.dir, tensors);
    EXPECT_THAT(LoadHubModel(f.dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                              AllOf(HasSubstr(scale), HasSubstr("index 17"),
                                                    HasSubstr("finite and positive"))));
  }
}

// A NaN code, and a product that overflows the target type (f16 tops out
// at 65504; 448 * 1000 does not fit), would put NaN or infinity in the
// model: refused, naming the element.
TEST(HubFp8, CodesThatWidenToNonFiniteValuesAreRefused) {
  const Fp8Folder f = WriteFp8Folder("fp8_nan_code", Strategy::kTensor, DType::kBF16);
  const std::string weight = "model.layers.0.mlp.up_proj.weight";  // [96, 64]
  auto tensors = f.tensors;
  tensors[weight].bytes[3 * 64 + 5] = 0xFF;
  WriteTensors(f.dir, tensors);
  EXPECT_THAT(LoadHubModel(f.dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(weight), HasSubstr("0xff"), HasSubstr("[3, 5]"))));

  const Fp8Folder h = WriteFp8Folder("fp8_f16_overflow", Strategy::kTensor, DType::kF16);
  tensors = h.tensors;
  tensors[weight + "_scale"] = {SafetensorsDType::kF32, {}, F32Bytes(std::vector<float>{1000.0f})};
  tensors[weight].bytes[0] = 0x7E;  // 448
  WriteTensors(h.dir, tensors);
  EXPECT_THAT(LoadHubModel(h.dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                            AllOf(HasSubstr(weight), HasSubstr("[0, 0]"),
                                                  HasSubstr("not a finite f16"))));
}

// FP8 is for matrices: an F8_E4M3 norm (with a scale beside it) is refused
// rather than guessed at.
TEST(HubFp8, OneDimensionalFp8TensorIsRefused) {
  const Fp8Folder f = WriteFp8Folder("fp8_norm", Strategy::kChannel, DType::kBF16);
  auto tensors = f.tensors;
  tensors["model.norm.weight"] = {SafetensorsDType::kF8E4M3, {64}, std::vector<uint8_t>(64, 0x38)};
  tensors["model.norm.weight_scale"] = {
      SafetensorsDType::kF32, {}, F32Bytes(std::vector<float>{1.0f})};
  WriteTensors(f.dir, tensors);
  EXPECT_THAT(LoadHubModel(f.dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.norm.weight"), HasSubstr("weight matrices only"))));
}

TEST(HubFp8, Fp8TensorsNeedAQuantizationConfig) {
  const Fp8Folder f = WriteFp8Folder("fp8_no_config", Strategy::kChannel, DType::kBF16);
  EditConfig(f.dir, [](Json& c) { c.erase("quantization_config"); });
  EXPECT_THAT(LoadHubModel(f.dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.layers.0.self_attn.q_proj.weight"),
                             HasSubstr("F8_E4M3"), HasSubstr("quantization_config"))));
}

// Scales belong to FP8 weights only: beside a bf16 weight one is a tensor
// the model does not use.
TEST(HubFp8, ScaleOfAnUnquantizedWeightIsLeftOver) {
  const std::string dir = WriteModelDir("fp8_stray_scale", SmallConfig(), DType::kBF16);
  auto tensors = ReadTensors(dir);
  tensors["lm_head.weight_scale"] = {
      SafetensorsDType::kF32, {}, F32Bytes(std::vector<float>{1.0f})};
  WriteTensors(dir, tensors);
  EditConfig(dir,
             [](Json& c) { c["quantization_config"] = Fp8QuantizationConfig(Strategy::kTensor); });
  EXPECT_THAT(LoadHubModel(dir),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'lm_head.weight_scale'")));
}

// Every quantization config but compressed-tensors FP8 per tensor or per
// channel is refused by ReadHubConfig and LoadHubModel alike, naming the
// field. Regression: an unknown quantization_config used to be ignored, so
// a GPTQ or bitsandbytes folder failed later on tensor names, and a folder
// whose quantized tensors happened to look 16-bit would have loaded wrong.
TEST(HubFp8, UnsupportedQuantizationConfigsAreRefused) {
  struct Case {
    const char* name;
    std::function<void(Json&)> edit;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"int8", [](Json& q) { q["config_groups"]["group_0"]["weights"]["type"] = "int"; },
       "quantization_config.config_groups.group_0.weights.type"},
      {"int4",
       [](Json& q) {
         q["config_groups"]["group_0"]["weights"]["type"] = "int";
         q["config_groups"]["group_0"]["weights"]["num_bits"] = 4;
       },
       "weights.num_bits"},
      {"group",
       [](Json& q) {
         q["config_groups"]["group_0"]["weights"]["strategy"] = "group";
         q["config_groups"]["group_0"]["weights"]["group_size"] = 128;
       },
       "weights.strategy"},
      {"group_size", [](Json& q) { q["config_groups"]["group_0"]["weights"]["group_size"] = 32; },
       "weights.group_size"},
      {"block",
       [](Json& q) {
         q["config_groups"]["group_0"]["weights"]["strategy"] = "block";
         q["config_groups"]["group_0"]["weights"]["block_structure"] = {128, 128};
       },
       "weights.strategy"},
      {"asymmetric", [](Json& q) { q["config_groups"]["group_0"]["weights"]["symmetric"] = false; },
       "weights.symmetric"},
      {"no_weights", [](Json& q) { q["config_groups"]["group_0"].erase("weights"); },
       "group_0.weights"},
      {"no_groups", [](Json& q) { q.erase("config_groups"); }, "config_groups"},
      {"packed", [](Json& q) { q["format"] = "pack-quantized"; }, "format"},
      {"sparse",
       [](Json& q) {
         q["sparsity_config"] = {{"format", "sparse-24-bitmask"}};
       },
       "sparsity_config"},
      {"fp8_kv",
       [](Json& q) {
         q["kv_cache_scheme"] = {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}};
       },
       "kv_cache_scheme"},
      {"gptq",
       [](Json& q) {
         q = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}};
       },
       "quant_method"},
      {"bitsandbytes",
       [](Json& q) {
         q = {{"quant_method", "bitsandbytes"}, {"load_in_8bit", true}};
       },
       "quant_method"},
      {"no_method", [](Json& q) { q.erase("quant_method"); }, "quant_method"},
  };
  // The weights are plain bf16: the config alone must be refused.
  const std::string dir = WriteModelDir("fp8_configs", SmallConfig(), DType::kBF16);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EditConfig(dir, [&](Json& config) {
      Json q = Fp8QuantizationConfig(Strategy::kChannel);
      c.edit(q);
      config["quantization_config"] = q;
    });
    const auto matches =
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr("config.json"), HasSubstr(c.field),
                       HasSubstr("compressed-tensors"), HasSubstr("\"tensor\" or \"channel\"")));
    EXPECT_THAT(ReadHubConfig(dir), matches);
    EXPECT_THAT(LoadHubModel(dir), matches);
  }
  EditConfig(dir, [](Json& config) { config["quantization_config"] = "fp8"; });
  EXPECT_THAT(ReadHubConfig(dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("'quantization_config' must be an object")));
  // Null is no quantization.
  EditConfig(dir, [](Json& config) { config["quantization_config"] = nullptr; });
  EXPECT_OK(LoadHubModel(dir).status());
}

// Block scales must tile the matrix exactly: k_proj [32, 64] in 24 x 40
// blocks needs [2, 2]; a per-channel or per-tensor scale, or one named
// weight_scale, is refused naming both tensors.
TEST(HubFp8, BlockScalesOfWrongShapeOrNameAreRefused) {
  const Fp8Folder f = WriteFp8Folder("fp8_block_shape", Strategy::kBlock, DType::kBF16);
  const std::string weight = "model.layers.0.self_attn.k_proj.weight";
  const std::string scale = weight + "_scale_inv";
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{1, 2}, {2, 3}, {4}, {2, 2, 1}, {32, 1}, {}}) {
    SCOPED_TRACE(ShapeText(shape));
    auto tensors = f.tensors;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    tensors[scale] = {SafetensorsDType::kF32, shape, F32Bytes(std::vector<float>(n, 0.01f))};
    WriteTensors(f.dir, tensors);
    EXPECT_THAT(LoadHubModel(f.dir),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(scale), HasSubstr("in 24 x 40 blocks needs [2, 2]"))));
  }
  auto tensors = f.tensors;
  tensors[weight + "_scale"] = tensors.at(scale);
  tensors.erase(scale);
  WriteTensors(f.dir, tensors);
  EXPECT_THAT(LoadHubModel(f.dir), StatusIs(absl::StatusCode::kInvalidArgument,
                                            AllOf(HasSubstr("has no '" + scale + "'"))));
}

// quant_method "fp8" without weight_block_size keeps one scale per tensor
// in weight_scale (static input scales beside them are not used).
TEST(HubFp8, Fp8WithoutBlocksReadsWeightScale) {
  const Fp8Folder f = WriteFp8Folder("fp8_no_blocks", Strategy::kTensor, DType::kBF16);
  EditConfig(f.dir, [](Json& c) {
    c["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "static"}};
  });
  ASSERT_OK_AND_ASSIGN(auto model, LoadHubModel(f.dir));
  for (const auto& [name, q] : f.quantized) {
    const Tensor& t = Projection(*model, name);
    const std::vector<uint8_t> want = Widened(q, DType::kBF16);
    ASSERT_EQ(t.size_bytes(), want.size()) << name;
    EXPECT_EQ(std::memcmp(t.data, want.data(), want.size()), 0) << name;
  }
}

TEST(HubFp8, UnsupportedBlockConfigsAreRefused) {
  struct Case {
    const char* name;
    Json value;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"e5m2", {{"fmt", "e5m2"}}, "quantization_config.fmt' is \"e5m2\""},
      {"one_dim", {{"weight_block_size", {128}}}, "weight_block_size' is [128]"},
      {"zero", {{"weight_block_size", {0, 128}}}, "weight_block_size' is [0,128]"},
      {"huge", {{"weight_block_size", {128, 70000}}}, "weight_block_size' is [128,70000]"},
      {"fraction", {{"weight_block_size", {128, 1.5}}}, "weight_block_size' is [128,1.5]"},
      {"text", {{"weight_block_size", "128x128"}}, "weight_block_size' is \"128x128\""},
      {"fp8_kv", {{"kv_cache_scheme", {{"num_bits", 8}}}}, "kv_cache_scheme"},
  };
  const std::string dir = WriteModelDir("fp8_block_configs", SmallConfig(), DType::kBF16);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EditConfig(dir, [&](Json& config) {
      Json q = BlockFp8QuantizationConfig();
      q.update(c.value);
      config["quantization_config"] = q;
    });
    const auto matches =
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr("config.json"), HasSubstr(c.field), HasSubstr("fmt \"e4m3\"")));
    EXPECT_THAT(ReadHubConfig(dir), matches);
    EXPECT_THAT(LoadHubModel(dir), matches);
  }
}

}  // namespace
}  // namespace tandem
