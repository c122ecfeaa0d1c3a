// A fixture for the prefill worker's prefix cache and partial leases: two
// loops on one fabric, one with the prefix cache and one without, and a
// decode side whose landed K/V the tests compare.
#ifndef TANDEM_TESTS_UNIT_PREFILL_WORKER_CACHE_FIXTURE_H_
#define TANDEM_TESTS_UNIT_PREFILL_WORKER_CACHE_FIXTURE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/status_macros.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/model/synthetic.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"
#include "kvtransfer/wire_format.h"
#include "prefill_worker/prefill_loop.h"
#include "prefill_worker/prefill_metrics.h"
#include "prefill_worker/prefill_scheduler.h"
#include "prometheus/registry.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/prefill_worker/decode_side.h"

namespace tandem::prefill::testing {

inline constexpr absl::Duration kWait = absl::Seconds(60);
inline constexpr int kBlock = 16;  // The loops' default block size.

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline std::vector<int32_t> Prefix(const std::vector<int32_t>& tokens, size_t n) {
  return std::vector<int32_t>(tokens.begin(), tokens.begin() + n);
}

inline double Value(prometheus::Registry& registry, const std::string& name) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name || family.metric.empty()) continue;
    const prometheus::ClientMetric& m = family.metric.front();
    return family.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
  }
  return -1;
}

class PrefillCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(weights_, MakeSyntheticModel(TestShape(), 7));
    fabric_ = kvtransfer::InProcFabric::Create();
    decode_ = std::make_unique<DecodeSide>(*weights_, fabric_, 512);
    reference_ = MakeEngine(*weights_, 64);
    vocab_ = weights_->config.vocab_size;
  }

  // Starts `cached_` (prefix cache on, feeding `registry_`) and `uncached_`
  // (off), both with `options` otherwise.
  void StartLoops(PrefillLoopOptions options = {}) {
    options.model_name = "synthetic";
    for (bool cache : {true, false}) {
      PrefillLoopOptions o = options;
      o.prefix_cache = cache;
      o.metrics = cache ? &metrics_ : nullptr;
      transports_.push_back(kvtransfer::InProcTransport::Create(fabric_));
      auto backend = CpuBackend::Create(CpuBackendOptions{1});
      ASSERT_OK(backend.status());
      ASSERT_OK_AND_ASSIGN((cache ? cached_ : uncached_),
                           PrefillLoop::Create(*weights_, std::move(backend).value(),
                                               transports_.back().get(), &Clock::Real(), o));
    }
  }

  PrefillJob Job(const std::vector<int32_t>& tokens, const DecodeSide::Lease& lease) {
    PrefillJob job;
    job.request_id = absl::StrCat("r", lease.request_id);
    job.tokens = tokens;
    job.kv_descriptor = lease.descriptor;
    job.deadline = absl::Now() + kWait;
    return job;
  }

  // Submits `job` to `loop` and drives the decode side until the job was
  // answered and, when it succeeded, its lease has ended.
  absl::StatusOr<PrefillResult> Run(PrefillLoop& loop, const PrefillJob& job,
                                    const DecodeSide::Lease& lease) {
    Outcome out;
    loop.Submit(job, out.Callback());
    const bool ended =
        decode_->PumpUntil([&] { return out.done() && (lease.ended || !out.status().ok()); });
    EXPECT_TRUE(ended) << job.request_id << " did not end";
    return out.result();
  }

  // A plain greedy prefill of `prompt` into a new lease from `first_block`.
  absl::StatusOr<PrefillResult> Prefill(PrefillLoop& loop, const std::vector<int32_t>& prompt,
                                        DecodeSide::Lease** lease_out = nullptr,
                                        int first_block = 0) {
    DecodeSide::Lease* lease =
        decode_->Expect(static_cast<int>(prompt.size()), 16, absl::Now() + kWait, first_block);
    if (lease_out != nullptr) *lease_out = lease;
    return Run(loop, Job(prompt, *lease), *lease);
  }

  // The landed K/V of prompt blocks [from, to) of `lease`: the slots of
  // prompt tokens only (the rest of a last block holds whatever the block
  // held before), or with `whole` every byte.
  std::vector<std::string> Blocks(const DecodeSide::Lease& lease, int from, int to,
                                  bool whole = false) {
    const KvLayout& layout = reference_->kv_layout();
    const size_t element = layout.element_bytes();
    const size_t kv_dim = static_cast<size_t>(layout.kv_dim);
    std::vector<std::string> blocks;
    for (int b = from; b < to; ++b) {
      const std::string bytes = decode_->BlockBytes(lease, b);
      if (whole) {
        blocks.push_back(bytes);
        continue;
      }
      const size_t slots = std::min(kBlock, lease.prompt_len - b * kBlock);
      std::string valid;
      for (size_t layer = 0; layer * layout.block_bytes() < bytes.size(); ++layer) {
        const char* base = bytes.data() + layer * layout.block_bytes();
        for (size_t d = 0; d < kv_dim; ++d) {  // Keys: dimension-major.
          valid.append(base + d * kBlock * element, slots * element);
        }
        const char* values = base + kv_dim * kBlock * element;  // Values: slot-major.
        valid.append(values, slots * kv_dim * element);
      }
      blocks.push_back(std::move(valid));
    }
    return blocks;
  }

  // Equal bytes, or where the first difference is and how large the
  // largest one is (the KV is f32).
  static ::testing::AssertionResult Same(const std::vector<std::string>& got,
                                         const std::vector<std::string>& want) {
    if (got.size() != want.size()) {
      return ::testing::AssertionFailure() << got.size() << " blocks, want " << want.size();
    }
    for (size_t b = 0; b < got.size(); ++b) {
      if (got[b] == want[b]) continue;
      const auto* g = reinterpret_cast<const float*>(got[b].data());
      const auto* w = reinterpret_cast<const float*>(want[b].data());
      size_t first = 0, differ = 0;
      float largest = 0;
      for (size_t i = 0; i < got[b].size() / sizeof(float); ++i) {
        if (g[i] == w[i]) continue;
        if (differ++ == 0) first = i;
        largest = std::max(largest, std::abs(g[i] - w[i]));
      }
      return ::testing::AssertionFailure()
             << "block " << b << ": " << differ << " floats differ, first at " << first
             << ", largest by " << largest;
    }
    return ::testing::AssertionSuccess();
  }

  int32_t Greedy(const std::vector<int32_t>& prompt) {
    return ReferenceTokens(*reference_, prompt, 1).front();
  }

  int64_t BlockBytes(int blocks) const {
    const KvLayout& layout = reference_->kv_layout();
    return int64_t{blocks} * layout.n_layers * static_cast<int64_t>(layout.block_bytes());
  }

  // A scheduler on its own transport, for tests that drive it by hand.
  absl::StatusOr<std::unique_ptr<PrefillScheduler>> MakeScheduler(
      SchedulerOptions options, const Clock* clock = &Clock::Real()) {
    transports_.push_back(kvtransfer::InProcTransport::Create(fabric_));
    ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CpuBackend::Create(CpuBackendOptions{1}));
    options.weights_fingerprint = weights_->Fingerprint();
    return PrefillScheduler::Create(*weights_, std::move(backend), transports_.back().get(), clock,
                                    options);
  }

  // A job for PrefillScheduler::TryAdmit with a fresh lease on the decode
  // side (returned in `lease_out` when given) and a `done` that drops it.
  std::unique_ptr<internal::Job> SchedulerJob(const std::vector<int32_t>& prompt, JobId id,
                                              DecodeSide::Lease** lease_out = nullptr) {
    DecodeSide::Lease* lease = decode_->Expect(static_cast<int>(prompt.size()));
    if (lease_out != nullptr) *lease_out = lease;
    auto job = std::make_unique<internal::Job>(kBlock);
    job->id = id;
    job->request.tokens = prompt;
    job->request.kv_descriptor = lease->descriptor;
    job->request.deadline = absl::Now() + kWait;
    job->arrived = absl::Now();
    job->done = [](absl::StatusOr<PrefillResult>) {};
    absl::StatusOr<kvtransfer::TransferLease> parsed =
        kvtransfer::TransferLease::Parse(lease->descriptor);
    EXPECT_OK(parsed.status());
    if (parsed.ok()) job->lease = *parsed;
    return job;
  }

  // Runs `scheduler` and the decode side until the scheduler replies.
  absl::StatusOr<PrefillResult> DriveUntilReply(PrefillScheduler& scheduler) {
    const absl::Time deadline = absl::Now() + kWait;
    while (absl::Now() < deadline) {
      scheduler.RunOnce();
      for (Reply& r : scheduler.TakeReplies()) return std::move(r.result);
      decode_->receiver().Poll();
      scheduler.WaitForTransfers(absl::Now() + absl::Milliseconds(1));
    }
    return absl::DeadlineExceededError("no reply");
  }

  // Every block free or only cached, nothing running.
  void ExpectNothingHeld(PrefillLoop& loop) {
    const PrefillStats stats = loop.Stats();
    EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
    EXPECT_EQ(stats.running, 0);
    EXPECT_EQ(stats.waiting, 0);
  }

  std::unique_ptr<ModelWeights> weights_;
  std::shared_ptr<kvtransfer::InProcFabric> fabric_;
  std::unique_ptr<DecodeSide> decode_;
  std::unique_ptr<Engine> reference_;
  prometheus::Registry registry_;
  PrefillMetrics metrics_{registry_};
  std::vector<std::unique_ptr<kvtransfer::InProcTransport>> transports_;
  // After the transports, so that they go first.
  std::unique_ptr<PrefillLoop> cached_;
  std::unique_ptr<PrefillLoop> uncached_;
  int vocab_ = 0;
};

}  // namespace tandem::prefill::testing

#endif  // TANDEM_TESTS_UNIT_PREFILL_WORKER_CACHE_FIXTURE_H_
