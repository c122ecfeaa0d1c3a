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
#include "common/model/hub_config.h"
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

// Mixtral names its experts' FFN block_sparse_moe and their matrices w1
// (gate), w2 (down) and w3 (up); Qwen's and OLMoE's say mlp and gate_proj,
// down_proj, up_proj. A mixture of experts without q/k norms, biases or a
// shared expert is Mixtral (DeepSeek's say mlp too).
bool IsMixtral(const ModelConfig& c) {
  return c.moe.n_experts > 0 && c.qk_norm == QkNorm::kNone && !c.attention_bias &&
         c.moe.shared_hidden == 0 && !c.has_deepseek_parts();
}

// The hub architecture that says `c`.
const char* HubArchitecture(const ModelConfig& c) {
  if (c.moe.n_experts > 0) {
    if (c.qk_norm == QkNorm::kPerHead) return "Qwen3MoeForCausalLM";
    if (c.qk_norm == QkNorm::kWhole) return "OlmoeForCausalLM";
    return IsMixtral(c) ? "MixtralForCausalLM" : "Qwen2MoeForCausalLM";
  }
  if (c.qk_norm == QkNorm::kPerHead) return "Qwen3ForCausalLM";
  return c.attention_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
}

// The name of a tensor in a hub checkpoint of the Llama family.
std::string HubName(const TensorSpec& spec, const ModelConfig& c) {
  using R = TensorRole;
  const std::string p = absl::StrCat("model.layers.", spec.layer, ".");
  const bool mixtral = IsMixtral(c);
  const std::string experts =
      absl::StrCat(p, mixtral ? "block_sparse_moe" : "mlp", ".experts.", spec.expert, ".");
  const char* shared = c.moe.shared_gated ? "mlp.shared_expert." : "mlp.shared_experts.";
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
    case R::kRouter:
      return p + (mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
    case R::kExpertGate:
      return experts + (mixtral ? "w1.weight" : "gate_proj.weight");
    case R::kExpertDown:
      return experts + (mixtral ? "w2.weight" : "down_proj.weight");
    case R::kExpertUp:
      return experts + (mixtral ? "w3.weight" : "up_proj.weight");
    // DeepSeek's ungated shared experts, stacked: shared_experts.
    case R::kSharedGate:
      return p + shared + "gate_proj.weight";
    case R::kSharedDown:
      return p + shared + "down_proj.weight";
    case R::kSharedUp:
      return p + shared + "up_proj.weight";
    case R::kSharedExpertGate:
      return p + "mlp.shared_expert_gate.weight";
    case R::kRouterBias:
      return p + "mlp.gate.e_score_correction_bias";
    case R::kWqA:
      return p + "self_attn.q_a_proj.weight";
    case R::kQANorm:
      return p + "self_attn.q_a_layernorm.weight";
    case R::kWqB:
      return p + "self_attn.q_b_proj.weight";
    case R::kWkvA:
      return p + "self_attn.kv_a_proj_with_mqa.weight";
    case R::kKvANorm:
      return p + "self_attn.kv_a_layernorm.weight";
    case R::kWkvB:
      return p + "self_attn.kv_b_proj.weight";
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
    rows.push_back({HubName(spec, w.config), spec.shape, &TensorOf(w, spec), spec.rope_rows(),
                    spec.rope_heads(w.config)});
  }
  return rows;
}

// Tensors that checkpoints may carry and the model recomputes.
bool IsDerivedBuffer(const std::string& name) {
  return name.ends_with(".self_attn.rotary_emb.inv_freq");
}

// Owns what a loaded model's tensors point into.
struct HubStorage {
  std::shared_ptr<const void> mapping;
  // Tensors misaligned in the file, and FP8 weights widened.
  std::vector<std::vector<uint64_t>> copies;
};

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

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadHubModel(const std::string& dir) {
  ASSIGN_OR_RETURN(HubConfigFile config_file, ReadHubConfigFile(dir));
  const ModelConfig& config = config_file.config;
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModel> st, OpenSafetensorsFolder(dir));
  auto weights = std::make_unique<ModelWeights>();
  weights->config = config;
  weights->source = dir;
  SizeLayers(*weights);
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
                                         "' is F8_E4M3, but config.json has no FP8 "
                                         "'quantization_config' to say how it is scaled"));
      }
      // The scale is required; the input scale was calibrated for FP8
      // activations, which are computed here in 16 or 32 bits instead, so
      // it is accepted and not used.
      const std::string scale_name = Fp8WeightScaleName(row.name, config_file.quantization);
      expected.insert(scale_name);
      expected.insert(Fp8InputScaleName(row.name));
      ASSIGN_OR_RETURN(
          std::vector<uint64_t> widened,
          WidenFp8Weight(*t, st->Find(scale_name), config_file.quantization, widened_type, dir));
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
                                       "an FP8 quantization_config (compressed-tensors or fp8)"));
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
  auto in_mtp_layer = [&](const std::string& name) {
    for (int l = config.n_layers; l < config.n_layers + config_file.mtp_layers; ++l) {
      if (name.starts_with(absl::StrCat("model.layers.", l, "."))) return true;
    }
    return false;
  };
  for (const std::string& name : st->tensor_names()) {
    if (expected.count(name) > 0 || IsDerivedBuffer(name) || in_mtp_layer(name)) continue;
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

// config.json's fields of DeepSeek's latent attention, routing and YaRN
// (as DeepSeek's own configs say them), or INVALID_ARGUMENT for a model
// that no DeepSeek config can say.
absl::Status DeepSeekFields(const ModelConfig& c, Json& j) {
  const MlaConfig& a = c.mla;
  const MoeConfig& m = c.moe;
  auto refuse = [&](const char* why) {
    return absl::InvalidArgumentError(absl::StrCat("this model (", c.ToString(), ") ", why,
                                                   "; no DeepSeek config.json can say that"));
  };
  if (!c.is_mla()) return refuse("has DeepSeek's routing or YaRN without latent attention");
  j["kv_lora_rank"] = a.kv_lora_rank;
  j["q_lora_rank"] = a.q_lora_rank > 0 ? Json(a.q_lora_rank) : Json(nullptr);
  j["qk_nope_head_dim"] = a.qk_nope_head_dim;
  j["qk_rope_head_dim"] = a.qk_rope_head_dim;
  j["v_head_dim"] = a.v_head_dim;
  if (const RopeScaling& s = c.rope_scaling; s.type == RopeScaling::Type::kYarn) {
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", ShortestDecimal(s.factor)},
                         {"original_max_position_embeddings", s.original_max_position},
                         {"beta_fast", ShortestDecimal(s.beta_fast)},
                         {"beta_slow", ShortestDecimal(s.beta_slow)},
                         {"mscale", ShortestDecimal(s.mscale)},
                         {"mscale_all_dim", ShortestDecimal(s.mscale_all_dim)}};
  } else if (s.type != RopeScaling::Type::kNone) {
    return refuse("scales RoPE other than by yarn");
  }
  if (m.n_experts == 0) return absl::OkStatus();
  const bool v3 = m.scoring == MoeConfig::Scoring::kSigmoid;
  const int dense = static_cast<int>(m.dense_layers.size());
  for (int l = 0; l < dense; ++l) {
    if (m.dense_layers[l] != l) return refuse("has dense layers other than the first ones");
  }
  if (m.shared_gated || m.sparse_step != 1 || m.shared_hidden % m.expert_hidden != 0) {
    return refuse("has a gated shared expert, a sparse step or shared experts of another width");
  }
  if (v3 != m.score_bias || v3 != (m.group_score == MoeConfig::GroupScore::kBestTwo)) {
    return refuse("mixes V2's and V3's routing");
  }
  if (!v3 && m.norm_topk_prob && m.top_k > 1 && m.routed_scale != 1.0f) {
    return refuse("scales renormalised softmax weights");
  }
  j["n_routed_experts"] = m.n_experts;
  j["num_experts_per_tok"] = m.top_k;
  j["moe_intermediate_size"] = m.expert_hidden;
  j["n_shared_experts"] = m.shared_hidden / m.expert_hidden;
  j["moe_layer_freq"] = 1;
  j["first_k_dense_replace"] = dense;
  j["norm_topk_prob"] = m.norm_topk_prob;
  j["routed_scaling_factor"] = ShortestDecimal(m.routed_scale);
  j["n_group"] = m.n_group;
  j["topk_group"] = m.topk_group;
  j["scoring_func"] = v3 ? "sigmoid" : "softmax";
  j["topk_method"] = v3 ? "noaux_tc" : m.n_group > 1 ? "group_limited_greedy" : "greedy";
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

  const bool deepseek = c.has_deepseek_parts();
  Json deepseek_fields = Json::object();
  if (deepseek) RETURN_IF_ERROR(DeepSeekFields(c, deepseek_fields));
  const std::string arch =
      deepseek ? (c.moe.scoring == MoeConfig::Scoring::kSigmoid ? "DeepseekV3ForCausalLM"
                                                                : "DeepseekV2ForCausalLM")
               : HubArchitecture(c);
  if (deepseek) {
    // Checked by DeepSeekFields.
  } else if (c.qk_norm == QkNorm::kWhole && c.moe.n_experts == 0) {
    return absl::InvalidArgumentError(
        "a whole-projection q/k norm without experts belongs to no architecture this writer "
        "writes");
  }
  // Qwen 2 is Llama with q/k/v biases (and so is Qwen2-MoE); the others say
  // theirs with attention_bias.
  const bool qwen2 = arch == "Qwen2ForCausalLM" || arch == "Qwen2MoeForCausalLM";
  const bool mixtral = arch == "MixtralForCausalLM", olmoe = arch == "OlmoeForCausalLM";
  if (arch == "Qwen2MoeForCausalLM" && !c.attention_bias) {
    return absl::InvalidArgumentError(
        "a mixture of experts with a shared expert but no q/k/v biases is no architecture this "
        "writer writes (Qwen2-MoE has both)");
  }
  if ((mixtral || olmoe) && (c.moe.expert_hidden != c.hidden_dim || c.moe.sparse_step != 1 ||
                             !c.moe.dense_layers.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        arch, " says its experts' width in intermediate_size and has no dense layers; this model (",
        c.ToString(), ") cannot be written as one"));
  }
  const char* model_type = arch == "DeepseekV3ForCausalLM"   ? "deepseek_v3"
                           : arch == "DeepseekV2ForCausalLM" ? "deepseek_v2"
                           : arch == "Qwen3ForCausalLM"      ? "qwen3"
                           : arch == "Qwen2ForCausalLM"      ? "qwen2"
                           : arch == "Qwen3MoeForCausalLM"   ? "qwen3_moe"
                           : arch == "Qwen2MoeForCausalLM"   ? "qwen2_moe"
                           : mixtral                         ? "mixtral"
                           : olmoe                           ? "olmoe"
                                                             : "llama";

  // DeepSeek's rope parts are stored pair by pair in its own files.
  const bool permute =
      c.rope_layout == RopeLayout::kInterleaved && options.permute_qk && !c.is_mla();
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

  Json config = {
      {"architectures", {arch}},
      {"model_type", model_type},
      {"hidden_size", c.dim},
      {"intermediate_size", c.hidden_dim},
      {"num_hidden_layers", c.n_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_kv_heads},
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
  if (!deepseek) config["head_dim"] = c.head_dim();
  if (!qwen2) config["attention_bias"] = c.attention_bias;
  config.update(deepseek_fields);
  if (const MoeConfig& m = c.moe; m.n_experts > 0 && !deepseek) {
    config[mixtral ? "num_local_experts" : "num_experts"] = m.n_experts;
    config["num_experts_per_tok"] = m.top_k;
    config["norm_topk_prob"] = m.norm_topk_prob;
    if (!mixtral && !olmoe) {
      config["moe_intermediate_size"] = m.expert_hidden;
      config["decoder_sparse_step"] = m.sparse_step;
      config["mlp_only_layers"] = m.dense_layers;
      if (m.shared_hidden > 0) config["shared_expert_intermediate_size"] = m.shared_hidden;
    }
  }
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
