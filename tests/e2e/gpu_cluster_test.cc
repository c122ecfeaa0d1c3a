// The cluster with both pools on one GPU: real tandem-router, tandem-prefill
// and tandem-decode processes, the workers on the CUDA backend (sharing
// device 0), KV shipped from device memory through page-locked staging over
// UCX. Greedy fp32 text must equal the CPU cluster's, the KV bytes moved must
// be the same, and cancels and a killed worker must leave every block free.
// Skips without a CUDA device (or in a build without CUDA).
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster_harness.h"
#include "tests/testing/model_files.h"
#ifdef TANDEM_WITH_CUDA
#include "common/compute/cuda/cuda_backend.h"
#endif

namespace tandem::testing {
namespace {

// Both workers share the device: each takes a small share of its memory.
const std::vector<std::string> kOnGpu = {"--backend=cuda", "--device=0",
                                         "--gpu_memory_fraction=0.05"};

const char* const kPrompts[] = {
    "Once upon a time",
    "Lily and Tom went to the park. They saw a big",
    "One day, a girl named Sue found a shiny red ball in the garden. She wanted to show it to "
    "her mom, so she ran inside and",
};

#define REQUIRE_GPU_AND_FIXTURES()                                           \
  TANDEM_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");                  \
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");                   \
  if (const std::string why = NoDevice(); !why.empty()) GTEST_SKIP() << why; \
  model_ = model_path;                                                       \
  tokenizer_ = tokenizer_path

std::string NoDevice() {
#ifdef TANDEM_WITH_CUDA
  auto backend = CudaBackend::Create();
  if (!backend.ok()) return std::string(backend.status().message());
  return "";
#else
  return "built without CUDA (-DTANDEM_WITH_CUDA=OFF)";
#endif
}

class GpuClusterTest : public ::testing::Test {
 protected:
  std::unique_ptr<Cluster> Start(int prefill, int decode, std::vector<std::string> worker_flags) {
    ClusterOptions options{
        .prefill = prefill, .decode = decode, .model = model_, .tokenizer = tokenizer_};
    options.prefill_flags = worker_flags;
    options.decode_flags = worker_flags;
    auto cluster = Cluster::Start(options);
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    return cluster.ok() ? std::move(cluster).value() : nullptr;
  }

  // Greedy tokens of every prompt, and the KV bytes the prefill pool sent and
  // the decode pool received.
  struct Run {
    std::vector<std::vector<int32_t>> tokens;
    uint64_t sent = 0, received = 0;
  };
  Run Greedy(Cluster& cluster, int max_tokens) {
    Run run;
    for (const char* prompt : kPrompts) {
      const Completion c =
          RunGenerate(cluster.router(), TextRequest(prompt, max_tokens), absl::Seconds(120));
      EXPECT_TRUE(c.status.ok()) << prompt << ": " << c.status.error_message() << "\n"
                                 << cluster.Logs();
      EXPECT_TRUE(c.finished.disaggregated()) << prompt;
      run.tokens.push_back(c.tokens);
    }
    for (int i = 0; i < cluster.num_prefill(); ++i) {
      auto stats = cluster.Stats(cluster.prefill(i));
      EXPECT_TRUE(stats.ok()) << stats.status();
      if (stats.ok()) run.sent += stats->kv_transfer_bytes();
    }
    for (int i = 0; i < cluster.num_decode(); ++i) {
      auto stats = cluster.Stats(cluster.decode(i));
      EXPECT_TRUE(stats.ok()) << stats.status();
      if (stats.ok()) run.received += stats->kv_transfer_bytes();
    }
    return run;
  }

  std::string model_, tokenizer_;
};

TEST_F(GpuClusterTest, GreedyFp32TextEqualsTheCpuClusterAndTheKvBytesMatch) {
  REQUIRE_GPU_AND_FIXTURES();
  Run cpu, gpu;
  {
    std::unique_ptr<Cluster> cluster = Start(1, 1, {});
    ASSERT_NE(cluster, nullptr);
    cpu = Greedy(*cluster, 64);
  }
  {
    std::unique_ptr<Cluster> cluster = Start(1, 1, kOnGpu);
    ASSERT_NE(cluster, nullptr);
    gpu = Greedy(*cluster, 64);
    const absl::Status idle = cluster->WaitUntilIdle(absl::Seconds(30));
    EXPECT_TRUE(idle.ok()) << idle << "\n" << cluster->Logs();
  }
  EXPECT_EQ(gpu.tokens, cpu.tokens);
  EXPECT_GT(gpu.sent, 0u);
  EXPECT_EQ(gpu.sent, gpu.received);
  EXPECT_EQ(gpu.sent, cpu.sent);
}

TEST_F(GpuClusterTest, Bf16KvShipsHalfTheBytes) {
  REQUIRE_GPU_AND_FIXTURES();
  std::vector<std::string> f32 = kOnGpu, bf16 = kOnGpu;
  bf16.push_back("--kv_dtype=bf16");
  Run wide, narrow;
  {
    std::unique_ptr<Cluster> cluster = Start(1, 1, f32);
    ASSERT_NE(cluster, nullptr);
    wide = Greedy(*cluster, 8);
  }
  {
    std::unique_ptr<Cluster> cluster = Start(1, 1, bf16);
    ASSERT_NE(cluster, nullptr);
    narrow = Greedy(*cluster, 8);
    EXPECT_TRUE(cluster->WaitUntilIdle(absl::Seconds(30)).ok()) << cluster->Logs();
  }
  EXPECT_EQ(narrow.sent, narrow.received);
  EXPECT_EQ(2 * narrow.sent, wide.sent);
}

TEST_F(GpuClusterTest, CancelsMidStreamFreeEveryBlock) {
  REQUIRE_GPU_AND_FIXTURES();
  std::unique_ptr<Cluster> cluster = Start(1, 1, kOnGpu);
  ASSERT_NE(cluster, nullptr);
  for (int round = 0; round < 8; ++round) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = cluster->router().Generate(&ctx, TextRequest(kPrompts[round % 3], 400));
    v1::GenerateResponse response;
    for (int i = 0; i < round % 4; ++i) {
      if (!reader->Read(&response)) break;
    }
    ctx.TryCancel();
    while (reader->Read(&response)) {
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok() || status.error_code() == grpc::StatusCode::CANCELLED)
        << status.error_message();
  }
  const absl::Status idle = cluster->WaitUntilIdle(absl::Seconds(30));
  EXPECT_TRUE(idle.ok()) << idle << "\n" << cluster->Logs();
}

TEST_F(GpuClusterTest, PrefillWorkerKilledUnderLoadRequestsStillComplete) {
  REQUIRE_GPU_AND_FIXTURES();
  std::unique_ptr<Cluster> cluster = Start(2, 1, kOnGpu);
  ASSERT_NE(cluster, nullptr);
  constexpr int kClients = 8, kRequestsEach = 4;
  std::atomic<int> done{0};
  std::vector<std::vector<Completion>> got(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      for (int r = 0; r < kRequestsEach; ++r) {
        got[i].push_back(RunGenerate(cluster->router(),
                                     TextRequest(absl::StrCat("the story ", i, " part ", r), 24),
                                     absl::Seconds(120)));
        ++done;
      }
    });
  }
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (done < kClients && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  cluster->prefill(0).process->Kill();
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kClients; ++i) {
    for (const Completion& c : got[i]) {
      ASSERT_TRUE(c.status.ok()) << c.status.error_message() << "\n" << cluster->Logs();
      EXPECT_EQ(c.finished.usage().completion_tokens(), static_cast<int>(c.tokens.size()));
    }
  }
  const absl::Status idle = cluster->WaitUntilIdle(absl::Seconds(30));
  EXPECT_TRUE(idle.ok()) << idle << "\n" << cluster->Logs();
}

}  // namespace
}  // namespace tandem::testing
