#include "common/model/gguf_model.h"

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
#include "common/model/gguf_writer.h"

// Q and K are neither read nor written with a row permutation: llama.cpp's
// converters already permute Hugging Face checkpoints so that GGUF's LLAMA
// architecture rotates consecutive pairs, the RoPE of llama2.c checkpoints
// and of this project.
namespace tandem {
namespace {

constexpr char kArchitecture[] = "llama";

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

absl::StatusOr<ModelConfig> ReadConfig(const GgufFile& file) {
  ModelConfig c;
  ASSIGN_OR_RETURN(c.seq_len, GetSize(file, "llama.context_length"));
  ASSIGN_OR_RETURN(c.dim, GetSize(file, "llama.embedding_length"));
  ASSIGN_OR_RETURN(c.n_layers, GetSize(file, "llama.block_count"));
  ASSIGN_OR_RETURN(c.hidden_dim, GetSize(file, "llama.feed_forward_length"));
  ASSIGN_OR_RETURN(c.n_heads, GetSize(file, "llama.attention.head_count"));
  c.n_kv_heads = c.n_heads;  // llama.cpp's default when the key is absent
  if (file.HasKey("llama.attention.head_count_kv")) {
    ASSIGN_OR_RETURN(c.n_kv_heads, GetSize(file, "llama.attention.head_count_kv"));
  }
  if (file.HasKey("llama.rope.freq_base")) {
    ASSIGN_OR_RETURN(c.rope_theta, GetFloat(file, "llama.rope.freq_base"));
  }
  ASSIGN_OR_RETURN(c.norm_eps, GetFloat(file, "llama.attention.layer_norm_rms_epsilon"));
  if (file.HasKey("llama.vocab_size")) {
    ASSIGN_OR_RETURN(c.vocab_size, GetSize(file, "llama.vocab_size"));
  } else if (const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
             embd != nullptr && embd->dims.size() == 2 &&
             embd->dims[1] <= std::numeric_limits<int>::max()) {
    c.vocab_size = static_cast<int>(embd->dims[1]);
  } else {
    return Invalid(file.path(), "has neither llama.vocab_size nor a 2-D token_embd.weight");
  }
  c.shared_classifier = file.FindTensor("output.weight") == nullptr;
  if (absl::Status s = c.Validate(); !s.ok()) {
    return Invalid(file.path(), absl::StrCat("has impossible llama metadata: ", s.message()));
  }
  if (file.HasKey("llama.rope.dimension_count")) {
    ASSIGN_OR_RETURN(int rope_dims, GetSize(file, "llama.rope.dimension_count"));
    if (rope_dims != c.head_dim()) {
      return Invalid(file.path(),
                     absl::StrCat("rotates ", rope_dims, " of ", c.head_dim(),
                                  " dimensions per head; partial RoPE is not supported"));
    }
  }
  return c;
}

// The tensors of a llama model with their GGUF shapes (ne0 = input width) and
// where their weights live in a ModelWeights (const or not).
template <typename Weights>
auto TensorTable(Weights& w) {
  using Span = std::conditional_t<std::is_const_v<Weights>, const Tensor, Tensor>;
  struct Row {
    std::string name;
    std::vector<int64_t> dims;
    Span* span;
  };
  const ModelConfig& c = w.config;
  const int64_t d = c.dim, h = c.hidden_dim, kv = c.kv_dim(), v = c.vocab_size;
  std::vector<Row> rows;
  rows.push_back({"token_embd.weight", {d, v}, &w.token_embedding});
  for (int l = 0; l < c.n_layers; ++l) {
    auto& layer = w.layers[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    rows.push_back({p + "attn_norm.weight", {d}, &layer.rms_att});
    rows.push_back({p + "attn_q.weight", {d, d}, &layer.wq});
    rows.push_back({p + "attn_k.weight", {d, kv}, &layer.wk});
    rows.push_back({p + "attn_v.weight", {d, kv}, &layer.wv});
    rows.push_back({p + "attn_output.weight", {d, d}, &layer.wo});
    rows.push_back({p + "ffn_norm.weight", {d}, &layer.rms_ffn});
    rows.push_back({p + "ffn_gate.weight", {d, h}, &layer.w1});
    rows.push_back({p + "ffn_down.weight", {h, d}, &layer.w2});
    rows.push_back({p + "ffn_up.weight", {d, h}, &layer.w3});
  }
  rows.push_back({"output_norm.weight", {d}, &w.rms_final});
  if (!c.shared_classifier) rows.push_back({"output.weight", {d, v}, &w.classifier});
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
  if (*architecture != kArchitecture) {
    return Invalid(path, absl::StrCat("has architecture '", *architecture, "'; only '",
                                      kArchitecture, "' is supported"));
  }
  auto weights = std::make_unique<ModelWeights>();
  ASSIGN_OR_RETURN(weights->config, ReadConfig(file));
  weights->source = path;
  weights->layers.resize(weights->config.n_layers);
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
                                  "; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, "
                                  "Q6_K (re-quantize it to one of them, e.g. Q4_K_M)"));
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
      return Invalid(path, absl::StrCat("has tensor '", t.name,
                                        "', which a llama model without extensions does not use"));
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
    *row.span = Tensor(data, *DTypeOf(t.type), t.num_elements);
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
  // What this writer's metadata cannot say would silently change the model.
  if (c.rope_layout != RopeLayout::kInterleaved || c.attention_bias || c.head_size != 0 ||
      c.rope_scaling.type != RopeScaling::Type::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights from '", w.source, "' (", c.ToString(),
        ") need half-split RoPE, attention biases, an explicit head_dim or RoPE scaling, which "
        "this GGUF writer does not write; keep them as a Hugging Face folder"));
  }
  const auto table = TensorTable(w);
  for (const auto& row : table) {
    if (static_cast<int64_t>(row.span->size()) != NumElements(row.dims)) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights from '", w.source, "' give ", row.name, " ", row.span->size(),
                       " values; the config needs ", NumElements(row.dims)));
    }
  }

  const bool half = type != GgufTensorType::kF32;
  const bool bf16 = type == GgufTensorType::kBF16;
  GgufWriter writer;
  writer.AddString("general.architecture", kArchitecture);
  // ALL_F32, MOSTLY_F16 or MOSTLY_BF16, as llama.cpp numbers them.
  writer.AddUint32("general.file_type", bf16 ? 32 : half ? 1 : 0);
  writer.AddUint32("llama.context_length", c.seq_len);
  writer.AddUint32("llama.embedding_length", c.dim);
  writer.AddUint32("llama.block_count", c.n_layers);
  writer.AddUint32("llama.feed_forward_length", c.hidden_dim);
  writer.AddUint32("llama.attention.head_count", c.n_heads);
  writer.AddUint32("llama.attention.head_count_kv", c.n_kv_heads);
  writer.AddUint32("llama.rope.dimension_count", c.head_dim());
  writer.AddFloat32("llama.rope.freq_base", c.rope_theta);
  writer.AddFloat32("llama.attention.layer_norm_rms_epsilon", c.norm_eps);
  writer.AddUint32("llama.vocab_size", c.vocab_size);
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
  for (const auto& row : table) {
    const std::vector<float> values = row.span->ToFloats();
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
