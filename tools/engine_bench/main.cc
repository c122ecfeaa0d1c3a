// tandem-engine-bench: prefill and batched-decode throughput of the engine
// on synthetic models of real shapes, beside the llama.cpp anchors of
// ../shared/docs/PERF_ANCHORS.md (CPU shapes), the measured memory bandwidth
// (the batch-1 decode ceiling) and the measured GEMM rate (the prefill
// ceiling). --backend cuda runs the same on the GPU, each figure beside its
// limit measured in the same run: the HBM roofline of a decode step and
// cuBLAS's GEMM rate in the weights' type.
//
// This file holds the flags and the run's order; limits.h measures the
// limits, timing.h the engine, and report.h prints the figures.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "common/base/flags.h"
#include "common/base/logging.h"
#include "common/compute/backend_choice.h"
#include "common/engine/engine.h"
#include "common/model/model_weights.h"
#include "common/model/synthetic.h"
#include "tools/engine_bench/limits.h"
#include "tools/engine_bench/report.h"
#include "tools/engine_bench/timing.h"
#ifdef TANDEM_HAVE_CUDA
#include "common/compute/cuda/cuda_backend.h"
#endif

ABSL_FLAG(std::vector<std::string>, shapes, std::vector<std::string>({"stories15M", "stories110M"}),
          "Model shapes to measure: stories15M, stories110M, llama3.2-1b, llama3-8b (32 GB of "
          "fp32 weights; for GPUs), qwen3-0.6b, olmoe-1b-7b, the small test shapes (e.g. "
          "qwen3-moe-small), ...: any name tandem-synth --shape takes");
ABSL_FLAG(std::vector<std::string>, dtype, std::vector<std::string>({"f32"}),
          "Weight types to measure, each shape in each: f32, bf16, f16 (e.g. --dtype=f32,bf16)");
ABSL_FLAG(std::string, kv_dtype, "", "KV cache type; empty = the weights' type");
ABSL_FLAG(std::string, latent_form, "cheaper",
          "Latent attention (DeepSeek): cheaper (chosen per run of rows), absorbed or expanded");
ABSL_FLAG(std::string, model, "",
          "A model file or hub folder to measure (e.g. a GGUF file llama.cpp runs too) instead "
          "of --shapes in --dtype");
ABSL_FLAG(std::string, load, "",
          "A hub folder whose load time to measure (warm page cache: loaded once before the "
          "timed loads), in GB/s of weights");
ABSL_FLAG(std::vector<std::string>, prompts, std::vector<std::string>({"128", "512"}),
          "Prompt lengths for the prefill measurement");
ABSL_FLAG(std::vector<std::string>, batches,
          std::vector<std::string>({"1", "2", "4", "8", "16", "32"}),
          "Batch sizes for the decode measurement");
ABSL_FLAG(int, decode_prompt, 128, "Prompt tokens per sequence before decoding");
ABSL_FLAG(int, decode_steps, 64, "Decode steps timed per batch size");
ABSL_FLAG(int, repeats, 3, "Repetitions of each measurement; the best is reported");
ABSL_FLAG(int, threads, 0, "CPU threads (0 = all cores)");
ABSL_FLAG(std::string, backend, "cpu", "Compute backend: cpu or cuda");

namespace tandem::engine_bench {
namespace {

int Run() {
  const int threads = absl::GetFlag(FLAGS_threads);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::vector<int> prompts, batches;
  for (const std::string& s : absl::GetFlag(FLAGS_prompts)) prompts.push_back(std::stoi(s));
  for (const std::string& s : absl::GetFlag(FLAGS_batches)) batches.push_back(std::stoi(s));
  const int decode_prompt = absl::GetFlag(FLAGS_decode_prompt);
  const int decode_steps = absl::GetFlag(FLAGS_decode_steps);

  const std::string backend_name = absl::GetFlag(FLAGS_backend);
  std::vector<DType> dtypes;
  for (const std::string& name : absl::GetFlag(FLAGS_dtype)) {
    auto dtype = ParseDType(name);
    if (!dtype.ok()) {
      std::cerr << "--dtype: " << dtype.status().message() << "\n";
      return 2;
    }
    dtypes.push_back(*dtype);
  }
  auto probe = ChooseBackend({.name = backend_name, .threads = threads, .measure_bandwidth = true});
  if (!probe.ok()) {
    std::cerr << probe.status() << "\n";
    return 1;
  }
  const bool on_cpu = backend_name == "cpu";
  std::printf("backend: %s\n", probe->description.c_str());
  const double bandwidth = on_cpu ? MeasureReadBandwidth(*probe->backend) : probe->device_bandwidth;
  const int gemm_m = on_cpu ? 512 : 4096, gemm_n = on_cpu ? 2048 : 4096,
            gemm_k = on_cpu ? 768 : 4096;
  const double gemm_flops = MeasureGemmFlops(*probe->backend, gemm_m, gemm_n, gemm_k);
  // The prefill ceiling of 16-bit weights on a GPU: cuBLAS's rate in that
  // type (f32 accumulation) on a product large enough to fill it.
  constexpr int kGemm16 = 8192;
  std::vector<std::pair<DType, double>> gemm16;
  if (!on_cpu) {
    // Llama-3-8B's gate-and-up product, at decode batch sizes.
    for (const DType dtype : dtypes) {
      for (int m : {1, 2, 4, 8, 16, 32}) {
        std::printf(
            "weights streamed by a %dx28672x4096 %s product: %.0f GB/s (cuBLAS alone %.0f)\n", m,
            std::string(DTypeName(dtype)).c_str(),
            MeasureSkinnyBandwidth(*probe->backend, m, 28672, 4096, dtype) / 1e9,
            MeasureCublasSkinnyBandwidth(*probe->backend, m, 28672, 4096, dtype) / 1e9);
      }
      if (dtype == DType::kF32) continue;
      if (const double rate = MeasureCublasRate(*probe->backend, dtype, kGemm16, kGemm16, kGemm16);
          rate > 0) {
        gemm16.emplace_back(dtype, rate);
      }
    }
  }
  probe->backend.reset();
  std::printf("measured %s bandwidth: %.1f GB/s; fp32 GEMM %dx%dx%d: %.0f GFLOP/s\n",
              on_cpu ? "read" : "device copy (read + write)", bandwidth / 1e9, gemm_m, gemm_n,
              gemm_k, gemm_flops / 1e9);
  for (auto [dtype, rate] : gemm16) {
    std::printf("cuBLAS %s GEMM %dx%dx%d (f32 accumulation, random operands): %.1f TFLOP/s\n",
                std::string(DTypeName(dtype)).c_str(), kGemm16, kGemm16, kGemm16, rate / 1e12);
  }
  std::printf("\n");

  std::optional<DType> kv_dtype;
  if (const std::string kv = absl::GetFlag(FLAGS_kv_dtype); !kv.empty()) {
    auto parsed = ParseDType(kv);
    if (!parsed.ok()) {
      std::cerr << "--kv_dtype: " << parsed.status().message() << "\n";
      return 2;
    }
    kv_dtype = *parsed;
  }
  LatentShape::Form latent_form = LatentShape::Form::kCheaper;
  if (const std::string form = absl::GetFlag(FLAGS_latent_form); form == "absorbed") {
    latent_form = LatentShape::Form::kAbsorbed;
  } else if (form == "expanded") {
    latent_form = LatentShape::Form::kExpanded;
  } else if (form != "cheaper") {
    std::cerr << "--latent_form is '" << form << "'; use cheaper, absorbed or expanded\n";
    return 2;
  }
  if (const std::string dir = absl::GetFlag(FLAGS_load); !dir.empty()) {
    if (int rc = MeasureLoad(dir, backend_name, threads, repeats); rc != 0) return rc;
  }

  // The models to measure: --model's file, or each shape in each type.
  struct Entry {
    std::string shape;
    DType dtype = DType::kF32;
    std::string file;
  };
  std::vector<Entry> entries;
  if (const std::string file = absl::GetFlag(FLAGS_model); !file.empty()) {
    entries.push_back({std::filesystem::path(file).filename().string(), DType::kF32, file});
  } else {
    for (const std::string& shape : absl::GetFlag(FLAGS_shapes)) {
      for (const DType dtype : dtypes) entries.push_back({shape, dtype, ""});
    }
  }
  const int longest =
      std::max(*std::max_element(prompts.begin(), prompts.end()), decode_prompt + decode_steps);
  std::vector<Result> results;
  for (const Entry& entry : entries) {
    const std::string& shape = entry.shape;
    absl::StatusOr<std::unique_ptr<ModelWeights>> weights;
    if (!entry.file.empty()) {
      weights = LoadModel(entry.file);
      if (!weights.ok()) {
        std::cerr << "--model: " << weights.status().message() << "\n";
        return 2;
      }
      if ((*weights)->config.seq_len < longest) {
        std::cerr << "--model: its context of " << (*weights)->config.seq_len
                  << " tokens is shorter than the benchmark's " << longest
                  << "; give smaller --prompts or --decode_prompt\n";
        return 2;
      }
    } else {
      absl::StatusOr<ModelConfig> named = NamedShape(shape);
      if (!named.ok()) {
        std::cerr << "--shapes: " << named.status().message() << "\n";
        return 2;
      }
      ModelConfig config = *named;
      // The benchmark's prompts may be longer than the checkpoint's
      // training context; positions past it are still well defined for RoPE.
      config.seq_len = std::max(config.seq_len, longest);
      weights = MakeSyntheticModel(config, 1, entry.dtype);
      CHECK_OK(weights.status());
    }
    const ModelConfig config = (*weights)->config;
    Result result;
    result.shape = shape;
    result.wtype = (*weights)->dtype();
    result.dtype = entry.file.empty() ? std::string(DTypeName(entry.dtype)) : "file";
    const ModelWeights& w = **weights;
    const WeightCount read = DecodeWeights(w);
    result.weight_bytes = read.bytes;
    result.weight_params = read.params;
    result.expert_bytes = read.expert_bytes;
    result.expert_params = read.expert_params;
    result.experts = read.experts;
    result.top_k = read.top_k;
    result.classifier_params = double(config.vocab_size) * config.dim;
    const int max_batch = *std::max_element(batches.begin(), batches.end());
    EngineOptions options;
    options.max_batch_tokens = std::max(longest, max_batch);
    options.max_logit_rows = max_batch;
    options.num_blocks = max_batch * ((longest + 15) / 16) + 8;
    options.kv_dtype = kv_dtype;
    options.latent_form = latent_form;
    auto backend = ChooseBackend({.name = backend_name, .threads = threads});
    CHECK_OK(backend.status());
#ifdef TANDEM_HAVE_CUDA
    auto* cuda = dynamic_cast<CudaBackend*>(backend->backend.get());
#endif
    auto engine = Engine::Create(**weights, std::move(backend->backend), options);
    CHECK_OK(engine.status());
    weights->reset();  // the engine holds its own copy
    // K and V of every layer (with an int8 cache's scales) for the context
    // a decode step attends to.
    const KvLayout& kv = (*engine)->kv_layout();
    const double kv_token_bytes = double(kv.block_bytes()) * kv.n_layers / kv.block_size;
    result.kv_bytes_per_sequence = kv_token_bytes * (decode_prompt + decode_steps / 2);
    for (int p : prompts) result.prefill.emplace_back(p, TimePrefill(**engine, p, repeats));
    for (int b : batches) {
      // What picking on the host (logits copied out) costs beside the
      // engine's own picks, which the table reports.
      const auto [host_tps, pick_s] =
          TimeDecode(**engine, b, decode_prompt, decode_steps, repeats, /*host_pick=*/true);
      const double tps =
          TimeDecode(**engine, b, decode_prompt, decode_steps, repeats, /*host_pick=*/false).first;
      std::printf(
          "  decode batch %d: %.2f ms a step with the engine's picks; %.2f ms with the logits "
          "copied to the host and picked there (%.2f ms of it picking)\n",
          b, b / tps * 1e3, b / host_tps * 1e3, pick_s * 1e3);
      result.decode.emplace_back(b, tps);
#ifdef TANDEM_HAVE_CUDA
      // Where the device's time goes in a step, op by op (one more run,
      // untimed: the events cost a little).
      if (cuda != nullptr) {
        // The tiled attention kernel beside the paged-block one (the
        // default where it applies), the same steps.
        cuda->set_block_decode(false);
        const double tiled =
            TimeDecode(**engine, b, decode_prompt, decode_steps, repeats, false).first;
        cuda->set_block_decode(true);
        std::printf("  decode batch %d: %.2f ms a step with the tiled attention kernel\n", b,
                    b / tiled * 1e3);
        StepHooks hooks{.before = [&] { cuda->StartOpProfile(); },
                        .after =
                            [&](int steps) {
                              auto profile = cuda->TakeOpProfile();
                              CHECK_OK(profile.status());
                              std::string line;
                              for (const auto& [op, seconds] : *profile) {
                                absl::StrAppendFormat(&line, " %s %.3f", op, seconds / steps * 1e3);
                              }
                              std::printf("  decode batch %d, device ms a step by op:%s\n", b,
                                          line.c_str());
                            }};
        TimeDecode(**engine, b, decode_prompt, std::min(decode_steps, 8), 1, false, hooks);
      }
#endif
    }
    results.push_back(result);
  }

  // The table and the JSON line, each figure beside the limits measured above.
  const MeasuredLimits limits{
      .bandwidth = bandwidth, .gemm_flops = gemm_flops, .gemm16 = std::move(gemm16)};
  PrintTable(results, limits, on_cpu);
  PrintJsonLine(results, limits, backend_name);
  return 0;
}

}  // namespace
}  // namespace tandem::engine_bench

int main(int argc, char** argv) {
  tandem::ParseToolFlags(
      argc, argv,
      "Measures prefill and batched decode tokens/s of the engine on synthetic models.\n"
      "Usage: tandem-engine-bench [--backend=cpu|cuda] [--dtype=f32,bf16] "
      "[--shapes=stories15M,stories110M,llama3.2-1b,llama3-8b]\n"
      "       [--load=HUB_FOLDER]\n"
      "       [--batches=1,2,4,...] [--prompts=128,512] [--decode_prompt=128]");
  return tandem::engine_bench::Run();
}
