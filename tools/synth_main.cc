// tandem-synth: writes a model file with deterministic random weights of a
// chosen shape, for tests and benchmarks that need a checkpoint of a real
// model's size without its weights.
//
//   tandem-synth --output /tmp/s15m.bin
//   tandem-synth --output /tmp/gqa.gguf --format gguf --gguf_type f16
//       --shape custom --dim 256 --hidden_dim 688 --n_layers 4 --n_heads 8
//       --n_kv_heads 2 --vocab_size 512 --seq_len 256 --untied
//
// Exit status: 0 written, 2 bad flags, 1 the file could not be written.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/flags.h"
#include "common/model/gguf_model.h"
#include "common/model/llama2c_checkpoint.h"
#include "common/model/model_config.h"
#include "common/model/synthetic.h"

ABSL_FLAG(std::string, output, "", "File to write (required); replaced if it exists.");
ABSL_FLAG(std::string, format, "llama2c", "File format: llama2c (checkpoint v0, fp32) or gguf.");
ABSL_FLAG(std::string, gguf_type, "f32",
          "Tensor type of --format gguf: f32, f16 or bf16 (norm vectors stay f32).");
ABSL_FLAG(std::string, shape, "stories15M",
          "Base shape: stories15M, stories110M, llama3.2-1b, llama3-8b, llama3-70b, "
          "qwen3-small, qwen3-0.6b (GGUF qwen3), the mixtures of experts qwen3-30b-a3b, "
          "mixtral-8x7b, olmoe-1b-7b, or custom (which needs --dim, --hidden_dim, "
          "--n_layers, --n_heads, --vocab_size and --seq_len). The size flags below override it.");
ABSL_FLAG(int32_t, dim, 0, "Residual width; 0 keeps the shape's.");
ABSL_FLAG(int32_t, hidden_dim, 0, "SwiGLU inner width; 0 keeps the shape's.");
ABSL_FLAG(int32_t, n_layers, 0, "Number of transformer blocks; 0 keeps the shape's.");
ABSL_FLAG(int32_t, n_heads, 0, "Query heads; 0 keeps the shape's.");
ABSL_FLAG(int32_t, n_kv_heads, 0,
          "Key/value heads: n_heads for MHA, 1 for MQA, another divisor of n_heads for GQA. "
          "0 keeps the shape's, or follows --n_heads when that is given.");
ABSL_FLAG(int32_t, vocab_size, 0, "Vocabulary size; 0 keeps the shape's.");
ABSL_FLAG(int32_t, n_experts, 0,
          "Experts of a mixture-of-experts shape (mixtral-8x7b, olmoe-1b-7b, qwen3-30b-a3b); 0 "
          "keeps the shape's.");
ABSL_FLAG(int32_t, top_k, 0,
          "Experts each token chooses (a mixture of experts); 0 keeps the shape's.");
ABSL_FLAG(int32_t, expert_hidden, 0,
          "SwiGLU inner width of each expert (a mixture of experts); 0 keeps the shape's.");
ABSL_FLAG(int32_t, n_group, 0,
          "Expert groups of DeepSeek's routing (1: none, as llama.cpp c392e50 computes); 0 keeps "
          "the shape's.");
ABSL_FLAG(int32_t, topk_group, 0,
          "Groups each token's experts may come from (DeepSeek); 0 keeps the shape's.");
ABSL_FLAG(int32_t, seq_len, 0, "Context length; 0 keeps the shape's.");
ABSL_FLAG(bool, untied, false,
          "Store a classifier of its own instead of sharing the token embedding (the shape's "
          "own choice otherwise).");
ABSL_FLAG(std::string, tokenizer_output, "",
          "Also write a synthetic llama2.c tokenizer.bin for the vocabulary here (made-up word "
          "pieces; needs --vocab_size above 259), so that the model can serve text.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the weights; the same seed and shape give the same file.");

namespace tandem {
namespace {

constexpr int kBadFlags = 2;

int BadFlags(const std::string& message) {
  std::fprintf(stderr, "tandem-synth: %s\n", message.c_str());
  return kBadFlags;
}

struct SizeFlag {
  const char* name;
  int32_t value;
  int* field;
};

int Run(int argc, char** argv) {
  ParseToolFlags(argc, argv,
                 "Writes a synthetic Llama checkpoint: tandem-synth --output FILE [--format gguf] "
                 "[--shape NAME|custom] [--dim N ...]");
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output.empty()) return BadFlags("--output is required: the file to write");
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "llama2c" && format != "gguf") {
    return BadFlags(absl::StrCat("--format is '", format, "'; use llama2c or gguf"));
  }
  const std::string gguf_type = absl::GetFlag(FLAGS_gguf_type);
  if (gguf_type != "f32" && gguf_type != "f16" && gguf_type != "bf16") {
    return BadFlags(absl::StrCat("--gguf_type is '", gguf_type, "'; use f32, f16 or bf16"));
  }
  if (gguf_type != "f32" && format != "gguf") {
    return BadFlags("--gguf_type f16/bf16 needs --format gguf; llama2c checkpoints are fp32");
  }

  const std::string shape = absl::GetFlag(FLAGS_shape);
  ModelConfig config;
  if (shape != "custom") {
    absl::StatusOr<ModelConfig> named = NamedShape(shape);
    if (!named.ok()) return BadFlags(absl::StrCat(named.status().message(), ", or custom"));
    config = *named;
  }
  if (config.rope_layout == RopeLayout::kHalfSplit && config.qk_norm == QkNorm::kNone &&
      !config.attention_bias) {
    // GGUF's llama architecture (and llama2.c) rotate interleaved pairs,
    // and neither file stores RoPE scaling: the same sizes and bytes, for
    // benchmarks.
    config.rope_layout = RopeLayout::kInterleaved;
    config.rope_scaling = RopeScaling{};
  }
  if (format == "llama2c" && config.qk_norm != QkNorm::kNone) {
    return BadFlags(absl::StrCat("a ", shape,
                                 " model has q/k norms, which llama2.c checkpoints "
                                 "cannot hold; use --format gguf (or tandem-convert for a hub "
                                 "folder)"));
  }
  const SizeFlag sizes[] = {
      {"dim", absl::GetFlag(FLAGS_dim), &config.dim},
      {"hidden_dim", absl::GetFlag(FLAGS_hidden_dim), &config.hidden_dim},
      {"n_layers", absl::GetFlag(FLAGS_n_layers), &config.n_layers},
      {"n_heads", absl::GetFlag(FLAGS_n_heads), &config.n_heads},
      {"n_kv_heads", absl::GetFlag(FLAGS_n_kv_heads), &config.n_kv_heads},
      {"vocab_size", absl::GetFlag(FLAGS_vocab_size), &config.vocab_size},
      {"seq_len", absl::GetFlag(FLAGS_seq_len), &config.seq_len},
  };
  for (const SizeFlag& s : sizes) {
    if (s.value < 0)
      return BadFlags(absl::StrCat("--", s.name, " is ", s.value, "; it must be positive"));
    if (s.value > 0) *s.field = s.value;
  }
  const SizeFlag expert_sizes[] = {
      {"n_experts", absl::GetFlag(FLAGS_n_experts), &config.moe.n_experts},
      {"top_k", absl::GetFlag(FLAGS_top_k), &config.moe.top_k},
      {"expert_hidden", absl::GetFlag(FLAGS_expert_hidden), &config.moe.expert_hidden},
      {"n_group", absl::GetFlag(FLAGS_n_group), &config.moe.n_group},
      {"topk_group", absl::GetFlag(FLAGS_topk_group), &config.moe.topk_group},
  };
  // DeepSeek's shared experts are whole experts: they keep their count.
  const int old_expert_hidden = config.moe.expert_hidden;
  for (const SizeFlag& s : expert_sizes) {
    if (s.value == 0) continue;
    if (s.value < 0 || config.moe.n_experts == 0) {
      return BadFlags(absl::StrCat("--", s.name, " is ", s.value,
                                   "; give a positive size, with a mixture-of-experts --shape"));
    }
    *s.field = s.value;
  }
  if (!config.moe.shared_gated && old_expert_hidden > 0 &&
      config.moe.expert_hidden != old_expert_hidden) {
    config.moe.shared_hidden =
        config.moe.shared_hidden / old_expert_hidden * config.moe.expert_hidden;
  }
  // A new head count without a KV head count means MHA, not the old ratio.
  if (absl::GetFlag(FLAGS_n_heads) > 0 && absl::GetFlag(FLAGS_n_kv_heads) == 0) {
    config.n_kv_heads = config.n_heads;
  }
  if (shape == "custom") {
    for (const SizeFlag& s : sizes) {
      if (*s.field == 0 && std::string(s.name) != "n_kv_heads") {
        return BadFlags(absl::StrCat("--shape custom needs --", s.name));
      }
    }
    if (config.n_kv_heads == 0) config.n_kv_heads = config.n_heads;
  }
  if (absl::GetFlag(FLAGS_untied)) config.shared_classifier = false;
  if (absl::Status s = config.Validate(); !s.ok()) {
    return BadFlags(absl::StrCat("impossible shape (", config.ToString(), "): ", s.message(),
                                 "; change the size flags"));
  }

  absl::StatusOr<std::unique_ptr<ModelWeights>> weights =
      MakeSyntheticModel(config, absl::GetFlag(FLAGS_seed));
  absl::Status written = weights.status();
  if (written.ok()) {
    written = format == "gguf" ? WriteGgufModel(**weights, output,
                                                gguf_type == "f16"    ? GgufTensorType::kF16
                                                : gguf_type == "bf16" ? GgufTensorType::kBF16
                                                                      : GgufTensorType::kF32)
                               : WriteLlama2cCheckpoint(**weights, output);
  }
  const std::string tokenizer_output = absl::GetFlag(FLAGS_tokenizer_output);
  if (written.ok() && !tokenizer_output.empty()) {
    absl::StatusOr<std::string> bytes = SyntheticTokenizerBytes(config.vocab_size);
    written = bytes.status();
    if (written.ok()) {
      std::ofstream file(tokenizer_output, std::ios::binary | std::ios::trunc);
      file.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
      if (!file.good()) {
        written = absl::UnavailableError(absl::StrCat("cannot write ", tokenizer_output));
      }
    }
  }
  if (!written.ok()) {
    std::fprintf(stderr, "tandem-synth: %s\n", std::string(written.message()).c_str());
    return 1;
  }
  std::error_code error;
  const uintmax_t bytes = std::filesystem::file_size(output, error);
  const std::string kind = format == "gguf" ? absl::StrCat("gguf ", gguf_type) : format;
  std::printf("%s\n", absl::StrFormat("wrote %s (%s): %s, %.1fM parameters (%d), %d bytes", output,
                                      kind, config.ToString(), config.NumParameters() / 1e6,
                                      config.NumParameters(), error ? 0 : bytes)
                          .c_str());
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Run(argc, argv); }
