// tandem-generate: streams a model's continuation of a prompt to stdout.
// Only generated text goes to stdout; timings go to stderr.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/base/flags.h"
#include "common/base/served_model.h"
#include "common/base/status_macros.h"
#include "common/chat/chat_template.h"
#include "common/compute/backend_choice.h"
#include "common/engine/engine.h"
#include "common/engine/generate.h"
#include "common/model/model_weights.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, model, "",
          "Model: a Hugging Face folder (config.json, safetensors, tokenizer.json), a llama2.c "
          "checkpoint or a GGUF file (required)");
ABSL_FLAG(std::string, tokenizer, "",
          "Tokenizer: a hub folder or tokenizer.json, llama2.c tokenizer.bin or SentencePiece "
          ".model; defaults to the --model folder's. Without one, the prompt must be empty and "
          "token ids are printed instead of text");
ABSL_FLAG(std::string, kv_dtype, "",
          "KV cache type: f32, bf16, f16 or int8; empty = the weights' type");
ABSL_FLAG(std::string, prompt, "", "Prompt text; empty starts from BOS alone");
ABSL_FLAG(bool, chat, false,
          "Send --prompt as a user message through the model folder's chat template (or the "
          "plain default template), ending with the assistant's turn");
ABSL_FLAG(std::string, system, "", "System message for --chat");
ABSL_FLAG(int, max_tokens, 256, "Most tokens to generate");
ABSL_FLAG(float, temperature, 0.0f, "Sampling temperature; 0 = greedy");
ABSL_FLAG(float, top_p, 1.0f, "Nucleus sampling mass in (0, 1]; 1 = off");
ABSL_FLAG(float, min_p, 0.0f, "Drop tokens below min_p times the top one's probability; 0 = off");
ABSL_FLAG(int, top_k, 0, "Sample among the k most likely tokens; 0 = off");
ABSL_FLAG(uint64_t, seed, 0, "Random seed; the same seed gives the same tokens");
ABSL_FLAG(int, threads, 0, "CPU threads; 0 = every core");
ABSL_FLAG(std::string, backend, "cpu",
          "Compute backend: cpu, or cuda (fp32, needs an NVIDIA GPU and a build with "
          "TANDEM_WITH_CUDA; a machine without one gets an error naming the cause).");
ABSL_FLAG(int, device, 0, "The GPU --backend cuda computes on (0 = the first)");
ABSL_FLAG(int, prefill_chunk, 0, "Prompt tokens per prefill step; 0 = all at once");

namespace tandem {
namespace {

absl::Status Run() {
  const std::string model_path = absl::GetFlag(FLAGS_model);
  if (model_path.empty()) return absl::InvalidArgumentError("--model is required (see --help)");
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, LoadModel(model_path));

  std::unique_ptr<Tokenizer> tokenizer;
  std::string tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  std::error_code ec;
  if (tokenizer_path.empty() && std::filesystem::is_directory(model_path, ec)) {
    tokenizer_path = model_path;
  }
  if (const std::string& path = tokenizer_path; !path.empty()) {
    ASSIGN_OR_RETURN(tokenizer, LoadTokenizer(path));
    if (tokenizer->vocab_size() != weights->config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tokenizer '%s' has %d tokens but model '%s' has a vocabulary of %d; pass the "
          "tokenizer that belongs to the model",
          path, tokenizer->vocab_size(), model_path, weights->config.vocab_size));
    }
  }

  GenerateRequest request;
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  const bool chat = absl::GetFlag(FLAGS_chat);
  if (chat) {
    if (tokenizer == nullptr) return absl::InvalidArgumentError("--chat needs a tokenizer");
    ASSIGN_OR_RETURN(
        ChatTemplate chat_template,
        std::filesystem::is_directory(tokenizer_path, ec)
            ? ChatTemplate::FromModelDir(tokenizer_path)
            : ChatTemplate::FromString(kDefaultChatTemplate, std::nullopt, std::nullopt));
    std::vector<ChatMessage> messages;
    if (const std::string system = absl::GetFlag(FLAGS_system); !system.empty()) {
      messages.push_back({"system", system});
    }
    messages.push_back({"user", prompt});
    ASSIGN_OR_RETURN(const std::string text,
                     chat_template.Render(messages, /*add_generation_prompt=*/true));
    // The template writes the special tokens (BOS, turn markers) itself.
    ASSIGN_OR_RETURN(request.prompt, tokenizer->Encode(text, EncodeOptions{.add_bos = false,
                                                                           .parse_special = true}));
    if (request.prompt.empty())
      return absl::InvalidArgumentError("the chat template rendered nothing");
    request.eos_ids = tokenizer->eos_ids();
  } else if (tokenizer != nullptr) {
    ASSIGN_OR_RETURN(request.prompt, tokenizer->Encode(prompt, /*add_bos=*/true));
    if (request.prompt.empty()) {
      return absl::InvalidArgumentError("the model has no BOS token: give a non-empty --prompt");
    }
    request.eos_ids = tokenizer->eos_ids();
  } else {
    if (!prompt.empty()) {
      return absl::InvalidArgumentError("a text --prompt needs --tokenizer");
    }
    request.prompt = {1};  // BOS in llama vocabularies
  }
  request.max_new_tokens = absl::GetFlag(FLAGS_max_tokens);
  request.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  request.sampling.temperature = absl::GetFlag(FLAGS_temperature);
  request.sampling.top_p = absl::GetFlag(FLAGS_top_p);
  request.sampling.min_p = absl::GetFlag(FLAGS_min_p);
  request.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  request.sampling.seed = absl::GetFlag(FLAGS_seed);

  ASSIGN_OR_RETURN(BackendChoice choice, ChooseBackend({.name = absl::GetFlag(FLAGS_backend),
                                                        .threads = absl::GetFlag(FLAGS_threads),
                                                        .device = absl::GetFlag(FLAGS_device)}));
  const std::string backend_info = choice.description;
  EngineOptions options;
  options.max_batch_tokens = std::max<int>(weights->config.seq_len, 1);
  options.max_logit_rows = 1;
  ASSIGN_OR_RETURN(options.kv_dtype, ParseKvDTypeFlag(absl::GetFlag(FLAGS_kv_dtype)));
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                   Engine::Create(*weights, std::move(choice.backend), options));
  weights.reset();

  // Continue the prompt's last token, so a space after prompt text is kept
  // and the first piece after a bare BOS loses its leading space.
  std::optional<IncrementalDetokenizer> detok;
  if (tokenizer != nullptr) detok.emplace(*tokenizer, request.prompt.back());
  absl::Status sink_status;
  auto sink = [&](int32_t token) {
    if (tokenizer == nullptr) {
      std::printf("%d ", token);
    } else {
      absl::StatusOr<std::string> text = detok->Push(token);
      if (!text.ok()) {
        sink_status = text.status();
        return false;
      }
      std::fwrite(text->data(), 1, text->size(), stdout);
    }
    std::fflush(stdout);
    return true;
  };
  ASSIGN_OR_RETURN(GenerateResult result, Generate(*engine, request, sink));
  RETURN_IF_ERROR(sink_status);
  if (tokenizer != nullptr) {
    const std::string rest = detok->Flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  std::fflush(stdout);

  const double prefill_s = absl::ToDoubleSeconds(result.prefill);
  const double decode_s = absl::ToDoubleSeconds(result.decode);
  const size_t decoded = result.tokens.empty() ? 0 : result.tokens.size() - 1;
  std::cerr << absl::StrFormat(
      "\n[tandem-generate] %s | prompt %d tokens, generated %d (%s) | TTFT %.2f ms | prefill "
      "%.1f tok/s | decode %.1f tok/s\n",
      backend_info, request.prompt.size(), result.tokens.size(), FinishReasonName(result.finish),
      prefill_s * 1e3, request.prompt.size() / prefill_s, decode_s > 0 ? decoded / decode_s : 0.0);
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::ParseToolFlags(
      argc, argv,
      "Streams a model's continuation of a prompt to stdout.\n"
      "Usage: tandem-generate --model DIR|FILE [--tokenizer FILE] --prompt TEXT --max-tokens N\n"
      "       [--chat [--system TEXT]] [--temperature T --top-p P --top-k K --seed S]\n"
      "       [--backend cpu|cuda] [--device N] [--threads N]");
  if (absl::Status s = tandem::Run(); !s.ok()) {
    std::fflush(stdout);
    std::cerr << "tandem-generate: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
