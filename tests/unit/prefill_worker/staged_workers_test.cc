// A prefill worker and a decode worker both on backends whose memory the
// transport cannot reach (the CPU backend behind a HostKvCopier), so that
// KV goes device -> staging -> wire -> staging -> device. Every token, and
// every KV byte count, must equal the run of the same requests with no
// copier (the transport reading and writing the KV caches directly).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/host_kv_copier.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/prefill_worker/decode_side.h"
#include "tests/unit/prefill_worker/worker_pair.h"

namespace tandem::prefill {
namespace {

using ::tandem::prefill::testing::PairRun;
using ::tandem::prefill::testing::RandomTokens;
using ::tandem::prefill::testing::RunPair;
using ::tandem::prefill::testing::TestShape;
using ::tandem::testing::CopierBackend;
using ::tandem::testing::HostKvCopier;

std::unique_ptr<Backend> Cpu() { return CpuBackend::Create(CpuBackendOptions{1}).value(); }

// Each copy finishes on its second poll: the workers must wait for it.
std::unique_ptr<Backend> StagedCpu() {
  return std::make_unique<CopierBackend>(Cpu(), std::make_unique<HostKvCopier>(2));
}

std::vector<decode::Request> Requests(int vocab) {
  std::vector<decode::Request> requests;
  auto add = [&](std::string id, std::vector<int32_t> prompt, int max_tokens) -> decode::Request& {
    decode::Request r;
    r.request_id = std::move(id);
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    return requests.emplace_back(std::move(r));
  };
  add("short", RandomTokens(37, vocab, 1), 12);
  // Two chunks on the prefill worker.
  const std::vector<int32_t> long_prompt = RandomTokens(100, vocab, 2);
  add("long", long_prompt, 10).sampling =
      SamplingParams{.temperature = 0.9f, .top_k = 20, .top_p = 0.9f, .seed = 11};
  // Shares three full blocks with "long": both workers' prefix caches hold
  // them, so the lease starts at block 3 and only the rest is shipped.
  std::vector<int32_t> shared(long_prompt.begin(), long_prompt.begin() + 48);
  const std::vector<int32_t> tail = RandomTokens(21, vocab, 3);
  shared.insert(shared.end(), tail.begin(), tail.end());
  add("shared", shared, 8);
  decode::Request& choices = add("choices", RandomTokens(30, vocab, 4), 9);
  choices.n = 3;
  choices.sampling = SamplingParams{.temperature = 1.0f, .top_k = 0, .top_p = 0.95f, .seed = 5};
  return requests;
}

TEST(StagedWorkers, TokensAndKvBytesEqualTheDirectRunExactly) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ModelWeights> weights, MakeSyntheticModel(TestShape(), 7));
  const std::vector<decode::Request> requests = Requests(weights->config.vocab_size);
  const PairRun direct = RunPair(*weights, Cpu(), Cpu(), requests);
  const PairRun staged = RunPair(*weights, StagedCpu(), StagedCpu(), requests);
  ASSERT_EQ(direct.requests.size(), requests.size());
  ASSERT_EQ(staged.requests.size(), requests.size());
  const ModelConfig& shape = weights->config;
  const KvLayout block{.n_layers = shape.n_layers,
                       .num_blocks = 1,
                       .block_size = 16,
                       .kv_dim = shape.n_kv_heads * (shape.dim / shape.n_heads),
                       .dtype = DType::kF32};
  uint64_t total = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& d = direct.requests[i];
    const auto& s = staged.requests[i];
    EXPECT_EQ(s.tokens, d.tokens) << requests[i].request_id;
    EXPECT_EQ(s.cached_tokens, d.cached_tokens) << requests[i].request_id;
    EXPECT_EQ(s.kv_bytes, d.kv_bytes) << requests[i].request_id;
    EXPECT_EQ(d.tokens.size(), static_cast<size_t>(requests[i].n));
    total += static_cast<uint64_t>(d.kv_bytes);
  }
  // "short" ships its 3 blocks; "shared" (69 tokens, 5 blocks) only the 2
  // after the decode worker's cached three.
  EXPECT_EQ(direct.requests[0].kv_bytes,
            static_cast<int64_t>(3 * shape.n_layers * block.block_bytes()));
  EXPECT_EQ(direct.requests[2].cached_tokens, 48);
  EXPECT_EQ(direct.requests[2].kv_bytes,
            static_cast<int64_t>(2 * shape.n_layers * block.block_bytes()));
  EXPECT_EQ(direct.prefill_kv_bytes, total);
  EXPECT_EQ(direct.decode_kv_bytes, total);
  EXPECT_EQ(staged.prefill_kv_bytes, total);
  EXPECT_EQ(staged.decode_kv_bytes, total);
  // Every shipped byte went through each staging exactly once.
  EXPECT_EQ(staged.to_host_bytes, total);
  EXPECT_EQ(staged.to_device_bytes, total);
}

}  // namespace
}  // namespace tandem::prefill
