#include "common/model/hub_model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/ggml_types.h"
#include "common/model/hub_fp8.h"
#include "common/model/safetensors.h"
#include "common/model/tensor_list.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(const std::string& file, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("'", file, "': ", problem));
}

absl::StatusOr<Json> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Invalid(path, "is not valid JSON");
  if (!j.is_object()) return Invalid(path, "is not a JSON object");
  return j;
}

// An integer field in [lo, hi]; `fallback` when absent or null (nullopt:
// the field is required).
absl::StatusOr<int> IntField(const Json& j, const std::string& file, const char* key,
                             std::optional<int> fallback, int64_t lo, int64_t hi) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback.has_value()) return *fallback;
    return Invalid(file, absl::StrCat("field '", key, "' is missing"));
  }
  const Json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    return Invalid(file, absl::StrCat("field '", key, "' is ", v.dump(),
                                      "; it must be an integer in [", lo, ", ", hi, "]"));
  }
  return static_cast<int>(v.get<int64_t>());
}

absl::StatusOr<float> FloatField(const Json& j, const std::string& file, const char* key,
                                 float fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const Json& v = j[key];
  if (!v.is_number() || !(v.get<double>() > 0.0) || !std::isfinite(v.get<double>())) {
    return Invalid(
        file, absl::StrCat("field '", key, "' is ", v.dump(), "; it must be a positive number"));
  }
  return static_cast<float>(v.get<double>());
}

absl::StatusOr<bool> BoolField(const Json& j, const std::string& file, const char* key,
                               bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) {
    return Invalid(
        file, absl::StrCat("field '", key, "' is ", j[key].dump(), "; it must be true or false"));
  }
  return j[key].get<bool>();
}

absl::StatusOr<RopeScaling> ReadRopeScaling(const Json& j, const std::string& file) {
  RopeScaling s;
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return s;
  const Json& r = j["rope_scaling"];
  if (!r.is_object()) return Invalid(file, "field 'rope_scaling' must be an object or null");
  // Newer configs say "rope_type", older ones "type".
  const char* type_key = r.contains("rope_type") ? "rope_type" : "type";
  if (!r.contains(type_key) || !r[type_key].is_string()) {
    return Invalid(file, "field 'rope_scaling' has no string 'rope_type' (or 'type')");
  }
  const std::string type = r[type_key].get<std::string>();
  if (type == "default") return s;
  if (type != "linear" && type != "llama3") {
    return Invalid(file, absl::StrCat("field 'rope_scaling.", type_key, "' is '", type,
                                      "'; supported: linear, llama3 (or no scaling)"));
  }
  ASSIGN_OR_RETURN(s.factor, FloatField(r, file, "factor", 0.0f));
  if (s.factor == 0.0f) return Invalid(file, "field 'rope_scaling.factor' is missing");
  if (type == "linear") {
    s.type = RopeScaling::Type::kLinear;
    return s;
  }
  s.type = RopeScaling::Type::kLlama3;
  ASSIGN_OR_RETURN(s.low_freq_factor, FloatField(r, file, "low_freq_factor", 0.0f));
  ASSIGN_OR_RETURN(s.high_freq_factor, FloatField(r, file, "high_freq_factor", 0.0f));
  ASSIGN_OR_RETURN(s.original_max_position,
                   IntField(r, file, "original_max_position_embeddings", std::nullopt, 1, 1 << 24));
  if (s.low_freq_factor == 0.0f || s.high_freq_factor == 0.0f) {
    return Invalid(file, "llama3 'rope_scaling' needs low_freq_factor and high_freq_factor");
  }
  return s;
}

// The name of a tensor in a hub checkpoint of the Llama family.
std::string HubName(const TensorSpec& spec) {
  using R = TensorRole;
  const std::string p = absl::StrCat("model.layers.", spec.layer, ".");
  switch (spec.role) {
    case R::kEmbedding:
      return "model.embed_tokens.weight";
    case R::kFinalNorm:
      return "model.norm.weight";
    case R::kClassifier:
      return "lm_head.weight";
    case R::kAttnNorm:
      return p + "input_layernorm.weight";
    case R::kWq:
      return p + "self_attn.q_proj.weight";
    case R::kWk:
      return p + "self_attn.k_proj.weight";
    case R::kWv:
      return p + "self_attn.v_proj.weight";
    case R::kWo:
      return p + "self_attn.o_proj.weight";
    case R::kBq:
      return p + "self_attn.q_proj.bias";
    case R::kBk:
      return p + "self_attn.k_proj.bias";
    case R::kBv:
      return p + "self_attn.v_proj.bias";
    case R::kQNorm:
      return p + "self_attn.q_norm.weight";
    case R::kKNorm:
      return p + "self_attn.k_norm.weight";
    case R::kFfnNorm:
      return p + "post_attention_layernorm.weight";
    case R::kGate:
      return p + "mlp.gate_proj.weight";
    case R::kDown:
      return p + "mlp.down_proj.weight";
    case R::kUp:
      return p + "mlp.up_proj.weight";
  }
  return "";
}

// The tensors of a hub checkpoint with their shapes, and where each goes in
// a ModelWeights (const or not).
template <typename Weights>
auto TensorTable(Weights& w) {
  using T = std::conditional_t<std::is_const_v<Weights>, const Tensor, Tensor>;
  struct Row {
    std::string name;
    std::vector<int64_t> shape;
    T* tensor;
    bool rope_rows;  // permuted for half-split RoPE
    int heads;       // for rope_rows: how many heads the rows hold
  };
  std::vector<Row> rows;
  for (const TensorSpec& spec : ModelTensors(w.config)) {
    rows.push_back({HubName(spec), spec.shape, &TensorOf(w, spec), spec.rope_rows(),
                    spec.rope_heads(w.config)});
  }
  return rows;
}

// Tensors that checkpoints may carry and the model recomputes.
bool IsDerivedBuffer(const std::string& name) {
  return name.ends_with(".self_attn.rotary_emb.inv_freq");
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Owns what a loaded model's tensors point into.
struct HubStorage {
  std::shared_ptr<const void> mapping;
  // Tensors misaligned in the file, and FP8 weights widened.
  std::vector<std::vector<uint64_t>> copies;
};

struct HubConfigFile {
  ModelConfig config;
  HubQuantization quantization;
};

// The config.json fields of the architectures read here: what the loader
// acts on, and what describes training or the Python runtime and changes
// no output. Any other field is refused, naming it, rather than ignored.
bool IsKnownField(const std::string& key) {
  static const std::set<std::string, std::less<>> kKnown = {
      // Acted on.
      "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings",
      "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings",
      "attention_bias", "mlp_bias", "hidden_act", "use_sliding_window", "sliding_window",
      "max_window_layers", "layer_types", "quantization_config", "compression_config",
      // Inert: token ids (generation_config.json and the tokenizer say them),
      // the stored type (the tensors say it), training-only settings, and
      // tensor-parallel slicing of the same products (pretraining_tp).
      "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype",
      "transformers_version", "use_cache", "initializer_range", "attention_dropout",
      "pretraining_tp", "_name_or_path"};
  return kKnown.contains(key);
}

absl::StatusOr<HubConfigFile> ReadConfigFile(const std::string& dir) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  ASSIGN_OR_RETURN(Json j, ReadJson(file));
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() &&
      j["architectures"].size() == 1 && j["architectures"][0].is_string()) {
    arch = j["architectures"][0].get<std::string>();
  }
  const bool qwen2 = arch == "Qwen2ForCausalLM";
  const bool qwen3 = arch == "Qwen3ForCausalLM";
  if (arch != "LlamaForCausalLM" && arch != "MistralForCausalLM" && !qwen2 && !qwen3) {
    return Invalid(file,
                   absl::StrCat("field 'architectures' is ",
                                j.contains("architectures") ? j["architectures"].dump() : "missing",
                                "; supported: [\"LlamaForCausalLM\"], [\"MistralForCausalLM\"], "
                                "[\"Qwen2ForCausalLM\"], [\"Qwen3ForCausalLM\"]"));
  }
  for (const auto& [key, value] : j.items()) {
    if (!IsKnownField(key)) {
      return Invalid(file, absl::StrCat("field '", key, "' (", value.dump().substr(0, 60),
                                        ") is not one a ", arch,
                                        " model is read with; remove it if it does not change "
                                        "the model's outputs"));
    }
  }
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const Json& types = j["layer_types"];
    if (!types.is_array() || !std::all_of(types.begin(), types.end(),
                                          [](const Json& t) { return t == "full_attention"; })) {
      return Invalid(file, absl::StrCat("field 'layer_types' is ", types.dump().substr(0, 80),
                                        "; only full_attention layers are supported"));
    }
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    return Invalid(file, absl::StrCat("field 'hidden_act' is ", j["hidden_act"].dump(),
                                      "; only \"silu\" is supported"));
  }
  ASSIGN_OR_RETURN(bool mlp_bias, BoolField(j, file, "mlp_bias", false));
  if (mlp_bias) return Invalid(file, "field 'mlp_bias' is true; MLP biases are not supported");

  constexpr int kMax = 1 << 20;
  ModelConfig c;
  ASSIGN_OR_RETURN(c.dim, IntField(j, file, "hidden_size", std::nullopt, 1, kMax));
  ASSIGN_OR_RETURN(c.hidden_dim, IntField(j, file, "intermediate_size", std::nullopt, 1, kMax));
  ASSIGN_OR_RETURN(c.n_layers, IntField(j, file, "num_hidden_layers", std::nullopt, 1, 4096));
  ASSIGN_OR_RETURN(c.n_heads, IntField(j, file, "num_attention_heads", std::nullopt, 1, 4096));
  ASSIGN_OR_RETURN(c.n_kv_heads, IntField(j, file, "num_key_value_heads", c.n_heads, 1, 4096));
  ASSIGN_OR_RETURN(c.vocab_size, IntField(j, file, "vocab_size", std::nullopt, 1, 1 << 22));
  ASSIGN_OR_RETURN(c.seq_len, IntField(j, file, "max_position_embeddings", std::nullopt, 1, kMax));
  ASSIGN_OR_RETURN(c.head_size, IntField(j, file, "head_dim", 0, 0, 4096));
  if (c.head_size * c.n_heads == c.dim) c.head_size = 0;  // the default, said explicitly
  ASSIGN_OR_RETURN(c.norm_eps, FloatField(j, file, "rms_norm_eps", 1e-6f));
  ASSIGN_OR_RETURN(c.rope_theta, FloatField(j, file, "rope_theta", 10000.0f));
  ASSIGN_OR_RETURN(c.shared_classifier, BoolField(j, file, "tie_word_embeddings", false));
  // Qwen 2 always has q/k/v biases; Llama and Qwen3 say so with attention_bias.
  ASSIGN_OR_RETURN(c.attention_bias, BoolField(j, file, "attention_bias", qwen2));
  if (qwen3) c.qk_norm = QkNorm::kPerHead;
  ASSIGN_OR_RETURN(c.rope_scaling, ReadRopeScaling(j, file));
  c.rope_layout = RopeLayout::kHalfSplit;

  // Full attention equals sliding-window attention up to the window.
  ASSIGN_OR_RETURN(bool sliding, BoolField(j, file, "use_sliding_window", !qwen2 && !qwen3));
  ASSIGN_OR_RETURN(int window,
                   IntField(j, file, "sliding_window", 0, 0, std::numeric_limits<int>::max()));
  if (sliding && window > 0 && window < c.seq_len) c.seq_len = window;

  if (absl::Status s = c.Validate(); !s.ok()) return Invalid(file, std::string(s.message()));
  ASSIGN_OR_RETURN(HubQuantization quantization, ReadHubQuantization(j, file));
  return HubConfigFile{c, quantization};
}

// The type FP8 weights are widened to: that of the first matrix stored in
// F32, F16 or BF16 (the embedding, in practice; the loop in LoadHubModel
// checks that the others agree), BF16 when every matrix is FP8.
DType WidenedType(const SafetensorsModel& st, const std::vector<std::string>& matrix_names) {
  for (const std::string& name : matrix_names) {
    const TensorInfo* t = st.Find(name);
    if (t == nullptr) continue;
    if (const std::optional<DType> dtype = ToDType(t->dtype); dtype.has_value()) return *dtype;
  }
  return DType::kBF16;
}

}  // namespace

absl::StatusOr<ModelConfig> ReadHubConfig(const std::string& dir) {
  ASSIGN_OR_RETURN(HubConfigFile f, ReadConfigFile(dir));
  return f.config;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadHubModel(const std::string& dir) {
  ASSIGN_OR_RETURN(HubConfigFile config_file, ReadConfigFile(dir));
  const ModelConfig& config = config_file.config;
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModel> st, OpenSafetensorsFolder(dir));
  auto weights = std::make_unique<ModelWeights>();
  weights->config = config;
  weights->source = dir;
  weights->layers.resize(config.n_layers);
  auto storage = std::make_shared<HubStorage>();
  storage->mapping = st->keep_alive();
  const auto table = TensorTable(*weights);
  std::vector<std::string> matrix_names;
  for (const auto& row : table) {
    if (row.shape.size() == 2) matrix_names.push_back(row.name);
  }
  const DType widened_type = WidenedType(*st, matrix_names);

  std::set<std::string> expected;
  std::optional<DType> matrix_type;
  for (const auto& row : table) {
    expected.insert(row.name);
    const TensorInfo* t = st->Find(row.name);
    if (t == nullptr) {
      return Invalid(dir, absl::StrCat("has no tensor '", row.name, "', which config.json (",
                                       config.ToString(), ") implies"));
    }
    if (t->shape != row.shape) {
      return Invalid(dir, absl::StrCat("tensor '", row.name, "' has shape ", ShapeText(t->shape),
                                       "; config.json implies ", ShapeText(row.shape)));
    }
    if (t->dtype == SafetensorsDType::kF8E4M3) {
      if (!config_file.quantization.fp8_weights) {
        return Invalid(dir, absl::StrCat("tensor '", row.name,
                                         "' is F8_E4M3, but config.json has no compressed-tensors "
                                         "FP8 'quantization_config' to say how it is scaled"));
      }
      // The scale is required; the input scale was calibrated for FP8
      // activations, which are computed here in 16 or 32 bits instead, so
      // it is accepted and not used.
      const std::string scale_name = Fp8WeightScaleName(row.name);
      expected.insert(scale_name);
      expected.insert(Fp8InputScaleName(row.name));
      ASSIGN_OR_RETURN(std::vector<uint64_t> widened,
                       WidenFp8Weight(*t, st->Find(scale_name), widened_type, dir));
      *row.tensor = Tensor(storage->copies.emplace_back(std::move(widened)).data(), widened_type,
                           t->num_elements);
      if (!matrix_type.has_value()) matrix_type = widened_type;
      continue;
    }
    const std::optional<DType> dtype = ToDType(t->dtype);
    if (!dtype.has_value()) {
      return Invalid(dir, absl::StrCat("tensor '", row.name, "' is ",
                                       std::string(SafetensorsDTypeName(t->dtype)),
                                       "; supported: F32, F16 and BF16, and F8_E4M3 matrices with "
                                       "a compressed-tensors FP8 quantization_config"));
    }
    if (row.shape.size() == 2) {
      if (matrix_type.has_value() && *matrix_type != *dtype) {
        return Invalid(
            dir, absl::StrCat("tensor '", row.name, "' is ", std::string(DTypeName(*dtype)),
                              " but earlier matrices are ", std::string(DTypeName(*matrix_type)),
                              "; convert the folder to one type with tandem-convert"));
      }
      matrix_type = dtype;
    }
    const void* data = t->bytes.data();
    if (reinterpret_cast<uintptr_t>(data) % DTypeSize(*dtype) != 0) {
      std::vector<uint64_t>& copy = storage->copies.emplace_back((t->bytes.size() + 7) / 8);
      std::memcpy(copy.data(), t->bytes.data(), t->bytes.size());
      data = copy.data();
    }
    *row.tensor = Tensor(data, *dtype, t->num_elements);
  }
  for (const std::string& name : st->tensor_names()) {
    if (expected.count(name) > 0 || IsDerivedBuffer(name)) continue;
    // Some tied checkpoints also store the classifier: accept an exact copy.
    if (name == "lm_head.weight" && config.shared_classifier) {
      const TensorInfo* lm = st->Find(name);
      const TensorInfo* emb = st->Find("model.embed_tokens.weight");
      if (lm->bytes.size() == emb->bytes.size() && lm->dtype == emb->dtype &&
          std::memcmp(lm->bytes.data(), emb->bytes.data(), lm->bytes.size()) == 0) {
        continue;
      }
      return Invalid(dir,
                     "has an 'lm_head.weight' that differs from the embedding, but config.json "
                     "says tie_word_embeddings; fix the config");
    }
    return Invalid(dir, absl::StrCat("has tensor '", name, "', which a ", config.ToString(),
                                     " model does not use (a different architecture or config?)"));
  }
  if (config.shared_classifier) weights->classifier = weights->token_embedding;
  weights->storage = std::move(storage);
  return weights;
}

namespace {

// Rows of `t` ([heads * head_dim, cols], cols = 1 for a bias) reordered from
// interleaved RoPE pairs (2i, 2i+1) to half-split pairs (i, i + half).
std::vector<float> PermuteForHalfSplit(const std::vector<float>& t, int heads, int head_dim) {
  const size_t cols = t.size() / (static_cast<size_t>(heads) * head_dim);
  const int half = head_dim / 2;
  std::vector<float> out(t.size());
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < half; ++i) {
      for (int j = 0; j < 2; ++j) {
        const size_t from = static_cast<size_t>(h) * head_dim + 2 * i + j;
        const size_t to = static_cast<size_t>(h) * head_dim + j * half + i;
        std::memcpy(&out[to * cols], &t[from * cols], cols * sizeof(float));
      }
    }
  }
  return out;
}

std::vector<uint8_t> Encode(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&bytes[4 * i], &values[i], 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? Fp32ToBf16(values[i]) : Fp32ToFp16(values[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
  }
  return bytes;
}

// The shortest decimal that reads back as `f` (1e-05, not the double
// nearest to the float, 9.999999747378752e-06).
double ShortestDecimal(float f) {
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof(buf), f).ptr;
  return std::strtod(std::string(buf, end).c_str(), nullptr);
}

absl::Status WriteJson(const std::string& path, const Json& j) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << j.dump(2) << "\n";
  out.flush();
  if (!out) return absl::DataLossError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteHubModel(const ModelWeights& w, const std::string& dir,
                           const HubWriteOptions& options) {
  const ModelConfig& c = w.config;
  RETURN_IF_ERROR(c.Validate());
  if (w.layers.size() != static_cast<size_t>(c.n_layers)) {
    return absl::InvalidArgumentError(absl::StrCat("weights from '", w.source, "' have ",
                                                   w.layers.size(), " layers; the config says ",
                                                   c.n_layers));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("cannot create '", dir, "': ", ec.message()));

  const bool permute = c.rope_layout == RopeLayout::kInterleaved && options.permute_qk;
  SafetensorsWriter writer;
  for (const auto& row : TensorTable(w)) {
    int64_t n = 1;
    for (int64_t s : row.shape) n *= s;
    if (static_cast<int64_t>(row.tensor->size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat("weights from '", w.source, "' give ",
                                                     row.name, " ", row.tensor->size(),
                                                     " values; the config needs ", n));
    }
    std::vector<float> values = row.tensor->ToFloats();
    if (permute && row.rope_rows) values = PermuteForHalfSplit(values, row.heads, c.head_dim());
    const std::vector<uint8_t> bytes = Encode(values, options.dtype);
    RETURN_IF_ERROR(writer.Add(row.name, ToSafetensorsDType(options.dtype), row.shape, bytes));
  }
  RETURN_IF_ERROR(writer.WriteFolder(dir, options.max_shard_bytes));

  if (c.qk_norm == QkNorm::kWhole) {
    return absl::InvalidArgumentError(
        "a whole-projection q/k norm belongs to no architecture this writer writes");
  }
  // Qwen 2 is Llama with q/k/v biases; Qwen3 has per-head q/k norms (and
  // biases only when attention_bias says so).
  const bool qwen3 = c.qk_norm == QkNorm::kPerHead;
  const bool qwen2 = !qwen3 && c.attention_bias;
  Json config = {
      {"architectures",
       {qwen3   ? "Qwen3ForCausalLM"
        : qwen2 ? "Qwen2ForCausalLM"
                : "LlamaForCausalLM"}},
      {"model_type", qwen3   ? "qwen3"
                     : qwen2 ? "qwen2"
                             : "llama"},
      {"hidden_size", c.dim},
      {"intermediate_size", c.hidden_dim},
      {"num_hidden_layers", c.n_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_kv_heads},
      {"head_dim", c.head_dim()},
      {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.seq_len},
      {"rms_norm_eps", ShortestDecimal(c.norm_eps)},
      {"rope_theta", ShortestDecimal(c.rope_theta)},
      {"tie_word_embeddings", c.shared_classifier},
      {"hidden_act", "silu"},
      {"torch_dtype", options.dtype == DType::kF32    ? "float32"
                      : options.dtype == DType::kBF16 ? "bfloat16"
                                                      : "float16"},
  };
  if (!qwen2) config["attention_bias"] = c.attention_bias;
  const RopeScaling& s = c.rope_scaling;
  if (s.type == RopeScaling::Type::kLinear) {
    config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", ShortestDecimal(s.factor)}};
  } else if (s.type == RopeScaling::Type::kLlama3) {
    config["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", ShortestDecimal(s.factor)},
                              {"low_freq_factor", ShortestDecimal(s.low_freq_factor)},
                              {"high_freq_factor", ShortestDecimal(s.high_freq_factor)},
                              {"original_max_position_embeddings", s.original_max_position}};
  }
  RETURN_IF_ERROR(WriteJson((std::filesystem::path(dir) / "config.json").string(), config));

  Json generation = Json::object();
  if (options.bos_id.has_value()) generation["bos_token_id"] = *options.bos_id;
  if (options.eos_ids.size() == 1) generation["eos_token_id"] = options.eos_ids[0];
  if (options.eos_ids.size() > 1) generation["eos_token_id"] = options.eos_ids;
  return WriteJson((std::filesystem::path(dir) / "generation_config.json").string(), generation);
}

}  // namespace tandem
