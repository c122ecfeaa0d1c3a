// The engine bench's timings of timing.h: load, prefill and decode.
#include "tools/engine_bench/timing.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/compute/backend_choice.h"
#include "common/engine/sampler.h"
#include "common/model/tensor_list.h"

namespace tandem::engine_bench {

WeightCount DecodeWeights(const ModelWeights& w) {
  WeightCount count;
  auto add = [&](const Tensor& t) {
    count.bytes += t.size_bytes();
    count.params += t.numel;
  };
  // A decode step reads every tensor but the embedding (a few rows of it),
  // and the classifier whether tied to the embedding or not.
  for (const TensorSpec& spec : ModelTensors(w.config)) {
    if (spec.expert >= 0) {
      const Tensor& t = TensorOf(w, spec);
      count.expert_bytes += t.size_bytes();
      count.expert_params += t.numel;
    } else if (spec.role != TensorRole::kEmbedding && spec.role != TensorRole::kClassifier) {
      add(TensorOf(w, spec));
    }
  }
  add(w.classifier);
  count.experts = w.config.moe.n_experts;
  count.top_k = w.config.moe.top_k;
  return count;
}

int MeasureLoad(const std::string& dir, const std::string& backend_name, int threads, int repeats) {
  double best_load = 1e30, best_engine = 1e30, bytes = 0, fingerprint_s = 0;
  std::string description;
  for (int r = 0; r < repeats + 1; ++r) {
    const auto t0 = Clock::now();
    auto weights = LoadModel(dir);
    if (!weights.ok()) {
      std::cerr << weights.status().message() << "\n";
      return 1;
    }
    const auto t1 = Clock::now();
    auto backend = ChooseBackend({.name = backend_name, .threads = threads});
    CHECK_OK(backend.status());
    EngineOptions options;
    options.num_blocks = 64;
    auto engine = Engine::Create(**weights, std::move(backend->backend), options);
    CHECK_OK(engine.status());
    const auto t2 = Clock::now();
    if (r > 0) {
      best_load = std::min(best_load, Seconds(t1 - t0));
      best_engine = std::min(best_engine, Seconds(t2 - t0));
    }
    const ModelConfig& c = (*weights)->config;
    bytes = DecodeWeights(**weights).bytes;
    if (!c.shared_classifier) bytes += (*weights)->token_embedding.size_bytes();
    description = absl::StrCat(c.ToString(), " ", std::string(DTypeName((*weights)->dtype())));
    if (r == repeats) {
      const auto f0 = Clock::now();
      const std::string fingerprint = (*weights)->Fingerprint();
      fingerprint_s = Seconds(Clock::now() - f0);
    }
  }
  std::printf(
      "load %s (%s, %.2f GB): map and validate %.3f s; into the engine %.3f s = %.1f GB/s; "
      "fingerprint %.3f s\n\n",
      dir.c_str(), description.c_str(), bytes / 1e9, best_load, best_engine,
      bytes / best_engine / 1e9, fingerprint_s);
  return 0;
}

double TimePrefill(Engine& engine, int n, int repeats) {
  std::vector<int32_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = (i * 7919 + 13) % engine.config().vocab_size;
  double best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {  // the first run warms up
    BlockTable table = engine.NewSequence();
    const BatchItem item{&table, tokens, true};
    const auto t0 = Clock::now();
    CHECK_OK(engine.Step({&item, 1}).status());
    const double s = Seconds(Clock::now() - t0);
    if (r > 0) best = std::min(best, s);
    engine.Release(table);
  }
  return n / best;
}

std::pair<double, double> TimeDecode(Engine& engine, int batch, int prompt, int steps, int repeats,
                                     bool host_pick, const StepHooks& hooks) {
  const int vocab = engine.config().vocab_size;
  double best = 1e30, best_pick = 0;
  for (int r = 0; r < repeats; ++r) {
    std::vector<BlockTable> tables(batch, engine.NewSequence());
    std::vector<int32_t> next(batch);
    for (int b = 0; b < batch; ++b) {
      std::vector<int32_t> tokens(prompt);
      for (int i = 0; i < prompt; ++i) tokens[i] = (i * 31 + b * 977 + 1) % vocab;
      const BatchItem item{&tables[b], tokens, true};
      auto logits = engine.Step({&item, 1});
      CHECK_OK(logits.status());
      next[b] = Argmax(*logits);
    }
    std::vector<BatchItem> items(batch);
    std::vector<int32_t> picks;
    double pick = 0;
    if (hooks.before) hooks.before();
    const auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) {
      for (int b = 0; b < batch; ++b) {
        items[b] = {&tables[b], {&next[b], 1}, true};
        items[b].pick_greedy = !host_pick;
      }
      auto logits = engine.Step(items, nullptr, &picks);
      CHECK_OK(logits.status());
      if (!host_pick) {
        std::copy(picks.begin(), picks.end(), next.begin());
        continue;
      }
      const auto p0 = Clock::now();
      for (int b = 0; b < batch; ++b) {
        next[b] = Argmax(std::span(*logits).subspan(size_t(b) * vocab, vocab));
      }
      pick += Seconds(Clock::now() - p0);
    }
    const double total = Seconds(Clock::now() - t0);
    if (hooks.after) hooks.after(steps);
    if (total < best) best = total, best_pick = pick;
    for (BlockTable& t : tables) engine.Release(t);
  }
  return {double(batch) * steps / best, best_pick / steps};
}

}  // namespace tandem::engine_bench
