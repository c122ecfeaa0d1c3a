// tandem-engine-bench: prefill and batched-decode throughput of the engine
// on synthetic models of real shapes, beside the llama.cpp anchors of
// ../shared/docs/PERF_ANCHORS.md (CPU shapes), the measured memory bandwidth
// (the batch-1 decode ceiling) and the measured GEMM rate (the prefill
// ceiling). --backend cuda runs the same on the GPU, each figure beside its
// limit measured in the same run: the HBM roofline of a decode step and
// cuBLAS's GEMM rate in the weights' type.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/flags.h"
#include "common/base/logging.h"
#include "common/compute/backend_choice.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/engine/sampler.h"
#include "common/model/model_weights.h"
#include "common/model/synthetic.h"
#ifdef TANDEM_HAVE_CUDA
#include "common/compute/cuda/cuda_backend.h"
#endif

ABSL_FLAG(std::vector<std::string>, shapes, std::vector<std::string>({"stories15M", "stories110M"}),
          "Model shapes to measure: stories15M, stories110M, llama3.2-1b, llama3-8b (32 GB of "
          "fp32 weights; for GPUs)");
ABSL_FLAG(std::vector<std::string>, dtype, std::vector<std::string>({"f32"}),
          "Weight types to measure, each shape in each: f32, bf16, f16 (e.g. --dtype=f32,bf16)");
ABSL_FLAG(std::string, kv_dtype, "", "KV cache type; empty = the weights' type");
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

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Per-ISA clones, but not in the sanitizer builds that cannot run their
// IFUNC resolvers (see TANDEM_NO_TARGET_CLONES in the top CMakeLists.txt).
#ifdef TANDEM_NO_TARGET_CLONES
#define TANDEM_SUM_CLONES
#else
#define TANDEM_SUM_CLONES __attribute__((target_clones("avx512f", "arch=haswell", "default")))
#endif

// Sum of n floats (n a multiple of 64) in four 16-float vector
// accumulators, so that the loop is bound by memory, not by the latency of
// one accumulator.
using Floats16 = float __attribute__((vector_size(64)));
TANDEM_SUM_CLONES float SumFloats(const float* p, size_t n) {
  Floats16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  for (size_t i = 0; i < n; i += 64) {
    Floats16 v[4];
    std::memcpy(v, p + i, sizeof(v));
    a0 += v[0];
    a1 += v[1];
    a2 += v[2];
    a3 += v[3];
  }
  const Floats16 s = (a0 + a1) + (a2 + a3);
  float total = 0.0f;
  for (int j = 0; j < 16; ++j) total += s[j];
  return total;
}

// The same sum read as four streams a quarter of the range apart, 16
// floats of each per round, as a matrix-vector product reads four weight
// rows at once (n a multiple of 256).
TANDEM_SUM_CLONES float SumFloatStreams(const float* p, size_t n) {
  const size_t quarter = n / 4;
  Floats16 a[4] = {};
  for (size_t i = 0; i < quarter; i += 16) {
    for (int s = 0; s < 4; ++s) {
      Floats16 v;
      std::memcpy(&v, p + s * quarter + i, sizeof(v));
      a[s] += v;
    }
  }
  const Floats16 s = (a[0] + a[1]) + (a[2] + a[3]);
  float total = 0.0f;
  for (int j = 0; j < 16; ++j) total += s[j];
  return total;
}

// Sustained read bandwidth with all threads over 2 GiB (far larger than
// the caches), held as the backend holds weights (2 MiB pages, touched
// before use), the best of 8 runs of each of two patterns (one stream per
// thread, and four, as a matrix-vector product reads rows): the ceiling
// for batch-1 decode, which
// reads every weight once per token. (The earlier measurement, a loop over
// a 64-float array of lanes on a vector in 4 KiB pages, best of 3, read 5%
// to 13% less in runs interleaved with this one.) A shared machine's figure
// moves with its neighbours' load (33 to 60 GB/s within minutes on the
// 2-vCPU EPYC machines here), so a decode figure is set against the one
// measured in the same run.
double MeasureReadBandwidth(Backend& backend) {
  const size_t n = size_t{1} << 29;  // 2 GiB of floats
  auto buffer = backend.Allocate(n * sizeof(float));
  CHECK_OK(buffer.status());
  float* buf = (*buffer)->floats();
  std::fill(buf, buf + n, 1.0f);
  double best = 0.0;
  for (int rep = 0; rep < 16; ++rep) {
    float total = 0.0f;
    const auto t0 = Clock::now();
#pragma omp parallel reduction(+ : total)
    {
      const size_t per = n / omp_get_num_threads() / 256 * 256;
      const size_t begin = per * omp_get_thread_num();
      total += rep % 2 == 0 ? SumFloats(buf + begin, per) : SumFloatStreams(buf + begin, per);
    }
    const double bw = n * sizeof(float) / Seconds(Clock::now() - t0);
    // Ones sum exactly: at most 2^29 over 64 f32 lanes is 2^23 a lane.
    if (total != float(n)) std::cerr << "bandwidth check summed " << total << "\n";
    best = std::max(best, bw);
  }
  return best;
}

// Sustained matrix-product rate of the backend's MatMul on a product of
// m x n x k with `wtype` weights, operands in backend memory: the ceiling
// for prefill, which is mostly such products. 512 x 2048 x 768 on CPUs; a
// GPU needs far larger products to fill. Each timing covers `products`
// products in a row, so that the wait for the last one is spread over them.
double MeasureGemmFlops(Backend& backend, int m, int n, int k, DType wtype = DType::kF32,
                        int products = 1) {
  auto x = backend.Allocate(size_t{4} * m * k);
  auto w = backend.Allocate(DTypeSize(wtype) * n * k);
  auto out = backend.Allocate(size_t{4} * m * n);
  CHECK_OK(x.status());
  CHECK_OK(w.status());
  CHECK_OK(out.status());
  std::vector<float> host(static_cast<size_t>(std::max(m, n)) * k, 0.25f);
  backend.CopyToDevice(host.data(), (*x)->data(), size_t{4} * m * k);
  // 0.25 in every type: f32, f16 and bf16 bit patterns.
  const uint16_t quarter = wtype == DType::kF16 ? 0x3400 : 0x3e80;
  const std::vector<uint16_t> host16(wtype == DType::kF32 ? 0 : size_t(n) * k, quarter);
  backend.CopyToDevice(wtype == DType::kF32 ? static_cast<const void*>(host.data()) : host16.data(),
                       (*w)->data(), DTypeSize(wtype) * n * k);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {  // the first one warms up
    const auto t0 = Clock::now();
    for (int i = 0; i < products; ++i) {
      backend.MatMul((*x)->floats(), MatrixRef{(*w)->data(), wtype}, (*out)->floats(), m, n, k,
                     false);
    }
    backend.CopyToHost((*out)->floats(), host.data(), sizeof(float));  // waits for the products
    if (rep > 0) best = std::min(best, Seconds(Clock::now() - t0));
  }
  return 2.0 * m * n * k * products / best;
}

// Weight bytes per second a skinny product of m rows streams through
// (n x k weights, read once): how close decode's matrix products come to the
// memory bandwidth.
double MeasureSkinnyBandwidth(Backend& backend, int m, int n, int k, DType wtype) {
  return MeasureGemmFlops(backend, m, n, k, wtype, /*products=*/20) / (2.0 * m * n * k) *
         (double(DTypeSize(wtype)) * n * k);
}

// The same through cuBLAS alone (the CUDA backend's weight-streaming kernel
// turned off for the measurement); 0 for another backend.
double MeasureCublasSkinnyBandwidth(Backend& backend, int m, int n, int k, DType wtype) {
#ifdef TANDEM_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&backend)) {
    const int rows = cuda->skinny_max_rows();
    cuda->set_skinny_max_rows(0);
    const double rate = MeasureSkinnyBandwidth(backend, m, n, k, wtype);
    cuda->set_skinny_max_rows(rows);
    return rate;
  }
#else
  (void)backend, (void)m, (void)n, (void)k, (void)wtype;
#endif
  return 0.0;
}

// cuBLAS's rate for an m x n x k product of `dtype` operands with f32
// accumulation, as the CUDA backend issues it (without MatMul's rounding of
// the activations); 0 for another backend or a build without CUDA.
double MeasureCublasRate(Backend& backend, DType dtype, int m, int n, int k) {
#ifdef TANDEM_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&backend)) {
    auto rate = cuda->MeasureGemmRate(dtype, m, n, k);
    CHECK_OK(rate.status());
    return *rate;
  }
#else
  (void)backend, (void)dtype, (void)m, (void)n, (void)k;
#endif
  return 0.0;
}

struct Anchor {
  double prefill128, prefill512, decode1, decode16;
};

// llama.cpp F32, 2 threads, same machine type (PERF_ANCHORS.md); none for
// GPU runs or other shapes.
Anchor AnchorFor(const std::string& shape, bool on_cpu) {
  if (!on_cpu) return {};
  if (shape == "stories15M") return {11130, 9702, 641, 1528};
  if (shape == "stories110M") return {1131, 1138, 84, 306};
  return {};
}

struct Result {
  std::string shape;
  std::string dtype;
  DType wtype = DType::kF32;
  std::vector<std::pair<int, double>> prefill;  // prompt -> tokens/s
  std::vector<std::pair<int, double>> decode;   // batch -> tokens/s summed
  double weight_bytes = 0;                      // read by every decode step
  double weight_params = 0;                     // ... and their number
  double classifier_params = 0;
  double kv_bytes_per_sequence = 0;  // read per sequence by a decode step, on average
};

struct WeightCount {
  double bytes = 0;
  double params = 0;
};

// What a batch-1 decode step reads, tensor by tensor (a quantized file
// mixes types): every weight but the embedding rows not looked up (a tied
// classifier reads the whole table).
WeightCount DecodeWeights(const ModelWeights& w) {
  WeightCount count;
  auto add = [&](const Tensor& t) {
    count.bytes += t.size_bytes();
    count.params += t.numel;
  };
  for (const LayerWeights& l : w.layers) {
    for (const Tensor* t : {&l.rms_att, &l.wq, &l.wk, &l.wv, &l.wo, &l.rms_ffn, &l.w1, &l.w2, &l.w3,
                            &l.bq, &l.bk, &l.bv}) {
      add(*t);
    }
  }
  add(w.rms_final);
  add(w.classifier);
  return count;
}

// Loads a hub folder `repeats` + 1 times (the first fills the page cache)
// into an engine and prints the best load rate, in weight bytes per second,
// with the weights fingerprint's time apart.
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
                                     bool host_pick, const StepHooks& hooks = {}) {
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
  // The product rate that bounds a prefill with `dtype` weights, and its name.
  auto prefill_limit = [&](DType dtype) -> std::pair<double, std::string> {
    for (auto [type, rate] : gemm16) {
      if (type == dtype) {
        return {rate, absl::StrCat("cuBLAS ", std::string(DTypeName(type)), " GEMM rate")};
      }
    }
    return {gemm_flops, "GEMM rate"};
  };

  std::optional<DType> kv_dtype;
  if (const std::string kv = absl::GetFlag(FLAGS_kv_dtype); !kv.empty()) {
    auto parsed = ParseDType(kv);
    if (!parsed.ok()) {
      std::cerr << "--kv_dtype: " << parsed.status().message() << "\n";
      return 2;
    }
    kv_dtype = *parsed;
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
      ModelConfig config;
      if (shape == "stories15M") {
        config = Stories15MShape();
      } else if (shape == "stories110M") {
        config = Stories110MShape();
      } else if (shape == "llama3.2-1b") {
        config = Llama32_1BShape();
      } else if (shape == "llama3-8b") {
        config = Llama3_8BShape();
      } else {
        std::cerr << "unknown --shapes entry '" << shape
                  << "'; use stories15M, stories110M, llama3.2-1b or llama3-8b\n";
        return 2;
      }
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
    result.classifier_params = double(config.vocab_size) * config.dim;
    const int max_batch = *std::max_element(batches.begin(), batches.end());
    EngineOptions options;
    options.max_batch_tokens = std::max(longest, max_batch);
    options.max_logit_rows = max_batch;
    options.num_blocks = max_batch * ((longest + 15) / 16) + 8;
    options.kv_dtype = kv_dtype;
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

  // Prefill: 2 flops per weight per token, classifier excluded (only the
  // last token's logits are computed), attention excluded.
  auto prefill_flops = [](const Result& r) {
    return 2.0 * (r.weight_params - r.classifier_params);
  };
  // Decode reads every weight once per step, plus each sequence's KV.
  auto decode_limit = [&](const Result& r, int batch) {
    return batch * bandwidth / (r.weight_bytes + batch * r.kv_bytes_per_sequence);
  };

  // Table: beside llama.cpp's figures on CPUs, beside the measured limits
  // on a GPU.
  if (on_cpu) {
    std::printf("%-18s %-22s %12s %12s %8s\n", "model", "measurement", "tandem tok/s", "llama.cpp",
                "ratio");
  } else {
    std::printf("%-18s %-22s %12s %12s %9s\n", "model", "measurement", "tandem tok/s",
                "limit tok/s", "of limit");
  }
  for (const Result& r : results) {
    // The llama.cpp anchors are for f32 weights.
    const Anchor a = r.dtype == "f32" ? AnchorFor(r.shape, on_cpu) : Anchor{};
    const std::string name = absl::StrCat(r.shape, " ", r.dtype);
    const double gemm_limit = prefill_limit(r.wtype).first;
    for (auto [p, tps] : r.prefill) {
      if (!on_cpu) {
        const double limit = gemm_limit / prefill_flops(r);
        std::printf("%-18s %-22s %12.0f %12.0f %8.0f%%\n", name.c_str(),
                    absl::StrCat("prefill ", p).c_str(), tps, limit, 100.0 * tps / limit);
        continue;
      }
      const double anchor = p == 128 ? a.prefill128 : p == 512 ? a.prefill512 : 0;
      std::printf("%-18s %-22s %12.0f %12s %8s\n", name.c_str(),
                  absl::StrCat("prefill ", p).c_str(), tps,
                  anchor > 0 ? absl::StrFormat("%.0f", anchor).c_str() : "-",
                  anchor > 0 ? absl::StrFormat("%.2f", tps / anchor).c_str() : "-");
    }
    for (auto [b, tps] : r.decode) {
      if (!on_cpu) {
        const double limit = decode_limit(r, b);
        std::printf("%-18s %-22s %12.1f %12.1f %8.0f%%\n", name.c_str(),
                    absl::StrCat("decode batch ", b).c_str(), tps, limit, 100.0 * tps / limit);
        continue;
      }
      const double anchor = b == 1 ? a.decode1 : b == 16 ? a.decode16 : 0;
      std::printf("%-18s %-22s %12.1f %12s %8s\n", name.c_str(),
                  absl::StrCat("decode batch ", b).c_str(), tps,
                  anchor > 0 ? absl::StrFormat("%.0f", anchor).c_str() : "-",
                  anchor > 0 ? absl::StrFormat("%.2f", tps / anchor).c_str() : "-");
    }
    const auto [rate, rate_name] = prefill_limit(r.wtype);
    for (auto [p, tps] : r.prefill) {
      std::printf("%-18s prefill %d at %.0f GFLOP/s of weight products, %.0f%% of the %s",
                  name.c_str(), p, tps * prefill_flops(r) / 1e9,
                  100.0 * tps * prefill_flops(r) / rate, rate_name.c_str());
      if (!on_cpu) std::printf(" (%.1f TFLOP/s)", rate / 1e12);
      std::printf("\n");
    }
    for (auto [b, tps] : r.decode) {
      const double bytes = r.weight_bytes + b * r.kv_bytes_per_sequence;
      const double limit = decode_limit(r, b);
      std::printf(
          "%-18s decode batch %d: bandwidth limit %.1f tok/s (%.0f MB/step at %.1f GB/s); "
          "at %.0f%% (%.2fx the limit's step time)\n",
          name.c_str(), b, limit, bytes / 1e6, bandwidth / 1e9, 100.0 * tps / limit, limit / tps);
    }
    std::printf("\n");
  }

  // One JSON line for scripts.
  std::vector<std::string> parts;
  for (const Result& r : results) {
    std::vector<std::string> pf, dc;
    for (auto [p, t] : r.prefill) pf.push_back(absl::StrFormat("\"%d\":%.1f", p, t));
    for (auto [b, t] : r.decode) dc.push_back(absl::StrFormat("\"%d\":%.1f", b, t));
    parts.push_back(absl::StrFormat(
        "\"%s %s\":{\"prefill_tok_s\":{%s},\"decode_tok_s\":{%s},\"weight_bytes\":%.0f}", r.shape,
        r.dtype, absl::StrJoin(pf, ","), absl::StrJoin(dc, ","), r.weight_bytes));
  }
  for (auto [dtype, rate] : gemm16) {
    parts.insert(parts.begin(), absl::StrFormat("\"gemm_%s_gflops\":%.1f",
                                                std::string(DTypeName(dtype)), rate / 1e9));
  }
  std::printf(
      "{\"bench\":\"tandem-engine-bench\",\"backend\":\"%s\",\"bandwidth_gbs\":%.2f,"
      "\"gemm_gflops\":%.1f,%s}\n",
      backend_name.c_str(), bandwidth / 1e9, gemm_flops / 1e9, absl::StrJoin(parts, ",").c_str());
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::ParseToolFlags(
      argc, argv,
      "Measures prefill and batched decode tokens/s of the engine on synthetic models.\n"
      "Usage: tandem-engine-bench [--backend=cpu|cuda] [--dtype=f32,bf16] "
      "[--shapes=stories15M,stories110M,llama3.2-1b,llama3-8b]\n"
      "       [--load=HUB_FOLDER]\n"
      "       [--batches=1,2,4,...] [--prompts=128,512] [--decode_prompt=128]");
  return tandem::Run();
}
