// The decode loop under KV transfer faults injected on the prefill side:
// a transfer that cannot complete ends its request with an error and never
// reaches decoding; whatever happens, every KV block is free afterwards.
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/faulty_transport.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"

namespace tandem::decode {
namespace {

using kvtransfer::Fault;
using kvtransfer::FaultPlan;
using ::tandem::decode::testing::DecodeHarness;
using ::tandem::decode::testing::FakePrefill;
using ::tandem::decode::testing::LocalRequest;
using ::tandem::decode::testing::RandomTokens;
using ::tandem::decode::testing::RecordingSink;
using ::tandem::decode::testing::RemoteRequest;
using ::tandem::decode::testing::StartResult;
using ::tandem::testing::StatusIs;
using ::testing::AnyOf;

using testing::kVocab;

TEST(DecodeFaults, CorruptedKvFailsTheRequestWithDataLoss) {
  DecodeLoopOptions options;
  options.receiver.checksums = true;
  FaultPlan plan;
  plan.at_message[1] = Fault{.kind = Fault::Kind::kCorrupt, .bytes = 4};
  DecodeHarness h(options, plan);
  auto sink = std::make_shared<RecordingSink>();
  const Request r = RemoteRequest("corrupt", RandomTokens(40, kVocab, 1), 10);
  ASSERT_OK(h.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitReserved());
  EXPECT_FALSE(h.prefill().Prefill(r.prompt, sink->descriptor()).ok());
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(sink->tokens().empty());
  StartResult start;
  h.loop().Start(r.request_id, sink->generation(), 1, start.Callback());
  EXPECT_THAT(start.Wait(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(h.AllBlocksFree());
  const LoopStats s = h.loop().Stats();
  EXPECT_EQ(s.kv_transfers_failed, 1u);
  EXPECT_EQ(s.requests_failed, 1u);
}

TEST(DecodeFaults, LostConnectionFailsTheRequest) {
  FakeClock clock(absl::Now());
  DecodeLoopOptions options;
  options.kv_timeout = absl::Seconds(30);
  options.clock = &clock;
  FaultPlan plan;
  plan.at_message[1] = Fault{.kind = Fault::Kind::kKill};
  DecodeHarness h(options, plan);
  auto sink = std::make_shared<RecordingSink>();
  const Request r = RemoteRequest("killed", RandomTokens(40, kVocab, 2), 10);
  ASSERT_OK(h.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitReserved());
  EXPECT_FALSE(h.prefill().Prefill(r.prompt, sink->descriptor()).ok());
  // UNAVAILABLE when the receiver had heard from the sender before the
  // connection broke; else the lease runs out (on the fake clock).
  clock.Advance(options.kv_timeout);
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status().code(),
              AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(h.AllBlocksFree());
}

// Random drops, duplicates, reorders, delays, truncation and corruption of
// KV messages while local requests decode alongside: every remote request
// either yields exactly the single-engine tokens or fails cleanly, and no
// block leaks.
TEST(DecodeFaults, RandomFaultsNeverLeakBlocksOrCorruptTokens) {
  // The leases run on a fake clock, moved past the KV timeout only for a
  // transfer that lost a message: a loaded machine cannot expire a healthy
  // transfer, and which transfers fail depends on the seed alone.
  FakeClock clock(absl::Now());
  DecodeLoopOptions options;
  options.kv_timeout = absl::Seconds(30);
  options.clock = &clock;
  options.receiver.checksums = true;
  options.receiver.chunk_bytes = 1024;
  FaultPlan plan;
  plan.random_probability = 0.01;
  plan.seed = 99;
  plan.random_faults = {Fault{.kind = Fault::Kind::kDrop},
                        Fault{.kind = Fault::Kind::kDuplicate},
                        Fault{.kind = Fault::Kind::kReorder},
                        Fault{.kind = Fault::Kind::kDelayPolls, .polls = 3},
                        Fault{.kind = Fault::Kind::kTruncate, .bytes = 8},
                        Fault{.kind = Fault::Kind::kCorrupt, .bytes = 2}};
  DecodeHarness h(options, plan);
  int succeeded = 0, failed = 0;
  for (int i = 0; i < 12; ++i) {
    // A local neighbour keeps the batch busy while the transfer runs.
    const Request local = LocalRequest(absl::StrCat("l", i), RandomTokens(9, kVocab, 500 + i), 20);
    auto local_sink = std::make_shared<RecordingSink>();
    ASSERT_OK(h.loop().Submit(local, local_sink).status());

    const Request r = RemoteRequest(absl::StrCat("r", i), RandomTokens(20 + 3 * i, kVocab, i), 8);
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_OK(h.loop().Submit(r, sink).status());
    ASSERT_TRUE(sink->WaitReserved());
    const uint64_t stalls_before = h.prefill().stalling_faults();
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<FakePrefill::Sent> sent,
                         h.prefill().Send(r.prompt, sink->descriptor(), -1, {}, 1, {}));
    bool advanced = false;
    absl::StatusOr<std::vector<int32_t>> firsts = h.prefill().Finish(*sent, [&] {
      if (!advanced && h.prefill().stalling_faults() > stalls_before) {
        clock.Advance(options.kv_timeout);
        advanced = true;
      }
    });
    absl::StatusOr<int32_t> first =
        firsts.ok() ? absl::StatusOr<int32_t>((*firsts)[0]) : firsts.status();
    if (first.ok()) {
      StartResult start;
      h.loop().Start(r.request_id, sink->generation(), *first, start.Callback());
      // A reorder may still let the transfer complete; if the clock was
      // moved for it, the Start comes after the lease ran out.
      const absl::Status started = start.Wait();
      if (!advanced) {
        ASSERT_OK(started);
      }
    }
    ASSERT_TRUE(sink->WaitEnded());
    if (sink->status().ok()) {
      ASSERT_TRUE(first.ok()) << "decoded without a complete transfer";
      std::vector<int32_t> got = {*first};
      for (int32_t t : sink->tokens()) got.push_back(t);
      EXPECT_EQ(got, h.Expected(r)) << r.request_id;
      ++succeeded;
    } else {
      EXPECT_TRUE(sink->tokens().empty());
      ++failed;
    }
    ASSERT_TRUE(local_sink->WaitEnded());
    EXPECT_OK(local_sink->status());
    EXPECT_EQ(local_sink->tokens(), h.Expected(local));
  }
  EXPECT_GT(succeeded, 0);
  EXPECT_GT(failed, 0);
  EXPECT_TRUE(h.AllBlocksFree());
}

}  // namespace
}  // namespace tandem::decode
