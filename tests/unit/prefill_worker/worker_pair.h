// A prefill loop and a decode loop on one in-process fabric, each on a
// backend the test chooses, serving requests the way the router does
// (reserve on the decode worker, prefill against its lease, Start, decode),
// so that tests can compare the tokens and KV byte counts of runs on
// different backends and KV paths.
#ifndef TANDEM_TESTS_UNIT_PREFILL_WORKER_WORKER_PAIR_H_
#define TANDEM_TESTS_UNIT_PREFILL_WORKER_WORKER_PAIR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/status_macros.h"
#include "common/compute/backend.h"
#include "common/model/model_weights.h"
#include "decode_worker/decode_loop.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"
#include "prefill_worker/prefill_loop.h"
#include "tests/testing/host_kv_copier.h"
#include "tests/unit/decode_worker/recording_sink.h"
#include "tests/unit/prefill_worker/decode_side.h"

namespace tandem::prefill::testing {

// What one request produced, for comparing runs.
struct PairOutcome {
  std::vector<std::vector<int32_t>> tokens;  // Per choice: first token, then the rest.
  int64_t kv_bytes = 0;                      // PrefillResult::kv_bytes.
  int cached_tokens = 0;                     // Held by the decode worker, not shipped.
};

// Every request of a run, and the workers' counters at its end.
struct PairRun {
  std::vector<PairOutcome> requests;
  uint64_t prefill_kv_bytes = 0;  // The workers' transfer counters.
  uint64_t decode_kv_bytes = 0;
  uint64_t to_host_bytes = 0;  // What HostKvCopiers moved, if the backends had them.
  uint64_t to_device_bytes = 0;
};

class WorkerPair {
 public:
  // Each backend may be a ::tandem::testing::CopierBackend, whose copier's
  // counters then go into the run.
  WorkerPair(const ModelWeights& weights, std::unique_ptr<Backend> prefill_backend,
             std::unique_ptr<Backend> decode_backend) {
    if (auto* p = dynamic_cast<::tandem::testing::CopierBackend*>(prefill_backend.get())) {
      prefill_copier_ = &p->copier();
    }
    if (auto* d = dynamic_cast<::tandem::testing::CopierBackend*>(decode_backend.get())) {
      decode_copier_ = &d->copier();
    }
    fabric_ = kvtransfer::InProcFabric::Create();
    prefill_transport_ = kvtransfer::InProcTransport::Create(fabric_);
    decode_transport_ = kvtransfer::InProcTransport::Create(fabric_);
    PrefillLoopOptions prefill_options;
    prefill_options.kv_blocks = kBlocks;
    prefill_options.max_batch_tokens = 64;  // Long prompts go in chunks.
    prefill_ = PrefillLoop::Create(weights, std::move(prefill_backend), prefill_transport_.get(),
                                   &Clock::Real(), prefill_options)
                   .value();
    decode::DecodeLoopOptions decode_options;
    decode_options.kv_blocks = kBlocks;
    decode_ = decode::DecodeLoop::Create(weights, std::move(decode_backend),
                                         decode_transport_.get(), decode_options)
                  .value();
  }
  ~WorkerPair() {
    // The loops stop driving their transports before the transports go.
    decode_.reset();
    prefill_.reset();
  }

  // Reserve on the decode worker, prefill there, Start, decode to the end.
  absl::StatusOr<PairOutcome> Generate(const decode::Request& request) {
    auto sink = std::make_shared<decode::testing::RecordingSink>();
    RETURN_IF_ERROR(decode_->Submit(request, sink).status());
    if (!sink->WaitReserved(kWait)) return absl::InternalError("no reservation");
    PrefillJob job;
    job.request_id = request.request_id;
    job.tokens = request.prompt;
    job.sampling = request.sampling;
    job.n = request.n;
    job.kv_descriptor = sink->descriptor();
    job.deadline = absl::Now() + kWait;
    Outcome out;
    prefill_->Submit(std::move(job), out.Callback());
    if (!decode::testing::WaitFor([&] { return out.done(); }, kWait)) {
      return absl::InternalError("no prefill reply");
    }
    ASSIGN_OR_RETURN(PrefillResult result, out.result());
    decode::testing::StartResult start;
    decode_->Start(request.request_id, sink->generation(), result.first_token,
                   result.extra_first_tokens, start.Callback(), result.sampler_draws);
    RETURN_IF_ERROR(start.Wait(kWait));
    if (!sink->WaitEnded(kWait)) return absl::InternalError("the stream did not end");
    RETURN_IF_ERROR(sink->status());
    PairOutcome o;
    for (int i = 0; i < request.n; ++i) {
      std::vector<int32_t> tokens = {i == 0 ? result.first_token
                                            : result.extra_first_tokens[i - 1]};
      for (int32_t t : sink->tokens(i)) tokens.push_back(t);
      o.tokens.push_back(std::move(tokens));
    }
    o.kv_bytes = result.kv_bytes;
    o.cached_tokens = sink->cached_tokens();
    return o;
  }

  // Waits for both workers to be idle, checks that every block is back and
  // no transfer failed, and records the counters in `run`.
  void Finish(PairRun& run) {
    EXPECT_TRUE(decode_->WaitUntilIdle(kWait));
    EXPECT_TRUE(prefill_->WaitUntilIdle(absl::Now() + kWait));
    const PrefillStats p = prefill_->Stats();
    const decode::LoopStats d = decode_->Stats();
    EXPECT_EQ(p.kv_blocks_free, p.kv_blocks_total);
    EXPECT_EQ(p.kv_transfers_failed, 0u);
    EXPECT_EQ(d.kv_transfers_failed, 0u);
    run.prefill_kv_bytes = p.kv_transfer_bytes;
    run.decode_kv_bytes = d.kv_transfer_bytes;
    if (prefill_copier_ != nullptr) {
      run.to_host_bytes = prefill_copier_->to_host_bytes();
      EXPECT_EQ(prefill_copier_->to_device_calls(), 0);
      EXPECT_EQ(prefill_copier_->pending(), 0);
    }
    if (decode_copier_ != nullptr) {
      run.to_device_bytes = decode_copier_->to_device_bytes();
      EXPECT_EQ(decode_copier_->to_host_calls(), 0);
      EXPECT_EQ(decode_copier_->pending(), 0);
    }
  }

 private:
  static constexpr int kBlocks = 256;
  static constexpr absl::Duration kWait = absl::Seconds(60);

  std::shared_ptr<kvtransfer::InProcFabric> fabric_;
  std::unique_ptr<kvtransfer::InProcTransport> prefill_transport_;
  std::unique_ptr<kvtransfer::InProcTransport> decode_transport_;
  // Owned by the loops' backends, when they are CopierBackends.
  ::tandem::testing::HostKvCopier* prefill_copier_ = nullptr;
  ::tandem::testing::HostKvCopier* decode_copier_ = nullptr;
  std::unique_ptr<PrefillLoop> prefill_;
  std::unique_ptr<decode::DecodeLoop> decode_;
};

// Runs `requests` one after the other (so that prefix-cache hits do not
// depend on timing) on a fresh pair of workers.
inline PairRun RunPair(const ModelWeights& weights, std::unique_ptr<Backend> prefill_backend,
                       std::unique_ptr<Backend> decode_backend,
                       const std::vector<decode::Request>& requests) {
  PairRun run;
  WorkerPair workers(weights, std::move(prefill_backend), std::move(decode_backend));
  for (const decode::Request& r : requests) {
    absl::StatusOr<PairOutcome> o = workers.Generate(r);
    EXPECT_TRUE(o.ok()) << r.request_id << ": " << o.status();
    run.requests.push_back(o.ok() ? *std::move(o) : PairOutcome{});
  }
  workers.Finish(run);
  return run;
}

}  // namespace tandem::prefill::testing

#endif  // TANDEM_TESTS_UNIT_PREFILL_WORKER_WORKER_PAIR_H_
