// tandem-convert: writes a Hugging Face model folder (config.json,
// generation_config.json, safetensors in the chosen type, tokenizer.json and
// tokenizer_config.json) from a llama2.c checkpoint, a GGUF file, another
// hub folder or a synthetic model of a named shape, so that tests and
// benchmarks have hub-format fixtures of any shape. With --format gguf it
// writes one GGUF file instead, with the tokenizer's vocabulary for llama.cpp.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "common/model/gguf_model.h"
#include "common/model/hub_model.h"
#include "common/model/model_weights.h"
#include "common/model/synthetic.h"
#include "common/tokenizer/hf_tokenizer_writer.h"
#include "common/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, model, "",
          "Source model: a llama2.c checkpoint, a GGUF file or a hub folder (or use --synthetic)");
ABSL_FLAG(std::string, synthetic, "",
          "Instead of --model, random weights of a named shape: stories15M, stories110M, "
          "llama3.2-1b, llama3-8b (16 GB in bf16), llama3-70b, qwen3-small, qwen3-0.6b, "
          "qwen3-30b-a3b, mixtral-8x7b, olmoe-1b-7b");
ABSL_FLAG(uint64_t, seed, 1, "Seed of --synthetic weights");
ABSL_FLAG(int, seq_len, 0,
          "Context length written to config.json (1 to 131072), of --synthetic weights or of "
          "--model's (positions past its training context are well defined for RoPE, if not "
          "useful); 0 = the model's or the shape's own");
ABSL_FLAG(int, vocab_size, 0,
          "Vocabulary of --synthetic weights (e.g. to match --tokenizer); 0 = the shape's own");
ABSL_FLAG(std::string, tokenizer, "",
          "Tokenizer to write as tokenizer.json: llama2.c tokenizer.bin or SentencePiece .model "
          "(optional)");
ABSL_FLAG(std::string, output, "",
          "Folder to write (required); created if missing. With --format gguf, the file");
ABSL_FLAG(std::string, format, "hub",
          "hub (a Hugging Face folder) or gguf (one GGUF file, with --tokenizer's vocabulary "
          "for llama.cpp's SentencePiece tokenizer, so that llama.cpp reads the same text)");
ABSL_FLAG(std::string, dtype, "bf16", "Type of the written tensors: f32, bf16 or f16");
ABSL_FLAG(int64_t, max_shard_mb, 0, "Shard the weights above this many MiB; 0 = one file");
ABSL_FLAG(std::string, chat_template, "",
          "A Jinja chat template file to store as chat_template.jinja (optional)");

namespace tandem {
namespace {

absl::StatusOr<std::unique_ptr<ModelWeights>> Source() {
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string synthetic = absl::GetFlag(FLAGS_synthetic);
  if (model.empty() == synthetic.empty()) {
    return absl::InvalidArgumentError("give exactly one of --model and --synthetic");
  }
  const int seq_len = absl::GetFlag(FLAGS_seq_len);
  if (seq_len != 0 && (seq_len < 1 || seq_len > 131072)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq_len is ", seq_len, "; give 1 to 131072, or 0 for the model's own"));
  }
  if (!model.empty()) {
    if (absl::GetFlag(FLAGS_vocab_size) != 0) {
      return absl::InvalidArgumentError(
          "--vocab_size goes with --synthetic: --model's vocabulary is its own");
    }
    ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, LoadModel(model));
    if (seq_len != 0) weights->config.seq_len = seq_len;
    return weights;
  }
  ASSIGN_OR_RETURN(ModelConfig config, NamedShape(synthetic));
  if (seq_len != 0) config.seq_len = seq_len;
  if (const int vocab = absl::GetFlag(FLAGS_vocab_size); vocab != 0) {
    if (vocab < 1 || vocab > (1 << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--vocab_size is ", vocab, "; give 1 to 1048576, or 0 for the shape's own"));
    }
    config.vocab_size = vocab;
  }
  ASSIGN_OR_RETURN(DType dtype, ParseDType(absl::GetFlag(FLAGS_dtype)));
  return MakeSyntheticModel(config, absl::GetFlag(FLAGS_seed), dtype);
}

// llama.cpp's token types for SentencePiece's piece types.
GgufVocab ToGgufVocab(const SpmVocabulary& spm) {
  GgufVocab vocab{.bos_id = spm.bos_id, .eos_id = spm.eos_id, .unk_id = spm.unk_id};
  for (const SpmVocabulary::Piece& piece : spm.pieces) {
    vocab.tokens.push_back(piece.text);
    vocab.scores.push_back(piece.score);
    int32_t type = 1;
    switch (piece.type) {
      case SpmVocabulary::Type::kNormal:
        type = 1;
        break;
      case SpmVocabulary::Type::kUnknown:
        type = 2;
        break;
      case SpmVocabulary::Type::kControl:
        type = 3;
        break;
      case SpmVocabulary::Type::kUserDefined:
        type = 4;
        break;
      case SpmVocabulary::Type::kUnused:
        type = 5;
        break;
      case SpmVocabulary::Type::kByte:
        type = 6;
        break;
    }
    vocab.types.push_back(type);
  }
  return vocab;
}

absl::Status Run() {
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output.empty()) return absl::InvalidArgumentError("--output is required (see --help)");
  ASSIGN_OR_RETURN(DType dtype, ParseDType(absl::GetFlag(FLAGS_dtype)));
  const int64_t shard_mb = absl::GetFlag(FLAGS_max_shard_mb);
  if (shard_mb < 0) return absl::InvalidArgumentError("--max_shard_mb must be >= 0");

  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, Source());
  HubWriteOptions options;
  options.dtype = dtype;
  options.max_shard_bytes = static_cast<uint64_t>(shard_mb) << 20;

  std::unique_ptr<Tokenizer> tokenizer;
  if (const std::string path = absl::GetFlag(FLAGS_tokenizer); !path.empty()) {
    ASSIGN_OR_RETURN(tokenizer, LoadTokenizer(path));
    if (tokenizer->vocab_size() != weights->config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tokenizer '%s' has %d tokens but the model's vocabulary has %d", path,
                          tokenizer->vocab_size(), weights->config.vocab_size));
    }
    if (tokenizer->bos_id() >= 0) options.bos_id = tokenizer->bos_id();
    options.eos_ids = tokenizer->eos_ids();
  }
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format == "gguf") {
    std::optional<GgufVocab> vocab;
    if (tokenizer != nullptr) {
      ASSIGN_OR_RETURN(SpmVocabulary spm, SpmVocabularyOf(*tokenizer));
      vocab = ToGgufVocab(spm);
    }
    RETURN_IF_ERROR(WriteGgufModel(*weights, output,
                                   dtype == DType::kBF16  ? GgufTensorType::kBF16
                                   : dtype == DType::kF16 ? GgufTensorType::kF16
                                                          : GgufTensorType::kF32,
                                   vocab ? &*vocab : nullptr));
  } else if (format != "hub") {
    return absl::InvalidArgumentError(absl::StrCat("--format is '", format, "'; give hub or gguf"));
  }
  if (format == "gguf") {
    std::printf("wrote %s (%s%s)\n", output.c_str(), std::string(DTypeName(dtype)).c_str(),
                tokenizer ? ", vocabulary" : "");
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(WriteHubModel(*weights, output, options));
  if (tokenizer != nullptr) {
    ASSIGN_OR_RETURN(SpmVocabulary vocab, SpmVocabularyOf(*tokenizer));
    RETURN_IF_ERROR(WriteHfTokenizer(vocab, output));
  }
  if (const std::string path = absl::GetFlag(FLAGS_chat_template); !path.empty()) {
    std::error_code ec;
    std::filesystem::copy_file(path, std::filesystem::path(output) / "chat_template.jinja",
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot copy chat template '", path, "': ", ec.message()));
    }
  }
  std::printf("%s\n",
              absl::StrFormat("wrote %s (%s%s): %s, %.1fM parameters in %.1f s", output,
                              std::string(DTypeName(dtype)), tokenizer ? ", tokenizer" : "",
                              weights->config.ToString(), weights->config.NumParameters() / 1e6,
                              absl::ToDoubleSeconds(absl::Now() - start))
                  .c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::ParseToolFlags(
      argc, argv,
      "Writes a Hugging Face model folder.\n"
      "Usage: tandem-convert --model FILE|DIR [--tokenizer FILE] --output DIR [--dtype bf16]\n"
      "       tandem-convert --synthetic llama3.2-1b --output DIR [--dtype bf16]\n"
      "       tandem-convert --model FILE --tokenizer FILE --format gguf --output FILE.gguf");
  if (absl::Status s = tandem::Run(); !s.ok()) {
    std::fprintf(stderr, "tandem-convert: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
