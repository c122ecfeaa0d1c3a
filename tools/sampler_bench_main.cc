// tandem-sampler-bench: the host sampler's time per draw on one row of
// random logits the size of a real vocabulary, for the sampling settings
// requests use. This is the host's share of every sampled token (a decode
// step of a batch of n sampled rows pays it n times on one thread).
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/base/flags.h"
#include "common/engine/sampler.h"

ABSL_FLAG(int, vocab, 128256, "Tokens in the row (128,256: Llama 3)");
ABSL_FLAG(int, draws, 200, "Draws timed per setting");
ABSL_FLAG(float, spread, 3.0f, "Standard deviation of the random logits");

namespace tandem {
namespace {

int Run() {
  const int vocab = absl::GetFlag(FLAGS_vocab), draws = absl::GetFlag(FLAGS_draws);
  if (vocab < 1 || vocab > (1 << 24) || draws < 1 || draws > 1000000) {
    std::fprintf(stderr, "--vocab must be in [1, 2^24] and --draws in [1, 10^6]\n");
    return 2;
  }
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, absl::GetFlag(FLAGS_spread));
  std::vector<float> logits(vocab);
  for (float& x : logits) x = normal(rng);
  struct Setting {
    const char* name;
    SamplingParams params;
  };
  auto with = [](float temperature, int top_k, float top_p, float min_p, float presence) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.presence_penalty = presence;
    p.seed = 11;
    return p;
  };
  const Setting settings[] = {
      {"greedy", with(0.0f, 0, 1.0f, 0.0f, 0.0f)},
      {"temperature 0.8", with(0.8f, 0, 1.0f, 0.0f, 0.0f)},
      {"temperature 0.8, top_p 0.9", with(0.8f, 0, 0.9f, 0.0f, 0.0f)},
      {"temperature 0.8, top_k 40", with(0.8f, 40, 1.0f, 0.0f, 0.0f)},
      {"temperature 0.8, min_p 0.05", with(0.8f, 0, 1.0f, 0.05f, 0.0f)},
      {"temperature 0.8, presence_penalty 0.5", with(0.8f, 0, 1.0f, 0.0f, 0.5f)},
  };
  std::printf("| sampling, %d-token row | ms a draw |\n|---|---:|\n", vocab);
  for (const Setting& s : settings) {
    Sampler sampler(s.params);
    int64_t checksum = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < draws; ++i) {
      const int32_t token = sampler.Sample(logits);
      sampler.Accept(token);
      checksum += token;
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count() /
        draws;
    std::printf("| %s | %.3f |\n", s.name, ms);
    if (checksum < 0) return 1;  // keeps the draws observable
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::ParseToolFlags(argc, argv,
                         "Times the host sampler per draw.\nUsage: tandem-sampler-bench "
                         "[--vocab N] [--draws N] [--spread S]");
  return tandem::Run();
}
