#include "router/routing_policy.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;

WorkerSnapshot Decode(std::string address, int free_blocks, int running = 0) {
  WorkerSnapshot s;
  s.address = std::move(address);
  s.role = WorkerRole::kDecode;
  s.healthy = true;
  s.block_size = 16;
  s.kv_blocks_total = 100;
  s.kv_blocks_free = free_blocks;
  s.running = running;
  return s;
}

WorkerSnapshot Prefill(std::string address, int waiting, int inflight = 0) {
  WorkerSnapshot s;
  s.address = std::move(address);
  s.role = WorkerRole::kPrefill;
  s.healthy = true;
  s.waiting = waiting;
  s.inflight = inflight;
  return s;
}

TEST(BlocksFor, RoundsUp) {  // tandem::BlocksFor, which every component uses.
  EXPECT_EQ(BlocksFor(0, 16), 0);
  EXPECT_EQ(BlocksFor(1, 16), 1);
  EXPECT_EQ(BlocksFor(16, 16), 1);
  EXPECT_EQ(BlocksFor(17, 16), 2);
  EXPECT_EQ(BlocksFor(5, 0), 5);
}

TEST(PickDecodeWorker, NoneRoutableIsNullopt) {
  std::vector<WorkerSnapshot> w = {Decode("a", 50), Decode("b", 50)};
  w[0].healthy = false;
  w[1].draining = true;
  EXPECT_FALSE(PickDecodeWorker(w, 10, 10).has_value());
  EXPECT_FALSE(PickDecodeWorker({}, 10, 10).has_value());
}

TEST(PickDecodeWorker, LighterRunningBatchWinsAmongWorkersWithRoom) {
  const std::vector<WorkerSnapshot> w = {Decode("a", 90, 8), Decode("b", 20, 2)};
  const auto pick = PickDecodeWorker(w, 100, 100);  // 13 blocks
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(pick->address, "b");
  EXPECT_THAT(pick->reason, HasSubstr("b"));
}

TEST(PickDecodeWorker, MoreFreeBlocksBreakTiesOfLoad) {
  const std::vector<WorkerSnapshot> w = {Decode("a", 30, 2), Decode("b", 60, 2)};
  EXPECT_EQ(PickDecodeWorker(w, 10, 10)->address, "b");
}

TEST(PickDecodeWorker, AWorkerWithoutRoomLosesToOneWithRoom) {
  // "a" is idle but cannot hold 40 blocks.
  const std::vector<WorkerSnapshot> w = {Decode("a", 10, 0), Decode("b", 60, 5)};
  EXPECT_EQ(PickDecodeWorker(w, 320, 320)->address, "b");
}

TEST(PickDecodeWorker, RouterReservationsCountAgainstFreeBlocks) {
  std::vector<WorkerSnapshot> w = {Decode("a", 50, 1), Decode("b", 40, 1)};
  EXPECT_EQ(PickDecodeWorker(w, 8, 8)->address, "a");
  // The router just reserved 20 blocks on "a"; the stats do not show them yet.
  w[0].reserved_blocks = 20;
  EXPECT_EQ(PickDecodeWorker(w, 8, 8)->address, "b");
  // A sequence of 45 blocks fits on neither now: the most free blocks wins.
  const auto pick = PickDecodeWorker(w, 360, 360);
  EXPECT_EQ(pick->address, "b");
  EXPECT_THAT(pick->reason, HasSubstr("no worker has room"));
}

TEST(PickDecodeWorker, RouterInFlightCountsWhenStatsLag) {
  std::vector<WorkerSnapshot> w = {Decode("a", 50, 0), Decode("b", 50, 1)};
  w[0].inflight = 3;  // Sent by this router since the last poll.
  EXPECT_EQ(PickDecodeWorker(w, 8, 8)->address, "b");
}

TEST(PickDecodeWorker, ExcludedWorkersAreSkipped) {
  const std::vector<WorkerSnapshot> w = {Decode("a", 90), Decode("b", 10)};
  EXPECT_EQ(PickDecodeWorker(w, 8, 8, {"a"})->address, "b");
  EXPECT_FALSE(PickDecodeWorker(w, 8, 8, {"a", "b"}).has_value());
}

TEST(PickDecodeWorker, EqualWorkersGiveTheSameAnswer) {
  const std::vector<WorkerSnapshot> w = {Decode("b", 50), Decode("a", 50)};
  EXPECT_EQ(PickDecodeWorker(w, 8, 8)->address, "a");
}

TEST(PickPrefillWorker, ShortestQueueCountingRouterInFlight) {
  std::vector<WorkerSnapshot> w = {Prefill("a", 3), Prefill("b", 1, 0), Prefill("c", 0, 2)};
  EXPECT_EQ(PickPrefillWorker(w, {})->address, "b");
  w[1].inflight = 4;
  EXPECT_EQ(PickPrefillWorker(w, {})->address, "c");
}

TEST(PickPrefillWorker, ExcludesTheWorkerThatFailedAndUnroutableOnes) {
  std::vector<WorkerSnapshot> w = {Prefill("a", 0), Prefill("b", 5), Prefill("c", 0)};
  w[2].healthy = false;
  EXPECT_EQ(PickPrefillWorker(w, {"a"})->address, "b");
  EXPECT_FALSE(PickPrefillWorker(w, {"a", "b"}).has_value());
}

TEST(DecidePrefill, ColocatedWhenThereAreNoPrefillWorkers) {
  const PrefillDecision d = DecidePrefill({}, 100, 0);
  EXPECT_TRUE(d.local);
  EXPECT_THAT(d.reason, HasSubstr("colocated"));
}

TEST(DecidePrefill, LocalWhenNoPrefillWorkerIsRoutable) {
  std::vector<WorkerSnapshot> w = {Prefill("a", 0), Prefill("b", 0)};
  w[0].healthy = false;
  w[1].draining = true;
  const PrefillDecision d = DecidePrefill(w, 100, 0);
  EXPECT_TRUE(d.local);
  EXPECT_THAT(d.reason, HasSubstr("healthy"));
}

TEST(DecidePrefill, ShortPromptsStayLocal) {
  const std::vector<WorkerSnapshot> w = {Prefill("a", 0)};
  EXPECT_TRUE(DecidePrefill(w, 8, 8).local);
  EXPECT_FALSE(DecidePrefill(w, 8, 8).burst);
  EXPECT_THAT(DecidePrefill(w, 8, 8).reason, HasSubstr("--local_prefill_tokens"));
  EXPECT_FALSE(DecidePrefill(w, 9, 8).local);
  // Default 0: always disaggregate when a prefill worker is there.
  EXPECT_FALSE(DecidePrefill(w, 1, 0).local);
  EXPECT_THAT(DecidePrefill(w, 1, 0).reason, HasSubstr("disaggregated"));
}

// Decode workers absorb a burst: when every routable prefill worker holds
// burst_queue prompts or more (queued or on their way), a prompt prefills
// on a decode worker, if one has nothing waiting.
TEST(DecidePrefill, ABurstGoesToADecodeWorkerWithRoom) {
  std::vector<WorkerSnapshot> prefill = {Prefill("p1", 3, 1), Prefill("p2", 4)};
  std::vector<WorkerSnapshot> decode = {Decode("d1", 100), Decode("d2", 100)};
  decode[0].waiting = 2;
  PrefillDecision d = DecidePrefill(prefill, 100, 0, 4, decode);
  EXPECT_TRUE(d.local);
  EXPECT_TRUE(d.burst);  // counted for the planner
  EXPECT_THAT(d.reason, HasSubstr("burst"));
  EXPECT_THAT(d.reason, HasSubstr("decode d2"));
  // One prefill worker with room: disaggregated as usual.
  prefill[1].waiting = 3;
  EXPECT_FALSE(DecidePrefill(prefill, 100, 0, 4, decode).local);
  // Unroutable prefill workers do not count toward the burst.
  prefill[1].healthy = false;
  EXPECT_TRUE(DecidePrefill(prefill, 100, 0, 4, decode).local);
  // No decode worker with room, or the rule off: disaggregated.
  decode[1].waiting = 1;
  EXPECT_FALSE(DecidePrefill(prefill, 100, 0, 4, decode).local);
  decode[1].waiting = 0;
  EXPECT_FALSE(DecidePrefill(prefill, 100, 0, 0, decode).local);
}

}  // namespace
}  // namespace tandem::router
