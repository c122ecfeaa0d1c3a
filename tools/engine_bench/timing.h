// The engine bench's timings: what a decode step reads of a model, the
// load rate of a hub folder, and the prefill and batched-decode tokens per
// second of an engine.
#ifndef TANDEM_TOOLS_ENGINE_BENCH_TIMING_H_
#define TANDEM_TOOLS_ENGINE_BENCH_TIMING_H_

#include <chrono>
#include <functional>
#include <string>
#include <utility>

#include "common/engine/engine.h"
#include "common/model/model_weights.h"

namespace tandem::engine_bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct WeightCount {
  double bytes = 0;
  double params = 0;
  // Of a mixture of experts, besides: every routed expert's matrices, the
  // experts per sparse layer and those a token uses.
  double expert_bytes = 0;
  double expert_params = 0;
  int experts = 0;
  int top_k = 0;
};

// What a decode step reads, tensor by tensor (a quantized file mixes
// types): every weight but the embedding rows not looked up (a tied
// classifier reads the whole table) and the routed experts, counted apart.
WeightCount DecodeWeights(const ModelWeights& w);

// Loads a hub folder `repeats` + 1 times (the first fills the page cache)
// into an engine and prints the best load rate, in weight bytes per second,
// with the weights fingerprint's time apart. Returns the exit status: 0, or
// 1 when the folder does not load.
int MeasureLoad(const std::string& dir, const std::string& backend_name, int threads, int repeats);

// Prefill tokens per second of one n-token prompt, the best of `repeats`
// (after one run to warm up).
double TimePrefill(Engine& engine, int n, int repeats);

// Hooks around the timed steps of one TimeDecode repeat (an op profile).
struct StepHooks {
  std::function<void()> before;
  std::function<void(int steps)> after;
};

// Greedy decode of `batch` sequences; the engine picks the tokens
// (BatchItem::pick_greedy) unless `host_pick`, when the logits come to the
// host and it picks them. Returns tokens/s and the host's picking time per
// step.
std::pair<double, double> TimeDecode(Engine& engine, int batch, int prompt, int steps, int repeats,
                                     bool host_pick, const StepHooks& hooks = {});

}  // namespace tandem::engine_bench

#endif  // TANDEM_TOOLS_ENGINE_BENCH_TIMING_H_
