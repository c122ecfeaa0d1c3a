// tandem-perplexity: the perplexity of a model over a text file, chunk by
// chunk as llama.cpp's llama-perplexity computes it (common/engine/
// perplexity.h), with any model tandem loads and any KV cache type.
// Running figures go to stderr, the result to stdout.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/flags.h"
#include "common/base/served_model.h"
#include "common/base/status_macros.h"
#include "common/compute/backend_choice.h"
#include "common/engine/engine.h"
#include "common/engine/perplexity.h"
#include "common/model/model_weights.h"
#include "common/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, model, "",
          "Model: a Hugging Face folder, a llama2.c checkpoint or a GGUF file (required)");
ABSL_FLAG(std::string, tokenizer, "",
          "Tokenizer: a hub folder or tokenizer.json, llama2.c tokenizer.bin or SentencePiece "
          ".model; defaults to the --model folder's");
ABSL_FLAG(std::string, file, "", "Text to score (required)");
ABSL_FLAG(int, ctx, 512, "Tokens per chunk; the second half of each is scored");
ABSL_FLAG(int, chunks, 0, "Most chunks to score; 0 = every whole chunk");
ABSL_FLAG(std::string, kv_dtype, "",
          "KV cache type: f32, bf16, f16 or int8; empty = the weights' type");
ABSL_FLAG(int, threads, 0, "CPU threads; 0 = every core");
ABSL_FLAG(std::string, backend, "cpu", "Compute backend: cpu or cuda");

namespace tandem {
namespace {

constexpr size_t kMaxTextBytes = size_t{256} << 20;
// A step's size: a chunk longer than this runs in several steps, so that the
// activations and the logits ([rows][vocab] floats) stay bounded whatever
// --ctx is.
constexpr int kMaxStepTokens = 512;
constexpr int kMaxLogitRows = 256;

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot read --file ", path, ": ", ec.message()));
  if (size > kMaxTextBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--file ", path, " has ", size, " bytes; give at most 256 MiB of text"));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  std::string bytes = text.str();
  // llama-perplexity's -f drops one trailing newline; so does this, so that
  // both score the same tokens.
  if (!bytes.empty() && bytes.back() == '\n') bytes.pop_back();
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--file ", path, " holds no text: give a text of at least 2 * --ctx tokens"));
  }
  return bytes;
}

absl::Status Run() {
  const std::string model_path = absl::GetFlag(FLAGS_model);
  const std::string file = absl::GetFlag(FLAGS_file);
  if (model_path.empty() || file.empty()) {
    return absl::InvalidArgumentError("--model and --file are required (see --help)");
  }
  std::string tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  std::error_code ec;
  if (tokenizer_path.empty() && std::filesystem::is_directory(model_path, ec)) {
    tokenizer_path = model_path;
  }
  if (tokenizer_path.empty()) {
    return absl::InvalidArgumentError(
        "a model file needs --tokenizer (the tokenizer that belongs to the model)");
  }
  const int ctx = absl::GetFlag(FLAGS_ctx);
  const int max_chunks = absl::GetFlag(FLAGS_chunks);
  const int threads = absl::GetFlag(FLAGS_threads);
  if (max_chunks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chunks=", max_chunks, ": give 0 (every whole chunk) or more"));
  }
  ASSIGN_OR_RETURN(const std::string text, ReadText(file));
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, LoadModel(model_path));
  if (ctx < 4 || ctx > weights->config.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ctx=", ctx, ": give 4 to the model's context, ", weights->config.seq_len));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(tokenizer_path));
  if (tokenizer->vocab_size() != weights->config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tokenizer '%s' has %d tokens but model '%s' has a vocabulary of %d; pass the "
        "tokenizer that belongs to the model",
        tokenizer_path, tokenizer->vocab_size(), model_path, weights->config.vocab_size));
  }
  // As llama-perplexity: BOS first where the vocabulary adds one, and then
  // BOS in each chunk's first position too; neither where it does not.
  ASSIGN_OR_RETURN(const std::vector<int32_t> tokens, tokenizer->Encode(text, /*add_bos=*/true));
  ASSIGN_OR_RETURN(const std::vector<int32_t> bos_only, tokenizer->Encode("", /*add_bos=*/true));
  const int32_t bos = tokenizer->bos_id();
  const bool adds_bos = bos >= 0 && !bos_only.empty() && bos_only.front() == bos;

  ASSIGN_OR_RETURN(BackendChoice choice,
                   ChooseBackend({.name = absl::GetFlag(FLAGS_backend), .threads = threads}));
  EngineOptions options;
  options.max_batch_tokens = std::min(ctx, kMaxStepTokens);
  options.max_logit_rows = std::min(ctx - ctx / 2, kMaxLogitRows);
  ASSIGN_OR_RETURN(options.kv_dtype, ParseKvDTypeFlag(absl::GetFlag(FLAGS_kv_dtype)));
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                   Engine::Create(*weights, std::move(choice.backend), options));
  weights.reset();

  const PerplexityOptions ppl{.ctx = ctx, .max_chunks = max_chunks, .bos_id = adds_bos ? bos : -1};
  std::fprintf(stderr, "%zu tokens, chunks of %d (%s; KV %s)\n", tokens.size(), ctx,
               choice.description.c_str(),
               std::string(DTypeName(engine->kv_layout().dtype)).c_str());
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(const PerplexityResult result,
                   Perplexity(*engine, tokens, ppl, [](int chunk, double running) {
                     std::fprintf(stderr, "[%d]%.4f\n", chunk + 1, running);
                   }));
  std::printf(
      "perplexity %.4f over %lld tokens (%d chunks of %d; %zu tokens in the text), %.1f s\n",
      result.perplexity, static_cast<long long>(result.scored), result.chunks, ctx, tokens.size(),
      absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::ParseToolFlags(
      argc, argv,
      "The perplexity of a model over a text, scored as llama.cpp's llama-perplexity scores it.\n"
      "Usage: tandem-perplexity --model DIR|FILE [--tokenizer FILE] --file TEXT [--ctx 512]\n"
      "       [--chunks N] [--kv_dtype f32|bf16|f16|int8] [--threads N] [--backend cpu|cuda]");
  if (absl::Status s = tandem::Run(); !s.ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "tandem-perplexity: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
