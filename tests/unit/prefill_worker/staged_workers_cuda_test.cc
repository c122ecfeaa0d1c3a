// A prefill worker and a decode worker both on the CUDA backend: their KV
// caches are device memory, which the transport cannot reach, so KV goes
// through page-locked staging with the backend's KvCopier (copies on their
// own stream, ordered after the compute by events). The greedy tokens and
// KV byte counts must equal those of CPU workers (on an f32 model the CUDA
// backend's greedy tokens are the CPU backend's). Skips without a device.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/cuda/cuda_backend.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/prefill_worker/decode_side.h"
#include "tests/unit/prefill_worker/worker_pair.h"

namespace tandem::prefill {
namespace {

using ::tandem::prefill::testing::PairRun;
using ::tandem::prefill::testing::RandomTokens;
using ::tandem::prefill::testing::RunPair;
using ::tandem::prefill::testing::TestShape;

std::unique_ptr<Backend> Cpu() { return CpuBackend::Create(CpuBackendOptions{1}).value(); }
std::unique_ptr<Backend> Cuda() { return CudaBackend::Create().value(); }

std::vector<decode::Request> GreedyRequests(int vocab) {
  std::vector<decode::Request> requests;
  auto add = [&](std::string id, std::vector<int32_t> prompt, int max_tokens, int n = 1) {
    decode::Request r;
    r.request_id = std::move(id);
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.n = n;
    requests.push_back(std::move(r));
  };
  add("short", RandomTokens(37, vocab, 1), 16);
  const std::vector<int32_t> long_prompt = RandomTokens(120, vocab, 2);  // Two chunks.
  add("long", long_prompt, 7);
  // Three blocks cached on both workers: only the rest is shipped.
  std::vector<int32_t> shared(long_prompt.begin(), long_prompt.begin() + 48);
  const std::vector<int32_t> tail = RandomTokens(30, vocab, 3);
  shared.insert(shared.end(), tail.begin(), tail.end());
  add("shared", shared, 12);
  add("choices", RandomTokens(16, vocab, 4), 10, /*n=*/2);
  return requests;
}

TEST(StagedWorkersCuda, GreedyTokensAndKvBytesEqualTheCpuWorkers) {
  if (absl::StatusOr<std::unique_ptr<CudaBackend>> probe = CudaBackend::Create(); !probe.ok()) {
    GTEST_SKIP() << "no CUDA device: " << probe.status();
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ModelWeights> weights, MakeSyntheticModel(TestShape(), 7));
  const std::vector<decode::Request> requests = GreedyRequests(weights->config.vocab_size);
  const PairRun cpu = RunPair(*weights, Cpu(), Cpu(), requests);
  const PairRun cuda = RunPair(*weights, Cuda(), Cuda(), requests);
  ASSERT_EQ(cpu.requests.size(), requests.size());
  ASSERT_EQ(cuda.requests.size(), requests.size());
  uint64_t total = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(cuda.requests[i].tokens, cpu.requests[i].tokens) << requests[i].request_id;
    EXPECT_EQ(cuda.requests[i].cached_tokens, cpu.requests[i].cached_tokens)
        << requests[i].request_id;
    EXPECT_EQ(cuda.requests[i].kv_bytes, cpu.requests[i].kv_bytes) << requests[i].request_id;
    total += static_cast<uint64_t>(cpu.requests[i].kv_bytes);
  }
  EXPECT_EQ(cpu.requests[2].cached_tokens, 48);
  EXPECT_EQ(cuda.prefill_kv_bytes, total);
  EXPECT_EQ(cuda.decode_kv_bytes, total);
}

}  // namespace
}  // namespace tandem::prefill
