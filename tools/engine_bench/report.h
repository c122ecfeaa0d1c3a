// The engine bench's figures and how they are printed: a table beside
// llama.cpp's anchors on CPUs or beside the measured limits on a GPU, and
// one JSON line for scripts.
#ifndef TANDEM_TOOLS_ENGINE_BENCH_REPORT_H_
#define TANDEM_TOOLS_ENGINE_BENCH_REPORT_H_

#include <string>
#include <utility>
#include <vector>

#include "common/base/dtype.h"
#include "tools/engine_bench/limits.h"

namespace tandem::engine_bench {

// llama.cpp's tokens/s on one shape: prefill of 128 and 512 tokens, decode
// at batch 1 and 16.
struct Anchor {
  double prefill128, prefill512, decode1, decode16;
};

// llama.cpp F32, 2 threads, same machine type (PERF_ANCHORS.md); none for
// GPU runs or other shapes.
Anchor AnchorFor(const std::string& shape, bool on_cpu);

// The measurements of one model.
struct Result {
  std::string shape;
  std::string dtype;
  DType wtype = DType::kF32;
  std::vector<std::pair<int, double>> prefill;  // prompt -> tokens/s
  std::vector<std::pair<int, double>> decode;   // batch -> tokens/s summed
  double weight_bytes = 0;                      // read by every decode step
  double weight_params = 0;                     // ... and their number
  // The routed experts (of a mixture of experts), apart: a step reads those
  // its tokens touch.
  double expert_bytes = 0;
  double expert_params = 0;
  int experts = 0;
  int top_k = 0;
  double classifier_params = 0;
  double kv_bytes_per_sequence = 0;  // read per sequence by a decode step, on average
};

// The table of the results: each figure beside llama.cpp's on CPUs, beside
// its limit on a GPU, then each one's share of its limit.
void PrintTable(const std::vector<Result>& results, const MeasuredLimits& limits, bool on_cpu);

// One JSON line for scripts.
void PrintJsonLine(const std::vector<Result>& results, const MeasuredLimits& limits,
                   const std::string& backend_name);

}  // namespace tandem::engine_bench

#endif  // TANDEM_TOOLS_ENGINE_BENCH_REPORT_H_
