#include "common/model/gguf_model.h"

#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/gguf.h"
#include "common/model/gguf_writer.h"
#include "common/model/llama2c_checkpoint.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/model/weights_testing.h"

namespace tandem {
namespace {

using ::tandem::testing::ExpectSameWeights;
using ::tandem::testing::ExpectWeightsMap;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) { return ::tandem::testing::TempDir() + "/" + name; }

float RoundThroughFp16(float v) { return Fp16ToFp32(Fp32ToFp16(v)); }

// What an F16 file gives back: matrices rounded to half, norms as written.
float F16Expected(const std::string& name, float v) {
  return name.ends_with("norm") ? v : RoundThroughFp16(v);
}

ModelConfig TinyShape(int n_heads, int n_kv_heads, bool tied) {
  return ModelConfig{.dim = 64,
                     .hidden_dim = 96,
                     .n_layers = 2,
                     .n_heads = n_heads,
                     .n_kv_heads = n_kv_heads,
                     .vocab_size = 40,
                     .seq_len = 32,
                     .shared_classifier = tied};
}

// A small llama GGUF described field by field, so tests can break one thing.
// Tensor values follow Pattern() so that loads can be checked exactly.
struct LlamaGgufSpec {
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    GgmlType type;
  };
  std::string architecture = "llama";
  std::map<std::string, uint32_t> sizes;
  std::map<std::string, float> floats;
  std::function<void(GgufWriter&)> extra_metadata = [](GgufWriter&) {};
  std::vector<Tensor> tensors;
  uint32_t alignment = 32;

  Tensor* Find(const std::string& name) {
    for (Tensor& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
};

float Pattern(int64_t i) { return static_cast<float>(i % 251) / 251.0f - 0.5f; }

LlamaGgufSpec SpecOf(const ModelConfig& c, GgmlType type) {
  LlamaGgufSpec s;
  s.sizes = {
      {"llama.context_length", c.seq_len},       {"llama.embedding_length", c.dim},
      {"llama.block_count", c.n_layers},         {"llama.feed_forward_length", c.hidden_dim},
      {"llama.attention.head_count", c.n_heads}, {"llama.attention.head_count_kv", c.n_kv_heads},
      {"llama.vocab_size", c.vocab_size}};
  s.floats = {{"llama.rope.freq_base", 500000.0f},
              {"llama.attention.layer_norm_rms_epsilon", 1e-6f}};
  const int64_t d = c.dim, h = c.hidden_dim, kv = c.kv_dim(), v = c.vocab_size;
  s.tensors.push_back({"token_embd.weight", {d, v}, type});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    s.tensors.push_back({p + "attn_norm.weight", {d}, GgmlType::kF32});
    s.tensors.push_back({p + "attn_q.weight", {d, d}, type});
    s.tensors.push_back({p + "attn_k.weight", {d, kv}, type});
    s.tensors.push_back({p + "attn_v.weight", {d, kv}, type});
    s.tensors.push_back({p + "attn_output.weight", {d, d}, type});
    s.tensors.push_back({p + "ffn_norm.weight", {d}, GgmlType::kF32});
    s.tensors.push_back({p + "ffn_gate.weight", {d, h}, type});
    s.tensors.push_back({p + "ffn_down.weight", {h, d}, type});
    s.tensors.push_back({p + "ffn_up.weight", {d, h}, type});
  }
  s.tensors.push_back({"output_norm.weight", {d}, GgmlType::kF32});
  if (!c.shared_classifier) s.tensors.push_back({"output.weight", {d, v}, type});
  return s;
}

std::string WriteSpec(const LlamaGgufSpec& s, const std::string& name) {
  GgufWriter w(s.alignment);
  w.AddString("general.architecture", s.architecture);
  for (const auto& [key, value] : s.sizes) w.AddUint32(key, value);
  for (const auto& [key, value] : s.floats) w.AddFloat32(key, value);
  s.extra_metadata(w);
  for (const LlamaGgufSpec::Tensor& t : s.tensors) {
    int64_t n = 1;
    for (int64_t d : t.dims) n *= d;
    const GgmlTypeTraits traits = *GgmlTypeTraitsOf(t.type);
    std::vector<uint8_t> bytes(n / traits.block_elements * traits.block_bytes);
    // Quantized blocks: a byte pattern (their values do not matter here).
    for (size_t i = 0; i < bytes.size() && traits.block_elements > 1; ++i) {
      bytes[i] = static_cast<uint8_t>(i * 37 + 11);
    }
    for (int64_t i = 0; i < n && traits.block_elements == 1; ++i) {
      const float f = Pattern(i);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const uint16_t half =
          t.type == GgmlType::kF16 ? Fp32ToFp16(f) : static_cast<uint16_t>(bits >> 16);
      if (t.type == GgmlType::kF32) {
        std::memcpy(&bytes[4 * i], &f, 4);
      } else {
        std::memcpy(&bytes[2 * i], &half, 2);
      }
    }
    w.AddTensor(t.name, t.dims, t.type, std::move(bytes));
  }
  const std::string path = TempPath(name);
  EXPECT_OK(w.WriteFile(path));
  return path;
}

void ExpectPatternWeights(const ModelWeights& w, GgmlType matrix_type) {
  for (const auto& [name, span] : ::tandem::testing::NamedTensors(w)) {
    const bool norm = name.ends_with("norm");
    const GgmlType type = norm ? GgmlType::kF32 : matrix_type;
    for (size_t i = 0; i < span.size(); ++i) {
      float want = Pattern(static_cast<int64_t>(i));
      if (type == GgmlType::kF16) want = RoundThroughFp16(want);
      if (type == GgmlType::kBF16) {
        uint32_t bits;
        std::memcpy(&bits, &want, 4);
        want = Bf16ToFp32(static_cast<uint16_t>(bits >> 16));
      }
      if (span.At(i) != want) {
        ADD_FAILURE() << name << "[" << i << "] = " << span.At(i) << ", want " << want;
        break;
      }
    }
  }
}

TEST(GgufModelTest, Stories260KRoundTripsThroughF32BitForBit) {
  TANDEM_MODEL_FILE_OR_SKIP(path, "stories260K.bin");
  ASSERT_OK_AND_ASSIGN(auto original, LoadLlama2cCheckpoint(path));
  const std::string gguf = TempPath("stories260K.gguf");
  ASSERT_OK(WriteGgufModel(*original, gguf));
  ASSERT_OK_AND_ASSIGN(auto loaded, LoadGgufModel(gguf));
  ExpectSameWeights(*original, *loaded);
  EXPECT_EQ(loaded->classifier.data, loaded->token_embedding.data);
  EXPECT_EQ(loaded->source, gguf);

  ASSERT_OK_AND_ASSIGN(GgufFile file, GgufFile::Open(gguf));
  EXPECT_THAT(file.GetString("general.architecture"), ::tandem::testing::IsOkAndHolds("llama"));
  EXPECT_THAT(file.GetUint32("llama.attention.head_count_kv"), ::tandem::testing::IsOkAndHolds(4u));
  EXPECT_THAT(file.GetUint32("general.file_type"), ::tandem::testing::IsOkAndHolds(0u));
  EXPECT_EQ(file.FindTensor("output.weight"), nullptr);
  EXPECT_THAT(file.FindTensor("token_embd.weight")->dims, ::testing::ElementsAre(64, 512));
  EXPECT_THAT(file.FindTensor("blk.4.attn_k.weight")->dims, ::testing::ElementsAre(64, 32));
}

TEST(GgufModelTest, Stories260KRoundTripsThroughF16WithinHalfPrecision) {
  TANDEM_MODEL_FILE_OR_SKIP(path, "stories260K.bin");
  ASSERT_OK_AND_ASSIGN(auto original, LoadLlama2cCheckpoint(path));
  const std::string gguf = TempPath("stories260K.f16.gguf");
  ASSERT_OK(WriteGgufModel(*original, gguf, GgufTensorType::kF16));
  ASSERT_OK_AND_ASSIGN(auto loaded, LoadGgufModel(gguf));
  ExpectWeightsMap(*original, *loaded, F16Expected);
  // Independent of the conversion code: half keeps 11 significant bits.
  // The 16-bit tensors are used as stored, not widened.
  EXPECT_EQ(loaded->token_embedding.dtype, DType::kF16);
  for (size_t i = 0; i < original->token_embedding.size(); ++i) {
    const float want = original->token_embedding.At(i);
    ASSERT_NEAR(loaded->token_embedding.At(i), want, std::abs(want) * 0x1p-11f + 0x1p-25f) << i;
  }
  ASSERT_OK_AND_ASSIGN(GgufFile file, GgufFile::Open(gguf));
  EXPECT_EQ(file.FindTensor("blk.0.attn_q.weight")->type, GgmlType::kF16);
  EXPECT_EQ(file.FindTensor("blk.0.attn_norm.weight")->type, GgmlType::kF32);
  EXPECT_THAT(file.GetUint32("general.file_type"), ::tandem::testing::IsOkAndHolds(1u));
}

// A vocabulary goes in as llama.cpp's SentencePiece tokenizer reads it, or
// is refused when it does not fit the model.
TEST(GgufModelTest, WritesAVocabularyLlamaCppReads) {
  TANDEM_MODEL_FILE_OR_SKIP(path, "stories260K.bin");
  ASSERT_OK_AND_ASSIGN(auto original, LoadLlama2cCheckpoint(path));
  GgufVocab vocab{.bos_id = 1, .eos_id = 2, .unk_id = 0};
  for (int i = 0; i < 512; ++i) {
    vocab.tokens.push_back(i < 3 ? std::vector<std::string>{"<unk>", "<s>", "</s>"}[i]
                                 : "\u2581piece" + std::to_string(i));
    vocab.scores.push_back(-static_cast<float>(i));
    vocab.types.push_back(i == 0 ? 2 : i < 3 ? 3 : 1);
  }
  const std::string gguf = TempPath("stories260K.vocab.gguf");
  ASSERT_OK(WriteGgufModel(*original, gguf, GgufTensorType::kF32, &vocab));
  ASSERT_OK_AND_ASSIGN(GgufFile file, GgufFile::Open(gguf));
  EXPECT_THAT(file.GetString("tokenizer.ggml.model"), ::tandem::testing::IsOkAndHolds("llama"));
  EXPECT_THAT(file.GetStringArray("tokenizer.ggml.tokens"),
              ::tandem::testing::IsOkAndHolds(vocab.tokens));
  EXPECT_THAT(file.GetFloatArray("tokenizer.ggml.scores"),
              ::tandem::testing::IsOkAndHolds(vocab.scores));
  EXPECT_THAT(file.GetInt32Array("tokenizer.ggml.token_type"),
              ::tandem::testing::IsOkAndHolds(vocab.types));
  EXPECT_THAT(file.GetUint32("tokenizer.ggml.bos_token_id"), ::tandem::testing::IsOkAndHolds(1u));
  EXPECT_THAT(file.GetUint32("tokenizer.ggml.eos_token_id"), ::tandem::testing::IsOkAndHolds(2u));
  EXPECT_THAT(file.GetBool("tokenizer.ggml.add_bos_token"), ::tandem::testing::IsOkAndHolds(true));
  ASSERT_OK_AND_ASSIGN(auto loaded, LoadGgufModel(gguf));
  ExpectSameWeights(*original, *loaded);

  vocab.scores.pop_back();
  EXPECT_THAT(WriteGgufModel(*original, TempPath("bad.gguf"), GgufTensorType::kF32, &vocab),
              ::tandem::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                          ::testing::HasSubstr("511 scores")));
}

struct ShapeCase {
  const char* name;
  int n_heads, n_kv_heads;
  bool tied;
};

class GgufSyntheticTest : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(GgufSyntheticTest, RoundTrips) {
  const ShapeCase& s = GetParam();
  ModelConfig config = TinyShape(s.n_heads, s.n_kv_heads, s.tied);
  config.rope_theta = 500000.0f;
  config.norm_eps = 1e-6f;
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(config, 42));
  const std::string f32 = TempPath(absl::StrCat(s.name, ".gguf"));
  ASSERT_OK(WriteGgufModel(*model, f32));
  ASSERT_OK_AND_ASSIGN(auto loaded, LoadGgufModel(f32));
  ExpectSameWeights(*model, *loaded);
  const std::string f16 = TempPath(absl::StrCat(s.name, ".f16.gguf"));
  ASSERT_OK(WriteGgufModel(*model, f16, GgufTensorType::kF16));
  ASSERT_OK_AND_ASSIGN(auto half, LoadGgufModel(f16));
  ExpectWeightsMap(*model, *half, F16Expected);
}

// Qwen 2 (q/k/v biases) and Qwen3 (per-head q/k norms, head_dim 32 beside
// a width of 64) go out as llama.cpp's qwen2 and qwen3 architectures, with
// half-split RoPE and the head width in attention.key_length, and come back
// the same model; so does a llama model with its own head width.
TEST(GgufModelTest, QwenArchitecturesAndHeadWidthsRoundTrip) {
  ModelConfig qwen2 = TinyShape(4, 2, false);
  qwen2.attention_bias = true;
  qwen2.rope_layout = RopeLayout::kHalfSplit;
  ModelConfig llama_head = TinyShape(4, 2, true);
  llama_head.head_size = 32;
  for (const auto& [arch, config] : {std::pair{"qwen3", Qwen3SmallShape()},
                                     std::pair{"qwen2", qwen2}, std::pair{"llama", llama_head}}) {
    SCOPED_TRACE(arch);
    ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(config, 4));
    const std::string path = TempPath(absl::StrCat(arch, "-arch.gguf"));
    ASSERT_OK(WriteGgufModel(*model, path, GgufTensorType::kBF16));
    ASSERT_OK_AND_ASSIGN(GgufFile file, GgufFile::Open(path));
    EXPECT_THAT(file.GetString("general.architecture"), ::tandem::testing::IsOkAndHolds(arch));
    if (config.head_size != 0) {
      EXPECT_THAT(file.GetUint32(absl::StrCat(arch, ".attention.key_length")),
                  ::tandem::testing::IsOkAndHolds(32u));
    }
    ASSERT_OK_AND_ASSIGN(auto loaded, LoadGgufModel(file));
    EXPECT_EQ(loaded->config.rope_layout, config.rope_layout);
    ::tandem::testing::ExpectSameConfig(model->config, loaded->config);
    ASSERT_OK_AND_ASSIGN(auto bf16, MakeSyntheticModel(config, 4, DType::kBF16));
    EXPECT_EQ(loaded->Fingerprint(), bf16->Fingerprint());
  }
}

// A qwen3 file without its q/k norms, or a llama file with them, is refused
// naming the tensor.
TEST(GgufModelTest, QkNormTensorsMustMatchTheArchitecture) {
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(Qwen3SmallShape(), 4));
  const std::string path = TempPath("qwen3-renamed.gguf");
  ASSERT_OK(WriteGgufModel(*model, path));
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  // In the metadata only (it precedes the tensor infos), and of the same
  // length, so the rest of the file stays valid: "qwen3" -> "llama".
  const size_t infos = bytes.find("token_embd.weight");
  ASSERT_NE(infos, std::string::npos);
  int renamed_keys = 0;
  for (size_t i = bytes.find("qwen3"); i < infos; i = bytes.find("qwen3", i)) {
    bytes.replace(i, 5, "llama");
    ++renamed_keys;
  }
  EXPECT_GT(renamed_keys, 5);
  const std::string renamed = TempPath("llama-with-qk-norms.gguf");
  std::ofstream(renamed, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_THAT(LoadGgufModel(renamed),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("attn_q_norm.weight")));
}

// Each mixture-of-experts architecture as llama.cpp names it (Mixtral as
// llama with experts, qwen2moe with its shared expert, qwen3moe, olmoe):
// every expert's matrices merged into one tensor per role, read back as
// the same model. llama.cpp's sparse models are sparse in every layer.
TEST(GgufModelTest, MixtureOfExpertsArchitecturesRoundTrip) {
  for (auto [name, config] : SmallMoeShapes()) {
    SCOPED_TRACE(name);
    config.moe.sparse_step = 1;
    config.moe.dense_layers.clear();
    if (name == "mixtral-small") config.rope_layout = RopeLayout::kInterleaved;
    ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(config, 6));
    const std::string path = TempPath(name + ".gguf");
    ASSERT_OK(WriteGgufModel(*model, path));
    ASSERT_OK_AND_ASSIGN(GgufFile file, GgufFile::Open(path));
    const GgufTensorInfo* gate = file.FindTensor("blk.1.ffn_gate_exps.weight");
    ASSERT_NE(gate, nullptr);
    EXPECT_EQ(gate->dims,
              (std::vector<int64_t>{config.dim, config.moe.expert_hidden, config.moe.n_experts}));
    ASSERT_OK_AND_ASSIGN(auto loaded, LoadGgufModel(file));
    EXPECT_EQ(loaded->config.moe.n_experts, config.moe.n_experts);
    EXPECT_EQ(loaded->config.moe.norm_topk_prob, config.moe.norm_topk_prob);
    EXPECT_EQ(loaded->Fingerprint(), model->Fingerprint());
  }
}

// An expert count that the metadata and the tensors disagree on is refused
// naming the first tensor that shows it.
TEST(GgufModelTest, ExpertCountDisagreeingWithTheTensorsIsRefused) {
  ModelConfig config = SmallMoeShapes()[2].second;  // qwen3-moe-small
  config.moe.dense_layers.clear();
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(config, 6));
  const std::string path = TempPath("experts.gguf");
  ASSERT_OK(WriteGgufModel(*model, path));
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  // The value follows the key and its 4-byte type.
  const std::string key = "qwen3moe.expert_count";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(bytes[at + key.size() + 4], 8);
  bytes[at + key.size() + 4] = 7;
  const std::string bad = TempPath("experts-7.gguf");
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_THAT(LoadGgufModel(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                           AllOf(HasSubstr("blk.0.ffn_gate_inp.weight"),
                                                 HasSubstr("experts=7 top_k=3"))));
}

INSTANTIATE_TEST_SUITE_P(Shapes, GgufSyntheticTest,
                         ::testing::Values(ShapeCase{"mha", 4, 4, true},
                                           ShapeCase{"gqa", 8, 2, true},
                                           ShapeCase{"mqa", 4, 1, true},
                                           ShapeCase{"gqa_untied", 8, 4, false}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(GgufModelTest, LoadsF32F16AndBf16AtAnyAlignment) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    for (uint32_t alignment : {1u, 2u, 32u, 64u}) {
      SCOPED_TRACE(absl::StrCat(GgmlTypeName(type), " alignment ", alignment));
      LlamaGgufSpec spec = SpecOf(TinyShape(4, 2, false), type);
      spec.alignment = alignment;
      ASSERT_OK_AND_ASSIGN(auto w, LoadGgufModel(WriteSpec(spec, "typed.gguf")));
      EXPECT_EQ(w->config.rope_theta, 500000.0f);
      EXPECT_EQ(w->config.norm_eps, 1e-6f);
      EXPECT_FALSE(w->config.shared_classifier);
      ExpectPatternWeights(*w, type);
    }
  }
}

// Quantized matrices keep their blocks, each tensor its own type, in place
// or copied when the file misaligns them.
TEST(GgufModelTest, LoadsQuantizedMatricesInTheirOwnTypes) {
  for (uint32_t alignment : {1u, 32u}) {
    SCOPED_TRACE(absl::StrCat("alignment ", alignment));
    LlamaGgufSpec spec = SpecOf(TinyShape(4, 2, false), GgmlType::kF32);
    for (auto& t : spec.tensors) {
      if (t.dims.size() == 2) t.type = GgmlType::kQ8_0;
    }
    spec.Find("blk.0.ffn_up.weight")->type = GgmlType::kQ4_0;
    // What llama-quantize writes for Q4_K and Q5_K rows of no multiple of 256.
    spec.Find("blk.1.ffn_up.weight")->type = GgmlType::kQ5_0;
    spec.Find("blk.1.ffn_gate.weight")->type = GgmlType::kQ5_1;
    const std::string path = WriteSpec(spec, "quantized.gguf");
    ASSERT_OK_AND_ASSIGN(auto w, LoadGgufModel(path));
    ASSERT_OK_AND_ASSIGN(GgufFile file, GgufFile::Open(path));
    EXPECT_EQ(w->dtype(), DType::kQ8_0);
    EXPECT_EQ(w->layers[0].w3.dtype, DType::kQ4_0);
    EXPECT_EQ(w->layers[1].w3.dtype, DType::kQ5_0);
    EXPECT_EQ(w->layers[1].w1.dtype, DType::kQ5_1);
    EXPECT_EQ(w->layers[1].w2.dtype, DType::kQ8_0);
    EXPECT_EQ(w->layers[1].w3.size_bytes(), file.FindTensor("blk.1.ffn_up.weight")->data.size());
    EXPECT_EQ(w->rms_final.dtype, DType::kF32);
    const Tensor& up = w->layers[0].w3;
    const GgufTensorInfo* info = file.FindTensor("blk.0.ffn_up.weight");
    ASSERT_EQ(up.size_bytes(), info->data.size());
    EXPECT_EQ(std::memcmp(up.data, info->data.data(), up.size_bytes()), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(up.data) % 2, 0u);
  }
}

TEST(GgufModelTest, OptionalMetadataHasDefaults) {
  LlamaGgufSpec spec = SpecOf(TinyShape(4, 4, true), GgmlType::kF32);
  spec.sizes.erase("llama.attention.head_count_kv");
  spec.sizes.erase("llama.vocab_size");
  spec.floats.erase("llama.rope.freq_base");
  ASSERT_OK_AND_ASSIGN(auto w, LoadGgufModel(WriteSpec(spec, "defaults.gguf")));
  EXPECT_EQ(w->config.n_kv_heads, 4);
  EXPECT_EQ(w->config.vocab_size, 40);
  EXPECT_EQ(w->config.rope_theta, 10000.0f);
  EXPECT_TRUE(w->config.shared_classifier);
}

struct BadModelCase {
  const char* name;
  std::function<void(LlamaGgufSpec&)> edit;
  const char* message;
};

class GgufBadModelTest : public ::testing::TestWithParam<BadModelCase> {};

TEST_P(GgufBadModelTest, IsInvalidArgumentNamingTheFile) {
  LlamaGgufSpec spec = SpecOf(TinyShape(4, 2, true), GgmlType::kF32);
  GetParam().edit(spec);
  const std::string path = WriteSpec(spec, absl::StrCat(GetParam().name, ".gguf"));
  EXPECT_THAT(LoadGgufModel(path).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path), HasSubstr(GetParam().message))));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GgufBadModelTest,
    ::testing::Values(
        BadModelCase{"missing_tensor",
                     [](auto& s) {
                       std::erase_if(s.tensors,
                                     [](auto& t) { return t.name == "blk.1.ffn_up.weight"; });
                     },
                     "has no tensor 'blk.1.ffn_up.weight'"},
        BadModelCase{"wrong_shape",
                     [](auto& s) {
                       s.Find("blk.0.attn_k.weight")->dims = {64, 64};
                     },
                     "'blk.0.attn_k.weight' of shape [64, 64]"},
        BadModelCase{"transposed",
                     [](auto& s) {
                       s.Find("blk.0.ffn_down.weight")->dims = {64, 96};
                     },
                     "needs [96, 64]"},
        BadModelCase{
            "unsupported_quantization",
            [](auto& s) { s.Find("blk.0.attn_q.weight")->type = static_cast<GgmlType>(20); },
            "of type IQ4_NL; supported: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K"},
        BadModelCase{"quantized_norm",
                     [](auto& s) { s.Find("blk.1.ffn_norm.weight")->type = GgmlType::kQ8_0; },
                     "vector 'blk.1.ffn_norm.weight' of type Q8_0; vectors must be F32"},
        BadModelCase{"extra_tensor",
                     [](auto& s) {
                       s.tensors.push_back({"rope_freqs.weight", {16}, GgmlType::kF32});
                     },
                     "'rope_freqs.weight'"},
        BadModelCase{"zero_dim", [](auto& s) { s.sizes["llama.embedding_length"] = 0; },
                     "impossible"},
        BadModelCase{"indivisible_heads",
                     [](auto& s) { s.sizes["llama.attention.head_count"] = 3; },
                     "not divisible by n_heads 3"},
        BadModelCase{"huge_dim", [](auto& s) { s.sizes["llama.block_count"] = 3000000000u; },
                     "too large"},
        BadModelCase{"negative_heads",
                     [](auto& s) {
                       s.sizes.erase("llama.attention.head_count");
                       s.extra_metadata = [](GgufWriter& w) {
                         w.AddInt32("llama.attention.head_count", -4);
                       };
                     },
                     "is -4, out of range"},
        BadModelCase{"string_size",
                     [](auto& s) {
                       s.sizes.erase("llama.block_count");
                       s.extra_metadata = [](GgufWriter& w) {
                         w.AddString("llama.block_count", "2");
                       };
                     },
                     "'llama.block_count' is a string"},
        BadModelCase{"missing_key", [](auto& s) { s.sizes.erase("llama.feed_forward_length"); },
                     "no metadata 'llama.feed_forward_length'"},
        BadModelCase{"missing_eps",
                     [](auto& s) { s.floats.erase("llama.attention.layer_norm_rms_epsilon"); },
                     "layer_norm_rms_epsilon"},
        BadModelCase{"architecture", [](auto& s) { s.architecture = "gpt2"; },
                     "architecture 'gpt2'"},
        BadModelCase{"partial_rope", [](auto& s) { s.sizes["llama.rope.dimension_count"] = 8; },
                     "partial RoPE"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(GgufModelTest, TruncatedOrPaddedModelFilesAreInvalid) {
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(TinyShape(4, 2, true), 7));
  const std::string path = TempPath("full.gguf");
  ASSERT_OK(WriteGgufModel(*model, path));
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const size_t infos = bytes.find("blk.1.attn_q.weight");
  ASSERT_NE(infos, std::string::npos);
  const std::string cut_path = TempPath("cut.gguf");
  // Inside the header, the metadata, the tensor infos, the data; 4 bytes short.
  for (size_t cut : {10ul, 100ul, infos + 5, bytes.size() / 2, bytes.size() - 4}) {
    SCOPED_TRACE(cut);
    std::ofstream(cut_path, std::ios::binary | std::ios::trunc).write(bytes.data(), cut);
    EXPECT_THAT(LoadGgufModel(cut_path).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(cut_path), HasSubstr("truncated"))));
  }
  std::ofstream(cut_path, std::ios::binary | std::ios::trunc) << bytes << std::string(64, 'x');
  EXPECT_THAT(LoadGgufModel(cut_path).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("64 unexpected bytes")));
}

// Corrupt header bytes must give an error or a valid model, never a crash
// (the sanitizer builds check the "never" part).
TEST(GgufModelTest, RandomCorruptionIsAnErrorNotACrash) {
  const ModelConfig c{.dim = 16,
                      .hidden_dim = 8,
                      .n_layers = 1,
                      .n_heads = 2,
                      .n_kv_heads = 1,
                      .vocab_size = 6,
                      .seq_len = 32,
                      .shared_classifier = false};
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(c, 5));
  const std::string path = TempPath("small.gguf");
  ASSERT_OK(WriteGgufModel(*model, path));
  std::ifstream in(path, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), {});
  const size_t header_end = good.find("output.weight") + 64;
  std::mt19937 rng(1234);
  const std::string bad_path = TempPath("mutated.gguf");
  int failures = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      const size_t at = rng() % header_end;
      bytes[at] = static_cast<char>(trial % 2 == 0 ? rng() : bytes[at] ^ (1 << (rng() % 8)));
    }
    std::ofstream(bad_path, std::ios::binary | std::ios::trunc) << bytes;
    absl::Status s = LoadGgufModel(bad_path).status();
    if (!s.ok()) {
      ++failures;
      ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      ASSERT_THAT(std::string(s.message()), HasSubstr(bad_path));
    }
  }
  EXPECT_GT(failures, 1000);
}

TEST(GgufModelTest, WriterRejectsInconsistentWeights) {
  ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(TinyShape(4, 2, true), 7));
  model->layers[1].wk = model->layers[1].wk.Slice(1, model->layers[1].wk.numel - 1);
  EXPECT_THAT(WriteGgufModel(*model, TempPath("bad.gguf")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("blk.1.attn_k.weight")));
  model->layers.pop_back();
  EXPECT_THAT(WriteGgufModel(*model, TempPath("bad.gguf")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 layers")));
}

// No GGUF architecture this writer writes says these: writing such a model
// would silently give llama.cpp (and our loader) a different one.
TEST(GgufModelTest, WriterRefusesWhatItsMetadataCannotSay) {
  for (auto change : std::vector<std::function<void(ModelConfig&)>>{
           [](ModelConfig& c) { c.rope_layout = RopeLayout::kHalfSplit; },
           [](ModelConfig& c) { c.rope_scaling.type = RopeScaling::Type::kLinear; },
           [](ModelConfig& c) { c.attention_bias = true; },  // qwen2 rotates half-split pairs
           [](ModelConfig& c) { c.qk_norm = QkNorm::kWhole; }}) {
    ModelConfig config = TinyShape(4, 2, true);
    change(config);
    ASSERT_OK_AND_ASSIGN(auto model, MakeSyntheticModel(config, 7));
    EXPECT_THAT(WriteGgufModel(*model, TempPath("unsayable.gguf")),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Hugging Face folder")));
  }
}

}  // namespace
}  // namespace tandem
