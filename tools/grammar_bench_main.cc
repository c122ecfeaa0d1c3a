// tandem-grammar-bench: what structured outputs cost per generated token on
// the CPU sampler, beside a batch-1 decode step of a real model shape
// measured in the same run.
//
// For each constraint (a schema with the keywords APIs use, and any JSON
// object) it walks the grammar as a model would: each step samples (greedy)
// from fresh random logits through a Sampler that holds the grammar, then
// accepts the token. It reports the time per token with the grammar less
// the same sampler without it: the first walk over a fresh grammar (every
// state's mask computed for the first time: a new schema's first request)
// and later walks (masks kept: every later request with that schema).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "common/base/flags.h"
#include "common/base/logging.h"
#include "common/compute/backend_choice.h"
#include "common/engine/engine.h"
#include "common/engine/sampler.h"
#include "common/grammar/constraint.h"
#include "common/model/synthetic.h"
#include "common/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "",
          "The tokenizer whose vocabulary the masks cover (e.g. a Llama 3 folder or "
          "tokenizer.json: 128,256 tokens)");
ABSL_FLAG(int, tokens, 2000, "Tokens generated per constraint after the first walk");
ABSL_FLAG(std::string, decode_shape, "llama3.2-1b",
          "The model shape whose batch-1 CPU decode step the cost is compared with "
          "(llama3.2-1b, stories110M, or none)");
ABSL_FLAG(std::string, dtype, "bf16", "The decode model's weight type: f32, bf16, f16");
ABSL_FLAG(int, threads, 0, "CPU threads for the decode step (0 = all cores)");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

constexpr const char* kSchema = R"({"type": "object", "properties": {
  "id": {"type": "integer", "minimum": 0},
  "customer": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "email": {"type": "string", "maxLength": 60},
    "vip": {"type": "boolean"}}, "required": ["name", "email", "vip"],
    "additionalProperties": false},
  "items": {"type": "array", "maxItems": 4, "items": {"type": "object", "properties": {
    "sku": {"type": "string", "maxLength": 12}, "quantity": {"type": "integer"},
    "price": {"type": "number"}}, "required": ["sku", "quantity", "price"],
    "additionalProperties": false}},
  "status": {"enum": ["pending", "paid", "shipped"]},
  "note": {"anyOf": [{"type": "string", "maxLength": 80}, {"type": "null"}]}},
  "required": ["id", "customer", "items", "status", "note"], "additionalProperties": false})";

struct WalkCost {
  double micros_per_token = 0;
  int tokens = 0;
};

// Generates `tokens` tokens (restarting each finished output) with a
// sampler per output; returns the mean time of Sample + Accept.
WalkCost Walk(const SamplingParams& params, int vocab, int32_t stop, int tokens,
              std::mt19937& rng) {
  std::vector<float> logits(vocab);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const std::vector<int32_t> stops = {stop};
  auto sampler = std::make_unique<Sampler>(params, std::span<const int32_t>{}, stops);
  Clock::duration spent{};
  for (int i = 0; i < tokens; ++i) {
    for (float& x : logits) x = normal(rng);
    const auto t0 = Clock::now();
    const int32_t token = sampler->Sample(logits);
    sampler->Accept(token);
    spent += Clock::now() - t0;
    if (token == stop || sampler->generated() >= 400) {
      sampler = std::make_unique<Sampler>(params, std::span<const int32_t>{}, stops);
    }
  }
  return {Micros(spent) / tokens, tokens};
}

double DecodeStepMicros(const std::string& shape, DType dtype, int threads) {
  ModelConfig config;
  if (shape == "llama3.2-1b") {
    config = Llama32_1BShape();
  } else if (shape == "stories110M") {
    config = Stories110MShape();
  } else {
    LOG(FATAL) << "unknown --decode_shape " << shape;
  }
  auto weights = MakeSyntheticModel(config, 1, dtype);
  CHECK_OK(weights.status());
  auto backend = ChooseBackend({.name = "cpu", .threads = threads});
  CHECK_OK(backend.status());
  EngineOptions options;
  options.max_batch_tokens = 64;
  options.max_logit_rows = 1;
  options.num_blocks = 16;
  auto engine = Engine::Create(**weights, std::move(backend->backend), options);
  CHECK_OK(engine.status());
  weights->reset();
  BlockTable table = (*engine)->NewSequence();
  std::vector<int32_t> prompt(32);
  for (int i = 0; i < 32; ++i) prompt[i] = (i * 31 + 1) % config.vocab_size;
  const BatchItem first{&table, prompt, true};
  auto logits = (*engine)->Step({&first, 1});
  CHECK_OK(logits.status());
  int32_t next = Argmax(*logits);
  constexpr int kSteps = 8;
  double best = 1e30;
  for (int s = 0; s < kSteps + 1; ++s) {
    const BatchItem item{&table, {&next, 1}, true};
    const auto t0 = Clock::now();
    logits = (*engine)->Step({&item, 1});
    CHECK_OK(logits.status());
    next = Argmax(*logits);
    if (s > 0) best = std::min(best, Micros(Clock::now() - t0));  // the first warms up
  }
  (*engine)->Release(table);
  return best;
}

int Run() {
  const std::string path = absl::GetFlag(FLAGS_tokenizer);
  if (path.empty()) {
    std::fprintf(stderr, "--tokenizer is required (see --help)\n");
    return 2;
  }
  auto tokenizer = LoadTokenizer(path);
  CHECK_OK(tokenizer.status());
  auto vocabulary = grammar::Vocabulary::FromTokenizer(**tokenizer);
  CHECK_OK(vocabulary.status());
  const int vocab = (*vocabulary)->size();
  const int32_t stop = (*tokenizer)->eos_id();
  const int tokens = absl::GetFlag(FLAGS_tokens);
  std::printf("vocabulary: %d tokens (%zu with bytes), stop id %d\n", vocab,
              (*vocabulary)->sorted().size(), stop);

  std::mt19937 rng(1);
  const WalkCost free = Walk(SamplingParams{}, vocab, stop, tokens, rng);
  std::printf("%-12s %8.1f us/token (greedy sampler, no grammar)\n", "free", free.micros_per_token);
  double worst_warm = 0;
  for (const auto& [name, spec] :
       {std::pair{"schema",
                  grammar::ConstraintSpec{grammar::ConstraintSpec::Kind::kJsonSchema, kSchema}},
        std::pair{"json_object",
                  grammar::ConstraintSpec{grammar::ConstraintSpec::Kind::kJsonObject, ""}}}) {
    const auto t0 = Clock::now();
    auto compiled = grammar::CompileConstraint(spec);
    CHECK_OK(compiled.status());
    const double compile_us = Micros(Clock::now() - t0);
    SamplingParams params;
    params.grammar = std::make_shared<grammar::CompiledGrammar>(*compiled, *vocabulary);
    const WalkCost cold = Walk(params, vocab, stop, 400, rng);
    const WalkCost warm = Walk(params, vocab, stop, tokens, rng);
    worst_warm = std::max(worst_warm, warm.micros_per_token - free.micros_per_token);
    std::printf(
        "%-12s compile %.0f us; first 400 tokens %8.1f us/token (+%.1f); next %d tokens %8.1f "
        "us/token (+%.1f); %d automaton states\n",
        name, compile_us, cold.micros_per_token, cold.micros_per_token - free.micros_per_token,
        warm.tokens, warm.micros_per_token, warm.micros_per_token - free.micros_per_token,
        params.grammar->state_count());
  }
  const std::string shape = absl::GetFlag(FLAGS_decode_shape);
  if (shape != "none") {
    auto dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
    CHECK_OK(dtype.status());
    const double step = DecodeStepMicros(shape, *dtype, absl::GetFlag(FLAGS_threads));
    std::printf(
        "decode step, %s %s, batch 1, CPU: %.0f us; the grammar's warm cost per token is %.2f%% "
        "of it\n",
        shape.c_str(), absl::GetFlag(FLAGS_dtype).c_str(), step, 100.0 * worst_warm / step);
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::ParseToolFlags(
      argc, argv,
      "Measures the CPU cost per token of structured outputs beside a decode step.\n"
      "Usage: tandem-grammar-bench --tokenizer PATH [--tokens N] [--decode_shape "
      "llama3.2-1b|stories110M|none] [--dtype bf16]");
  return tandem::Run();
}
