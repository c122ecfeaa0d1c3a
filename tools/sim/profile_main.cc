// tandem-profile: times the engine's steps over a grid of shapes on this
// machine and fits the simulator's cost model to them (cost_profile.h);
// writes the profile tandem-sim --profile reads.
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/dtype.h"
#include "common/base/flags.h"
#include "common/base/status_macros.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/model/model_weights.h"
#include "common/model/synthetic.h"
#include "tools/sim/cost_profile.h"

ABSL_FLAG(std::string, model, "", "A model file or folder to profile; empty: --shape");
ABSL_FLAG(std::string, shape, "stories15M",
          "Without --model: a synthetic model of this shape (stories15M or stories110M)");
ABSL_FLAG(int, seq_len, 2048, "Without --model: the shape's context length");
ABSL_FLAG(int, threads, 1, "CPU threads of the backend (the workers' --threads)");
ABSL_FLAG(std::vector<std::string>, prompts, std::vector<std::string>({"16", "64", "256", "512"}),
          "Prompt chunk lengths to time");
ABSL_FLAG(std::vector<std::string>, batches, std::vector<std::string>({"1", "4", "16", "32"}),
          "Decode batch sizes to time");
ABSL_FLAG(std::vector<std::string>, contexts, std::vector<std::string>({"64", "256", "1024"}),
          "Context lengths the decode batches attend to");
ABSL_FLAG(int, repeats, 3, "Timed runs of each shape (after one untimed); the median counts");
ABSL_FLAG(std::string, output, "", "Write the profile here (JSON)");

namespace tandem::sim {
namespace {

constexpr char kUsage[] =
    "Profiles the engine's step time on this machine and fits tandem-sim's cost model.\n"
    "Usage: tandem-profile [--model PATH | --shape stories15M --seq_len N] [--threads T] "
    "--output profile.json";

absl::StatusOr<std::vector<int>> Ints(const std::vector<std::string>& text, const char* flag) {
  std::vector<int> out;
  for (const std::string& t : text) {
    int v = 0;
    if (!absl::SimpleAtoi(t, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " has '", t, "'; give positive integers"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> Weights() {
  if (const std::string path = absl::GetFlag(FLAGS_model); !path.empty()) return LoadModel(path);
  ModelConfig config;
  const std::string shape = absl::GetFlag(FLAGS_shape);
  if (shape == "stories15M") {
    config = Stories15MShape();
  } else if (shape == "stories110M") {
    config = Stories110MShape();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape is '", shape, "'; use stories15M or stories110M, or --model"));
  }
  config.seq_len = absl::GetFlag(FLAGS_seq_len);
  return MakeSyntheticModel(config, /*seed=*/1);
}

absl::Status Main() {
  ProfileGrid grid;
  ASSIGN_OR_RETURN(grid.prompt_tokens, Ints(absl::GetFlag(FLAGS_prompts), "prompts"));
  ASSIGN_OR_RETURN(grid.decode_batches, Ints(absl::GetFlag(FLAGS_batches), "batches"));
  ASSIGN_OR_RETURN(grid.decode_contexts, Ints(absl::GetFlag(FLAGS_contexts), "contexts"));
  grid.repeats = absl::GetFlag(FLAGS_repeats);
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output.empty()) return absl::InvalidArgumentError("--output is required");
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, Weights());
  const int threads = absl::GetFlag(FLAGS_threads);
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                   CpuBackend::Create(CpuBackendOptions{threads}));
  int max_batch = 1, max_prompt = 1;
  for (int b : grid.decode_batches) max_batch = std::max(max_batch, b);
  for (int p : grid.prompt_tokens) max_prompt = std::max(max_prompt, p);
  for (int c : grid.decode_contexts) max_prompt = std::max(max_prompt, c);
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                   Engine::Create(*weights, std::move(backend),
                                  EngineOptions{.block_size = 16,
                                                .num_blocks = ProfileBlocks(grid, 16),
                                                .max_batch_tokens = std::max(max_prompt, max_batch),
                                                .max_logit_rows = max_batch}));
  ASSIGN_OR_RETURN(CostProfile profile, MeasureProfile(*engine, *engine, Clock::Real(), grid));
  profile.backend = "cpu";
  profile.threads = threads;
  profile.weights_dtype = std::string(DTypeName(weights->dtype()));

  std::cout << absl::StrFormat("%6s %7s %10s %6s %11s %11s %7s\n", "items", "tokens", "attended",
                               "rows", "measured_ms", "fitted_ms", "error");
  for (const ProfilePoint& p : profile.points) {
    const double fitted = absl::ToDoubleSeconds(profile.fit(p.shape));
    std::cout << absl::StrFormat(
        "%6d %7d %10d %6d %11.3f %11.3f %6.1f%%\n", p.shape.items, p.shape.tokens, p.shape.attended,
        p.shape.logit_rows, p.seconds * 1e3, fitted * 1e3, 100 * (fitted - p.seconds) / p.seconds);
  }
  std::cout << absl::StrFormat(
      "fit: %.1f us + %.2f us/prompt token + %.3f ns/prompt key + %.2f us/logit row + %.2f "
      "us/decode row + %.3f ns/decode key; error median %.1f%%, max %.1f%%\n",
      absl::ToDoubleMicroseconds(profile.fit.fixed),
      absl::ToDoubleMicroseconds(profile.fit.per_token),
      absl::ToDoubleNanoseconds(profile.fit.per_attended),
      absl::ToDoubleMicroseconds(profile.fit.per_logit_row),
      absl::ToDoubleMicroseconds(profile.fit.per_decode_token.value_or(profile.fit.per_token)),
      absl::ToDoubleNanoseconds(profile.fit.per_decode_attended.value_or(profile.fit.per_attended)),
      100 * profile.median_error, 100 * profile.max_error);
  std::ofstream out(output);
  out << ProfileJson(profile).dump(1) << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", output));
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::sim

int main(int argc, char** argv) {
  tandem::ParseToolFlags(argc, argv, tandem::sim::kUsage);
  const absl::Status status = tandem::sim::Main();
  if (!status.ok()) {
    std::cerr << "tandem-profile: " << status << "\n";
    return 1;
  }
  return 0;
}
