#include "common/model/hub_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/hub_model.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::json;

absl::Status ConfigInvalid(const std::string& file, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("'", file, "': ", problem));
}

absl::StatusOr<Json> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return ConfigInvalid(path, "is not valid JSON");
  if (!j.is_object()) return ConfigInvalid(path, "is not a JSON object");
  return j;
}

// An integer field in [lo, hi]; `fallback` when absent or null (nullopt:
// the field is required).
absl::StatusOr<int> IntField(const Json& j, const std::string& file, const char* key,
                             std::optional<int> fallback, int64_t lo, int64_t hi) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback.has_value()) return *fallback;
    return ConfigInvalid(file, absl::StrCat("field '", key, "' is missing"));
  }
  const Json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    return ConfigInvalid(file, absl::StrCat("field '", key, "' is ", v.dump(),
                                            "; it must be an integer in [", lo, ", ", hi, "]"));
  }
  return static_cast<int>(v.get<int64_t>());
}

absl::StatusOr<float> FloatField(const Json& j, const std::string& file, const char* key,
                                 float fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const Json& v = j[key];
  if (!v.is_number() || !(v.get<double>() > 0.0) || !std::isfinite(v.get<double>())) {
    return ConfigInvalid(
        file, absl::StrCat("field '", key, "' is ", v.dump(), "; it must be a positive number"));
  }
  return static_cast<float>(v.get<double>());
}

absl::StatusOr<bool> BoolField(const Json& j, const std::string& file, const char* key,
                               bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) {
    return ConfigInvalid(
        file, absl::StrCat("field '", key, "' is ", j[key].dump(), "; it must be true or false"));
  }
  return j[key].get<bool>();
}

// A float field that may be 0 (DeepSeek's mscale_all_dim: 0 = none).
absl::StatusOr<float> NonNegativeField(const Json& j, const std::string& file, const char* key,
                                       float fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const Json& v = j[key];
  if (!v.is_number() || !(v.get<double>() >= 0.0) || !std::isfinite(v.get<double>())) {
    return ConfigInvalid(file, absl::StrCat("field 'rope_scaling.", key, "' is ", v.dump(),
                                            "; it must be a number >= 0"));
  }
  return static_cast<float>(v.get<double>());
}

// DeepSeek's YaRN: the fields of RopeScaling's yarn.
absl::Status ReadYarn(const Json& r, const std::string& file, RopeScaling& s) {
  s.type = RopeScaling::Type::kYarn;
  ASSIGN_OR_RETURN(s.original_max_position,
                   IntField(r, file, "original_max_position_embeddings", std::nullopt, 1, 1 << 24));
  ASSIGN_OR_RETURN(s.beta_fast, FloatField(r, file, "beta_fast", 32.0f));
  ASSIGN_OR_RETURN(s.beta_slow, FloatField(r, file, "beta_slow", 1.0f));
  ASSIGN_OR_RETURN(s.mscale, NonNegativeField(r, file, "mscale", 1.0f));
  ASSIGN_OR_RETURN(s.mscale_all_dim, NonNegativeField(r, file, "mscale_all_dim", 0.0f));
  if (YarnMscale(s.factor, s.mscale) != YarnMscale(s.factor, s.mscale_all_dim)) {
    return ConfigInvalid(
        file, absl::StrCat("field 'rope_scaling' has mscale ", s.mscale, " and mscale_all_dim ",
                           s.mscale_all_dim,
                           "; a rotation rescaled by their ratio is not supported (make them "
                           "equal, as every DeepSeek release has them)"));
  }
  for (const auto& [key, value] : r.items()) {
    static const std::set<std::string, std::less<>> kYarnFields = {
        "type",      "rope_type", "factor", "original_max_position_embeddings",
        "beta_fast", "beta_slow", "mscale", "mscale_all_dim"};
    if (!kYarnFields.contains(key)) {
      return ConfigInvalid(file, absl::StrCat("field 'rope_scaling.", key,
                                              "' is not one DeepSeek's yarn scaling has"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RopeScaling> ReadRopeScaling(const Json& j, const std::string& file, bool deepseek) {
  RopeScaling s;
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return s;
  const Json& r = j["rope_scaling"];
  if (!r.is_object()) return ConfigInvalid(file, "field 'rope_scaling' must be an object or null");
  // Newer configs say "rope_type", older ones "type".
  const char* type_key = r.contains("rope_type") ? "rope_type" : "type";
  if (!r.contains(type_key) || !r[type_key].is_string()) {
    return ConfigInvalid(file, "field 'rope_scaling' has no string 'rope_type' (or 'type')");
  }
  const std::string type = r[type_key].get<std::string>();
  if (type == "default") return s;
  if (type != "linear" && type != "llama3" && !(deepseek && type == "yarn")) {
    return ConfigInvalid(file, absl::StrCat("field 'rope_scaling.", type_key, "' is '", type,
                                            "'; supported: linear, llama3",
                                            deepseek ? ", yarn" : "", " (or no scaling)"));
  }
  ASSIGN_OR_RETURN(s.factor, FloatField(r, file, "factor", 0.0f));
  if (s.factor == 0.0f) return ConfigInvalid(file, "field 'rope_scaling.factor' is missing");
  if (type == "yarn") {
    RETURN_IF_ERROR(ReadYarn(r, file, s));
    return s;
  }
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
    return ConfigInvalid(file, "llama3 'rope_scaling' needs low_freq_factor and high_freq_factor");
  }
  return s;
}

// The experts of a mixture-of-experts config. Mixtral and OLMoE say the
// experts' width in intermediate_size and have no dense layers; Qwen's say
// it in moe_intermediate_size beside the dense layers' intermediate_size.
absl::StatusOr<MoeConfig> ReadMoe(const Json& j, const std::string& file, const ModelConfig& c,
                                  bool experts_in_intermediate, bool norm_topk_default) {
  MoeConfig m;
  const char* count = j.contains("num_local_experts") ? "num_local_experts" : "num_experts";
  ASSIGN_OR_RETURN(m.n_experts, IntField(j, file, count, std::nullopt, 1, 4096));
  ASSIGN_OR_RETURN(m.top_k, IntField(j, file, "num_experts_per_tok", std::nullopt, 1, 4096));
  if (m.top_k > m.n_experts) {
    return ConfigInvalid(file, absl::StrCat("field 'num_experts_per_tok' is ", m.top_k, " but '",
                                            count, "' is ", m.n_experts,
                                            "; a token cannot use more experts "
                                            "than there are"));
  }
  // Mixtral's softmax over the top-k logits is the renormalised top-k of
  // the softmax over all.
  ASSIGN_OR_RETURN(m.norm_topk_prob, BoolField(j, file, "norm_topk_prob", norm_topk_default));
  if (experts_in_intermediate) {
    m.expert_hidden = c.hidden_dim;
    for (const char* key : {"moe_intermediate_size", "shared_expert_intermediate_size",
                            "decoder_sparse_step", "mlp_only_layers"}) {
      if (j.contains(key) && !j[key].is_null()) {
        return ConfigInvalid(file,
                             absl::StrCat("field '", key, "' is not one this architecture has"));
      }
    }
    return m;
  }
  ASSIGN_OR_RETURN(m.expert_hidden,
                   IntField(j, file, "moe_intermediate_size", std::nullopt, 1, 1 << 20));
  ASSIGN_OR_RETURN(m.shared_hidden,
                   IntField(j, file, "shared_expert_intermediate_size", 0, 0, 1 << 20));
  ASSIGN_OR_RETURN(m.sparse_step, IntField(j, file, "decoder_sparse_step", 1, 1, c.n_layers));
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    const Json& layers = j["mlp_only_layers"];
    if (!layers.is_array())
      return ConfigInvalid(file, "field 'mlp_only_layers' must be a list of layers");
    for (const Json& l : layers) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= c.n_layers) {
        return ConfigInvalid(file, absl::StrCat("field 'mlp_only_layers' holds ", l.dump(),
                                                "; layers are in [0, ", c.n_layers, ")"));
      }
      m.dense_layers.push_back(l.get<int>());
    }
  }
  return m;
}

// A string field that must be one of `allowed` (the first when absent).
absl::StatusOr<std::string> ChoiceField(const Json& j, const std::string& file, const char* key,
                                        std::initializer_list<const char*> allowed) {
  if (!j.contains(key) || j[key].is_null()) return std::string(*allowed.begin());
  const Json& v = j[key];
  for (const char* a : allowed) {
    if (v == a) return std::string(a);
  }
  return ConfigInvalid(file, absl::StrCat("field '", key, "' is ", v.dump(), "; supported: \"",
                                          absl::StrJoin(allowed, "\", \""), "\""));
}

// DeepSeek V2 and V3's latent attention and experts (Kimi K2 is V3's).
absl::Status ReadDeepSeek(const Json& j, const std::string& file, bool v3, ModelConfig& c,
                          int& mtp_layers) {
  for (const char* key : {"num_local_experts", "num_experts", "shared_expert_intermediate_size",
                          "decoder_sparse_step", "mlp_only_layers", "head_dim", "clip_qkv",
                          "use_sliding_window", "sliding_window", "max_window_layers"}) {
    if (j.contains(key) && !j[key].is_null()) {
      return ConfigInvalid(file,
                           absl::StrCat("field '", key, "' is not one this architecture has"));
    }
  }
  MlaConfig& a = c.mla;
  ASSIGN_OR_RETURN(a.kv_lora_rank, IntField(j, file, "kv_lora_rank", std::nullopt, 1, 1 << 16));
  ASSIGN_OR_RETURN(a.q_lora_rank, IntField(j, file, "q_lora_rank", 0, 1, 1 << 16));
  ASSIGN_OR_RETURN(a.qk_nope_head_dim,
                   IntField(j, file, "qk_nope_head_dim", std::nullopt, 1, 4096));
  ASSIGN_OR_RETURN(a.qk_rope_head_dim,
                   IntField(j, file, "qk_rope_head_dim", std::nullopt, 2, 4096));
  ASSIGN_OR_RETURN(a.v_head_dim, IntField(j, file, "v_head_dim", std::nullopt, 1, 4096));
  // The rope part of q and of the key is stored pair by pair.
  ASSIGN_OR_RETURN(bool interleaved, BoolField(j, file, "rope_interleave", true));
  if (!interleaved) {
    return ConfigInvalid(file,
                         "field 'rope_interleave' is false; only DeepSeek's interleaved "
                         "rope dimensions are supported");
  }
  c.rope_layout = RopeLayout::kInterleaved;
  // Multi-token-prediction layers follow the model's own; the loader skips
  // their tensors.
  ASSIGN_OR_RETURN(mtp_layers, IntField(j, file, "num_nextn_predict_layers", 0, 0, 64));

  ASSIGN_OR_RETURN(int routed, IntField(j, file, "n_routed_experts", 0, 1, 4096));
  if (routed == 0) return absl::OkStatus();  // a dense model
  MoeConfig& m = c.moe;
  m.n_experts = routed;
  ASSIGN_OR_RETURN(m.top_k, IntField(j, file, "num_experts_per_tok", std::nullopt, 1, routed));
  ASSIGN_OR_RETURN(m.expert_hidden,
                   IntField(j, file, "moe_intermediate_size", std::nullopt, 1, 1 << 20));
  ASSIGN_OR_RETURN(int shared, IntField(j, file, "n_shared_experts", 0, 0, 64));
  m.shared_hidden = shared * m.expert_hidden;
  m.shared_gated = false;
  ASSIGN_OR_RETURN(int freq, IntField(j, file, "moe_layer_freq", 1, 1, c.n_layers));
  if (freq != 1) {
    return ConfigInvalid(file, absl::StrCat("field 'moe_layer_freq' is ", freq,
                                            "; only 1 (every layer after the dense ones) is "
                                            "supported"));
  }
  ASSIGN_OR_RETURN(int dense, IntField(j, file, "first_k_dense_replace", 0, 0, c.n_layers));
  for (int l = 0; l < dense; ++l) m.dense_layers.push_back(l);
  ASSIGN_OR_RETURN(m.norm_topk_prob, BoolField(j, file, "norm_topk_prob", false));
  ASSIGN_OR_RETURN(float scale, FloatField(j, file, "routed_scaling_factor", 1.0f));
  ASSIGN_OR_RETURN(int n_group, IntField(j, file, "n_group", 1, 1, routed));
  ASSIGN_OR_RETURN(int topk_group, IntField(j, file, "topk_group", 1, 1, routed));
  if (routed % n_group != 0) {
    return ConfigInvalid(file, absl::StrCat("field 'n_group' is ", n_group,
                                            ", which does not divide n_routed_experts ", routed));
  }
  if (topk_group > n_group) {
    return ConfigInvalid(
        file, absl::StrCat("field 'topk_group' is ", topk_group, ", more than n_group ", n_group));
  }
  if (v3) {
    RETURN_IF_ERROR(ChoiceField(j, file, "scoring_func", {"sigmoid"}).status());
    RETURN_IF_ERROR(ChoiceField(j, file, "topk_method", {"noaux_tc"}).status());
    m.scoring = MoeConfig::Scoring::kSigmoid;
    m.score_bias = true;
    m.group_score = MoeConfig::GroupScore::kBestTwo;
    m.n_group = n_group;
    m.topk_group = topk_group;
    m.routed_scale = scale;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ChoiceField(j, file, "scoring_func", {"softmax"}).status());
  ASSIGN_OR_RETURN(std::string method,
                   ChoiceField(j, file, "topk_method", {"greedy", "group_limited_greedy"}));
  if (method == "group_limited_greedy") {
    m.n_group = n_group;
    m.topk_group = topk_group;
  }
  // V2 scales the weights only when it does not renormalise them.
  if (!(m.norm_topk_prob && m.top_k > 1)) m.routed_scale = scale;
  m.norm_topk_prob = m.norm_topk_prob && m.top_k > 1;
  return absl::OkStatus();
}

// Fields only DeepSeek's configs have (ReadDeepSeek acts on them, or they
// describe training and the Python runtime).
bool IsDeepSeekField(const std::string& key) {
  static const std::set<std::string, std::less<>> kFields = {
      "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
      "rope_interleave", "n_routed_experts", "n_shared_experts", "moe_layer_freq",
      "first_k_dense_replace", "routed_scaling_factor", "n_group", "topk_group", "topk_method",
      "scoring_func", "num_nextn_predict_layers",
      // Inert: training losses, expert-parallel slicing, the Python classes.
      "aux_loss_alpha", "seq_aux", "ep_size", "auto_map"};
  return kFields.contains(key);
}

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
      "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
      "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob",
      "clip_qkv",
      // Inert: token ids (generation_config.json and the tokenizer say them),
      // the stored type (the tensors say it), training-only settings, and
      // tensor-parallel slicing of the same products (pretraining_tp).
      "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype",
      "transformers_version", "use_cache", "initializer_range", "attention_dropout",
      "pretraining_tp", "_name_or_path", "output_router_logits", "router_aux_loss_coef",
      "router_jitter_noise"};
  return kKnown.contains(key);
}

}  // namespace

absl::StatusOr<HubConfigFile> ReadHubConfigFile(const std::string& dir) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  ASSIGN_OR_RETURN(Json j, ReadJson(file));
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() &&
      j["architectures"].size() == 1 && j["architectures"][0].is_string()) {
    arch = j["architectures"][0].get<std::string>();
  }
  static const char* const kArchitectures[] = {
      "LlamaForCausalLM",      "MistralForCausalLM",   "Qwen2ForCausalLM",    "Qwen3ForCausalLM",
      "MixtralForCausalLM",    "Qwen2MoeForCausalLM",  "Qwen3MoeForCausalLM", "OlmoeForCausalLM",
      "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"};
  if (std::find(std::begin(kArchitectures), std::end(kArchitectures), arch) ==
      std::end(kArchitectures)) {
    return ConfigInvalid(
        file, absl::StrCat("field 'architectures' is ",
                           j.contains("architectures") ? j["architectures"].dump() : "missing",
                           "; supported: [\"", absl::StrJoin(kArchitectures, "\"], [\""), "\"]"));
  }
  const bool qwen2 = arch == "Qwen2ForCausalLM" || arch == "Qwen2MoeForCausalLM";
  const bool qwen3 = arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM";
  const bool olmoe = arch == "OlmoeForCausalLM";
  const bool mixtral = arch == "MixtralForCausalLM";
  const bool moe =
      mixtral || olmoe || arch == "Qwen2MoeForCausalLM" || arch == "Qwen3MoeForCausalLM";
  const bool deepseek_v3 = arch == "DeepseekV3ForCausalLM";
  const bool deepseek = deepseek_v3 || arch == "DeepseekV2ForCausalLM";
  for (const auto& [key, value] : j.items()) {
    if (!IsKnownField(key) && !(deepseek && IsDeepSeekField(key))) {
      return ConfigInvalid(
          file,
          absl::StrCat("field '", key, "' (", value.dump().substr(0, 60), ") is not one a ", arch,
                       " model is read with; remove it if it does not change "
                       "the model's outputs"));
    }
  }
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const Json& types = j["layer_types"];
    if (!types.is_array() || !std::all_of(types.begin(), types.end(),
                                          [](const Json& t) { return t == "full_attention"; })) {
      return ConfigInvalid(file, absl::StrCat("field 'layer_types' is ", types.dump().substr(0, 80),
                                              "; only full_attention layers are supported"));
    }
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    return ConfigInvalid(file, absl::StrCat("field 'hidden_act' is ", j["hidden_act"].dump(),
                                            "; only \"silu\" is supported"));
  }
  ASSIGN_OR_RETURN(bool mlp_bias, BoolField(j, file, "mlp_bias", false));
  if (mlp_bias)
    return ConfigInvalid(file, "field 'mlp_bias' is true; MLP biases are not supported");

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
  if (olmoe) {
    c.qk_norm = QkNorm::kWhole;  // over the whole q and k projections
    if (j.contains("clip_qkv") && !j["clip_qkv"].is_null()) {
      return ConfigInvalid(file, absl::StrCat("field 'clip_qkv' is ", j["clip_qkv"].dump(),
                                              "; clipping q/k/v is not supported (null only)"));
    }
  }
  if (moe) {
    ASSIGN_OR_RETURN(c.moe, ReadMoe(j, file, c, mixtral || olmoe, /*norm_topk_default=*/mixtral));
  }
  ASSIGN_OR_RETURN(c.rope_scaling, ReadRopeScaling(j, file, deepseek));
  c.rope_layout = RopeLayout::kHalfSplit;
  int mtp_layers = 0;
  if (deepseek) RETURN_IF_ERROR(ReadDeepSeek(j, file, deepseek_v3, c, mtp_layers));

  // Full attention equals sliding-window attention up to the window.
  ASSIGN_OR_RETURN(bool sliding,
                   BoolField(j, file, "use_sliding_window", !qwen2 && !qwen3 && !olmoe));
  ASSIGN_OR_RETURN(int window,
                   IntField(j, file, "sliding_window", 0, 0, std::numeric_limits<int>::max()));
  if (sliding && window > 0 && window < c.seq_len) c.seq_len = window;

  if (absl::Status s = c.Validate(); !s.ok()) return ConfigInvalid(file, std::string(s.message()));
  ASSIGN_OR_RETURN(HubQuantization quantization, ReadHubQuantization(j, file));
  return HubConfigFile{c, quantization, mtp_layers};
}

absl::StatusOr<ModelConfig> ReadHubConfig(const std::string& dir) {
  ASSIGN_OR_RETURN(HubConfigFile f, ReadHubConfigFile(dir));
  return f.config;
}

}  // namespace tandem
