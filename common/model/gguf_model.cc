#include "common/model/gguf_model.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/gguf.h"
#include "common/model/gguf_deepseek.h"
#include "common/model/gguf_writer.h"
#include "common/model/tensor_list.h"

// Q and K are neither read nor written with a row permutation: llama.cpp's
// converters permute Hugging Face checkpoints of the `llama` architecture so
// that it rotates consecutive pairs (the RoPE of llama2.c checkpoints), and
// keep the rows of `qwen2` and `qwen3` as the hub stores them, which those
// architectures rotate in half-split pairs.
namespace tandem {
namespace {

// The architectures read and written here, by their general.architecture.
// llama.cpp's mixture-of-experts architectures renormalise the top-k
// weights or not by architecture, and make every layer sparse.
enum class Experts : uint8_t { kNone, kOptional, kRequired };
struct Architecture {
  const char* name;
  RopeLayout rope;
  bool attention_bias;  // q/k/v biases
  QkNorm qk_norm;
  Experts experts;
  bool norm_topk_prob;  // with experts
};
constexpr Architecture kArchitectures[] = {
    {"llama", RopeLayout::kInterleaved, false, QkNorm::kNone, Experts::kOptional, true},
    {"qwen2", RopeLayout::kHalfSplit, true, QkNorm::kNone, Experts::kNone, false},
    {"qwen3", RopeLayout::kHalfSplit, false, QkNorm::kPerHead, Experts::kNone, false},
    {"qwen2moe", RopeLayout::kHalfSplit, true, QkNorm::kNone, Experts::kRequired, false},
    {"qwen3moe", RopeLayout::kHalfSplit, false, QkNorm::kPerHead, Experts::kRequired, true},
    {"olmoe", RopeLayout::kHalfSplit, false, QkNorm::kWhole, Experts::kRequired, false},
};

const Architecture* FindArchitecture(std::string_view name) {
  for (const Architecture& a : kArchitectures) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

// Owns what the tensors of a loaded model point into.
struct GgufModelStorage {
  std::shared_ptr<const void> mapping;  // held when a tensor is used in place
  std::vector<uint64_t> copied;         // misaligned tensors, in their own type
};

absl::Status Invalid(const std::string& path, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("GGUF file '", path, "' ", problem));
}

// A missing key makes the file malformed as a model, not a lookup miss.
absl::Status AsInvalid(absl::Status s) {
  if (absl::IsNotFound(s)) return absl::InvalidArgumentError(s.message());
  return s;
}

absl::StatusOr<int> GetSize(const GgufFile& file, std::string_view key) {
  absl::StatusOr<uint32_t> v = file.GetUint32(key);
  if (!v.ok()) return AsInvalid(v.status());
  if (*v > static_cast<uint32_t>(std::numeric_limits<int>::max())) {
    return Invalid(file.path(),
                   absl::StrCat("has metadata '", std::string(key), "' = ", *v, ", too large"));
  }
  return static_cast<int>(*v);
}

absl::StatusOr<float> GetFloat(const GgufFile& file, std::string_view key) {
  absl::StatusOr<float> v = file.GetFloat(key);
  if (!v.ok()) return AsInvalid(v.status());
  return *v;
}

absl::StatusOr<ModelConfig> ReadConfig(const GgufFile& file, const Architecture& arch) {
  const std::string a = arch.name;
  auto key = [&a](const char* field) { return absl::StrCat(a, ".", field); };
  ModelConfig c;
  c.rope_layout = arch.rope;
  c.attention_bias = arch.attention_bias;
  c.qk_norm = arch.qk_norm;
  ASSIGN_OR_RETURN(c.seq_len, GetSize(file, key("context_length")));
  ASSIGN_OR_RETURN(c.dim, GetSize(file, key("embedding_length")));
  ASSIGN_OR_RETURN(c.n_layers, GetSize(file, key("block_count")));
  ASSIGN_OR_RETURN(c.hidden_dim, GetSize(file, key("feed_forward_length")));
  ASSIGN_OR_RETURN(c.n_heads, GetSize(file, key("attention.head_count")));
  c.n_kv_heads = c.n_heads;  // llama.cpp's default when the key is absent
  if (file.HasKey(key("attention.head_count_kv"))) {
    ASSIGN_OR_RETURN(c.n_kv_heads, GetSize(file, key("attention.head_count_kv")));
  }
  if (file.HasKey(key("attention.key_length"))) {
    ASSIGN_OR_RETURN(c.head_size, GetSize(file, key("attention.key_length")));
    int value_length = c.head_size;
    if (file.HasKey(key("attention.value_length"))) {
      ASSIGN_OR_RETURN(value_length, GetSize(file, key("attention.value_length")));
    }
    if (value_length != c.head_size) {
      return Invalid(file.path(), absl::StrCat("has ", key("attention.key_length"), " ",
                                               c.head_size, " but value_length ", value_length,
                                               "; keys and values of one width are supported"));
    }
    if (c.n_heads > 0 && int64_t{c.head_size} * c.n_heads == c.dim) c.head_size = 0;
  }
  if (file.HasKey(key("rope.freq_base"))) {
    ASSIGN_OR_RETURN(c.rope_theta, GetFloat(file, key("rope.freq_base")));
  }
  ASSIGN_OR_RETURN(c.norm_eps, GetFloat(file, key("attention.layer_norm_rms_epsilon")));
  if (file.HasKey(key("vocab_size"))) {
    ASSIGN_OR_RETURN(c.vocab_size, GetSize(file, key("vocab_size")));
  } else if (const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
             embd != nullptr && embd->dims.size() == 2 &&
             embd->dims[1] <= std::numeric_limits<int>::max()) {
    c.vocab_size = static_cast<int>(embd->dims[1]);
  } else {
    return Invalid(file.path(),
                   absl::StrCat("has neither ", key("vocab_size"), " nor a 2-D token_embd.weight"));
  }
  c.shared_classifier = file.FindTensor("output.weight") == nullptr;
  if (file.HasKey(key("expert_count")) && arch.experts != Experts::kNone) {
    MoeConfig& m = c.moe;
    ASSIGN_OR_RETURN(m.n_experts, GetSize(file, key("expert_count")));
    ASSIGN_OR_RETURN(m.top_k, GetSize(file, key("expert_used_count")));
    m.expert_hidden = c.hidden_dim;
    if (file.HasKey(key("expert_feed_forward_length"))) {
      ASSIGN_OR_RETURN(m.expert_hidden, GetSize(file, key("expert_feed_forward_length")));
    }
    if (file.HasKey(key("expert_shared_feed_forward_length"))) {
      ASSIGN_OR_RETURN(m.shared_hidden, GetSize(file, key("expert_shared_feed_forward_length")));
    }
    m.norm_topk_prob = arch.norm_topk_prob;
    if (m.n_experts == 0) m = MoeConfig{};  // llama.cpp writes 0 for a dense llama
  } else if (arch.experts == Experts::kRequired) {
    return Invalid(file.path(), absl::StrCat("has no metadata '", key("expert_count"), "'"));
  } else if (file.HasKey(key("expert_count"))) {
    return Invalid(file.path(), absl::StrCat("has metadata '", key("expert_count"), "', but ", a,
                                             " models have no experts"));
  }
  if (absl::Status s = c.Validate(); !s.ok()) {
    return Invalid(file.path(), absl::StrCat("has impossible ", a, " metadata: ", s.message()));
  }
  for (const char* scaling : {"rope.scaling.type", "rope.scaling.factor"}) {
    if (file.HasKey(key(scaling))) {
      return Invalid(file.path(), absl::StrCat("has metadata '", key(scaling),
                                               "'; RoPE scaling from GGUF is not supported (load "
                                               "the Hugging Face folder instead)"));
    }
  }
  if (file.HasKey(key("rope.dimension_count"))) {
    ASSIGN_OR_RETURN(int rope_dims, GetSize(file, key("rope.dimension_count")));
    if (rope_dims != c.head_dim()) {
      return Invalid(file.path(),
                     absl::StrCat("rotates ", rope_dims, " of ", c.head_dim(),
                                  " dimensions per head; partial RoPE is not supported"));
    }
  }
  return c;
}

// The GGUF name of a tensor (llama.cpp's names).
std::string GgufName(const TensorSpec& spec) {
  using R = TensorRole;
  const std::string p = absl::StrCat("blk.", spec.layer, ".");
  switch (spec.role) {
    case R::kEmbedding:
      return "token_embd.weight";
    case R::kFinalNorm:
      return "output_norm.weight";
    case R::kClassifier:
      return "output.weight";
    case R::kAttnNorm:
      return p + "attn_norm.weight";
    case R::kWq:
      return p + "attn_q.weight";
    case R::kWk:
      return p + "attn_k.weight";
    case R::kWv:
      return p + "attn_v.weight";
    case R::kWo:
      return p + "attn_output.weight";
    case R::kBq:
      return p + "attn_q.bias";
    case R::kBk:
      return p + "attn_k.bias";
    case R::kBv:
      return p + "attn_v.bias";
    case R::kQNorm:
      return p + "attn_q_norm.weight";
    case R::kKNorm:
      return p + "attn_k_norm.weight";
    case R::kFfnNorm:
      return p + "ffn_norm.weight";
    case R::kGate:
      return p + "ffn_gate.weight";
    case R::kDown:
      return p + "ffn_down.weight";
    case R::kUp:
      return p + "ffn_up.weight";
    case R::kRouter:
      return p + "ffn_gate_inp.weight";
    // Every expert's matrices in one tensor, ne2 = the expert.
    case R::kExpertGate:
      return p + "ffn_gate_exps.weight";
    case R::kExpertDown:
      return p + "ffn_down_exps.weight";
    case R::kExpertUp:
      return p + "ffn_up_exps.weight";
    case R::kSharedGate:
      return p + "ffn_gate_shexp.weight";
    case R::kSharedDown:
      return p + "ffn_down_shexp.weight";
    case R::kSharedUp:
      return p + "ffn_up_shexp.weight";
    case R::kSharedExpertGate:
      return p + "ffn_gate_inp_shexp.weight";
    // llama.cpp's deepseek2 names.
    case R::kRouterBias:
      return p + "exp_probs_b.bias";
    case R::kWqA:
      return p + "attn_q_a.weight";
    case R::kQANorm:
      return p + "attn_q_a_norm.weight";
    case R::kWqB:
      return p + "attn_q_b.weight";
    case R::kWkvA:
      return p + "attn_kv_a_mqa.weight";
    case R::kKvANorm:
      return p + "attn_kv_a_norm.weight";
    case R::kWkvB:
      return p + "attn_kv_b.weight";
  }
  return "";
}

// The tensors of a model with their GGUF shapes (ne0 = input width) and
// where their weights live in a ModelWeights (const or not): one span, or
// for the experts' merged matrices one per expert, in order.
template <typename Weights>
auto TensorTable(Weights& w) {
  using Span = std::conditional_t<std::is_const_v<Weights>, const Tensor, Tensor>;
  struct Row {
    std::string name;
    std::vector<int64_t> dims;
    std::vector<Span*> spans;
  };
  std::vector<Row> rows;
  for (const TensorSpec& spec : ModelTensors(w.config)) {
    std::vector<int64_t> dims(spec.shape.rbegin(), spec.shape.rend());
    if (spec.expert > 0) {  // expert 0 made the row, a few rows back
      const std::string name = GgufName(spec);
      auto row = std::find_if(rows.rbegin(), rows.rend(),
                              [&name](const Row& r) { return r.name == name; });
      row->spans.push_back(&TensorOf(w, spec));
      continue;
    }
    if (spec.expert == 0) dims.push_back(w.config.moe.n_experts);
    rows.push_back({GgufName(spec), dims, {&TensorOf(w, spec)}});
  }
  return rows;
}

int64_t NumElements(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// Shapes compare equal up to trailing 1s, which ggml writers drop.
bool SameShape(std::vector<int64_t> a, std::vector<int64_t> b) {
  while (!a.empty() && a.back() == 1) a.pop_back();
  while (!b.empty() && b.back() == 1) b.pop_back();
  return a == b;
}

// The types a tensor may have; nullopt for the rest.
std::optional<DType> DTypeOf(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return DType::kF32;
    case GgmlType::kF16:
      return DType::kF16;
    case GgmlType::kBF16:
      return DType::kBF16;
    case GgmlType::kQ8_0:
      return DType::kQ8_0;
    case GgmlType::kQ4_0:
      return DType::kQ4_0;
    case GgmlType::kQ5_0:
      return DType::kQ5_0;
    case GgmlType::kQ5_1:
      return DType::kQ5_1;
    case GgmlType::kQ4_K:
      return DType::kQ4_K;
    case GgmlType::kQ5_K:
      return DType::kQ5_K;
    case GgmlType::kQ6_K:
      return DType::kQ6_K;
    default:
      return std::nullopt;
  }
}

// Tensors are used from the mapping unless misaligned for their type (a
// quantized block's fields are 16-bit).
bool UsableInPlace(const GgufTensorInfo& t) {
  const DType type = *DTypeOf(t.type);
  const size_t align = IsQuantized(type) ? 2 : DTypeSize(type);
  return reinterpret_cast<uintptr_t>(t.data.data()) % align == 0;
}

// The metadata of the llama family's architectures.
absl::Status WriteMetadata(const ModelConfig& c, const Architecture& arch, GgufWriter& writer) {
  const std::string a = arch.name;
  auto key = [&a](const char* field) { return absl::StrCat(a, ".", field); };
  writer.AddUint32(key("context_length"), c.seq_len);
  writer.AddUint32(key("embedding_length"), c.dim);
  writer.AddUint32(key("block_count"), c.n_layers);
  writer.AddUint32(key("feed_forward_length"), c.hidden_dim);
  writer.AddUint32(key("attention.head_count"), c.n_heads);
  writer.AddUint32(key("attention.head_count_kv"), c.n_kv_heads);
  writer.AddUint32(key("rope.dimension_count"), c.head_dim());
  if (c.head_size != 0) {
    writer.AddUint32(key("attention.key_length"), c.head_dim());
    writer.AddUint32(key("attention.value_length"), c.head_dim());
  }
  writer.AddFloat32(key("rope.freq_base"), c.rope_theta);
  writer.AddFloat32(key("attention.layer_norm_rms_epsilon"), c.norm_eps);
  writer.AddUint32(key("vocab_size"), c.vocab_size);
  if (c.moe.n_experts > 0) {
    writer.AddUint32(key("expert_count"), c.moe.n_experts);
    writer.AddUint32(key("expert_used_count"), c.moe.top_k);
    if (arch.experts == Experts::kRequired && arch.qk_norm != QkNorm::kWhole) {
      writer.AddUint32(key("expert_feed_forward_length"), c.moe.expert_hidden);
    } else if (c.moe.expert_hidden != c.hidden_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          arch.name, " GGUF files say the experts' width in feed_forward_length; this model's (",
          c.moe.expert_hidden, ") differs from its dense width (", c.hidden_dim, ")"));
    }
    if (c.moe.shared_hidden > 0) {
      writer.AddUint32(key("expert_shared_feed_forward_length"), c.moe.shared_hidden);
    }
  }
  return absl::OkStatus();
}

// The vocabulary, or the key llama.cpp requires without one.
absl::Status WriteVocab(const ModelConfig& c, const GgufVocab* vocab, GgufWriter& writer) {
  if (vocab == nullptr) {
    // Weights only: llama.cpp requires the key and accepts "no_vocab".
    writer.AddString("tokenizer.ggml.model", "no_vocab");
  } else {
    const size_t n = vocab->tokens.size();
    if (n != static_cast<size_t>(c.vocab_size) || vocab->scores.size() != n ||
        vocab->types.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("a vocabulary of ", n, " tokens (", vocab->scores.size(), " scores, ",
                       vocab->types.size(), " types) cannot go with a model of ", c.vocab_size));
    }
    writer.AddString("tokenizer.ggml.model", "llama");
    writer.AddStringArray("tokenizer.ggml.tokens", vocab->tokens);
    writer.AddFloat32Array("tokenizer.ggml.scores", vocab->scores);
    writer.AddInt32Array("tokenizer.ggml.token_type", vocab->types);
    if (vocab->bos_id >= 0) writer.AddUint32("tokenizer.ggml.bos_token_id", vocab->bos_id);
    if (vocab->eos_id >= 0) writer.AddUint32("tokenizer.ggml.eos_token_id", vocab->eos_id);
    if (vocab->unk_id >= 0) writer.AddUint32("tokenizer.ggml.unknown_token_id", vocab->unk_id);
    writer.AddBool("tokenizer.ggml.add_bos_token", vocab->bos_id >= 0);
    writer.AddBool("tokenizer.ggml.add_eos_token", false);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadGgufModel(const std::string& path) {
  ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
  return LoadGgufModel(file);
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadGgufModel(const GgufFile& file) {
  const std::string& path = file.path();
  if (file.tensors().empty()) {
    return Invalid(path, "has no tensors (a vocabulary-only file?), so it holds no model weights");
  }
  absl::StatusOr<std::string> architecture = file.GetString("general.architecture");
  if (!architecture.ok()) return AsInvalid(architecture.status());
  const bool deepseek = *architecture == kGgufDeepSeek;
  const Architecture* arch = FindArchitecture(*architecture);
  if (arch == nullptr && !deepseek) {
    return Invalid(path, absl::StrCat("has architecture '", *architecture,
                                      "'; supported: llama, qwen2, qwen3, qwen2moe, qwen3moe, "
                                      "olmoe, deepseek2"));
  }
  auto weights = std::make_unique<ModelWeights>();
  if (deepseek) {
    ASSIGN_OR_RETURN(weights->config, ReadGgufDeepSeek(file));
  } else {
    ASSIGN_OR_RETURN(weights->config, ReadConfig(file, *arch));
  }
  weights->source = path;
  SizeLayers(*weights);
  const auto table = TensorTable(*weights);

  std::set<std::string_view> expected;
  int64_t copied_words = 0;
  for (const auto& row : table) {
    expected.insert(row.name);
    const GgufTensorInfo* t = file.FindTensor(row.name);
    if (t == nullptr) return Invalid(path, absl::StrCat("has no tensor '", row.name, "'"));
    if (!SameShape(t->dims, row.dims)) {
      return Invalid(
          path, absl::StrCat("has tensor '", row.name, "' of shape [", absl::StrJoin(t->dims, ", "),
                             "] but its metadata (", weights->config.ToString(), ") needs [",
                             absl::StrJoin(row.dims, ", "), "] (ne0 first)"));
    }
    const std::optional<DType> type = DTypeOf(t->type);
    if (!type.has_value()) {
      return Invalid(path,
                     absl::StrCat("has tensor '", row.name, "' of type ", GgmlTypeName(t->type),
                                  "; supported: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, "
                                  "Q5_K, Q6_K (re-quantize it to one of them, e.g. Q4_K_M)"));
    }
    // Norms are applied element by element; llama.cpp never quantizes them.
    if (IsQuantized(*type) && row.dims.size() == 1) {
      return Invalid(path,
                     absl::StrCat("has vector '", row.name, "' of type ", GgmlTypeName(t->type),
                                  "; vectors must be F32, F16 or BF16"));
    }
    if (!UsableInPlace(*t)) copied_words += (t->data.size() + 7) / 8;
  }
  // Tensors we do not know (rope_freqs, biases, ...) would change the model's
  // output if ignored, so they are refused rather than skipped.
  for (const GgufTensorInfo& t : file.tensors()) {
    if (expected.count(t.name) == 0) {
      return Invalid(path, absl::StrCat("has tensor '", t.name, "', which a ", *architecture,
                                        " model without extensions does not use"));
    }
  }

  auto storage = std::make_shared<GgufModelStorage>();
  // 16-bit and quantized tensors keep their type: the backend multiplies
  // them as they are.
  storage->copied.resize(static_cast<size_t>(copied_words));
  uint64_t* next = storage->copied.data();
  for (const auto& row : table) {
    const GgufTensorInfo& t = *file.FindTensor(row.name);
    const void* data = t.data.data();
    if (UsableInPlace(t)) {
      storage->mapping = file.keep_alive();
    } else {
      std::memcpy(next, t.data.data(), t.data.size());
      data = next;
      next += (t.data.size() + 7) / 8;
    }
    // The experts' matrices follow one another in a merged tensor.
    const int64_t each = t.num_elements / static_cast<int64_t>(row.spans.size());
    const DType type = *DTypeOf(t.type);
    for (size_t i = 0; i < row.spans.size(); ++i) {
      *row.spans[i] =
          Tensor(static_cast<const uint8_t*>(data) + DTypeBytes(type, each * i), type, each);
    }
  }
  if (weights->config.shared_classifier) weights->classifier = weights->token_embedding;
  weights->storage = std::move(storage);
  return weights;
}

absl::Status WriteGgufModel(const ModelWeights& w, const std::string& path, GgufTensorType type,
                            const GgufVocab* vocab) {
  const ModelConfig& c = w.config;
  RETURN_IF_ERROR(c.Validate());
  if (w.layers.size() != static_cast<size_t>(c.n_layers)) {
    return absl::InvalidArgumentError(absl::StrCat("weights from '", w.source, "' have ",
                                                   w.layers.size(), " layers; the config says ",
                                                   c.n_layers));
  }
  const bool deepseek = c.has_deepseek_parts();
  // The architecture that says this model; what its metadata cannot say
  // would silently change the model.
  const Architecture* arch = nullptr;
  const bool moe = c.moe.n_experts > 0;
  for (const Architecture& a : kArchitectures) {
    const bool experts_fit =
        moe ? a.experts != Experts::kNone && a.norm_topk_prob == c.moe.norm_topk_prob
            : a.experts != Experts::kRequired;
    if (a.rope == c.rope_layout && a.attention_bias == c.attention_bias && a.qk_norm == c.qk_norm &&
        experts_fit) {
      arch = &a;
    }
  }
  const bool all_sparse = c.moe.sparse_step == 1 && c.moe.dense_layers.empty();
  const bool shared_fits = c.moe.shared_hidden == 0 || (arch != nullptr && arch->attention_bias);
  if (!deepseek && (arch == nullptr || c.rope_scaling.type != RopeScaling::Type::kNone ||
                    !all_sparse || !shared_fits)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights from '", w.source, "' (", c.ToString(),
        ") match no GGUF architecture this writer writes (llama: interleaved RoPE; qwen2: "
        "half-split RoPE with q/k/v biases; qwen3: half-split RoPE with per-head q/k norms; "
        "with experts: llama (renormalised top-k), qwen2moe (a shared expert, top-k as is), "
        "qwen3moe (renormalised), olmoe (whole-projection q/k norms, top-k as is), every layer "
        "sparse; none with RoPE scaling); keep them as a Hugging Face folder"));
  }
  const auto table = TensorTable(w);
  for (const auto& row : table) {
    int64_t given = 0;
    for (const Tensor* span : row.spans) given += span->numel;
    if (given != NumElements(row.dims)) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights from '", w.source, "' give ", row.name, " ", given,
                       " values; the config needs ", NumElements(row.dims)));
    }
  }

  const bool half = type != GgufTensorType::kF32;
  const bool bf16 = type == GgufTensorType::kBF16;
  GgufWriter writer;
  writer.AddString("general.architecture", deepseek ? kGgufDeepSeek : arch->name);
  // ALL_F32, MOSTLY_F16 or MOSTLY_BF16, as llama.cpp numbers them.
  writer.AddUint32("general.file_type", bf16 ? 32 : half ? 1 : 0);
  if (deepseek) {
    RETURN_IF_ERROR(WriteGgufDeepSeek(c, writer));
  } else {
    RETURN_IF_ERROR(WriteMetadata(c, *arch, writer));
  }
  RETURN_IF_ERROR(WriteVocab(c, vocab, writer));
  for (const auto& row : table) {
    std::vector<float> values;
    for (const Tensor* span : row.spans) {
      const std::vector<float> part = span->ToFloats();
      values.insert(values.end(), part.begin(), part.end());
    }
    // Norm vectors stay F32 in 16-bit files, as llama.cpp's converters keep them.
    if (!half || row.dims.size() == 1) {
      writer.AddTensor(row.name, row.dims, GgmlType::kF32,
                       std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(values.data()),
                                            reinterpret_cast<const uint8_t*>(values.data()) +
                                                values.size() * sizeof(float)));
      continue;
    }
    std::vector<uint8_t> bytes(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t h = bf16 ? Fp32ToBf16(values[i]) : Fp32ToFp16(values[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
    writer.AddTensor(row.name, row.dims, bf16 ? GgmlType::kBF16 : GgmlType::kF16, std::move(bytes));
  }
  return writer.WriteFile(path);
}

}  // namespace tandem
