// A simulated cluster described with deploy/local/cluster.sh's per-role
// flags (tools/sim/cluster_args.h): each modelled flag acts, every other is
// refused with what the simulator models.
#include "tools/sim/cluster_args.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/prefix_routing.h"
#include "tests/testing/status_matchers.h"

namespace tandem::sim {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ClusterArgsTest, DecodeWorkerFlagsAct) {
  SimClusterOptions o;
  ASSERT_OK(ApplyClusterArgs(ArgsRole::kDecode,
                             "--schedule_policy chunked --kv_blocks=300  --noprefix_cache "
                             "--prefill_chunk_tokens 64 --max_sequences=8 --max_batch_tokens 512 "
                             "--kv_watermark_blocks 4 --block_size 32",
                             o));
  EXPECT_EQ(o.decode.schedule_policy, decode::SchedulePolicyKind::kChunked);
  EXPECT_EQ(o.decode.kv_blocks, 300);
  EXPECT_FALSE(o.decode.prefix_cache);
  EXPECT_EQ(o.decode.prefill_chunk_tokens, 64);
  EXPECT_EQ(o.decode.max_sequences, 8);
  EXPECT_EQ(o.decode.max_batch_tokens, 512);
  EXPECT_EQ(o.decode.kv_watermark_blocks, 4);
  EXPECT_EQ(o.decode.block_size, 32);
  // The prefill workers' options are untouched.
  EXPECT_EQ(o.prefill.kv_blocks, 0);
  EXPECT_TRUE(o.prefill.prefix_cache);
}

TEST(ClusterArgsTest, PrefillWorkerFlagsAct) {
  SimClusterOptions o;
  ASSERT_OK(ApplyClusterArgs(
      ArgsRole::kPrefill, "--max_queue 5 --kv_blocks 40 --prefix_cache=false --prefix_cache", o));
  EXPECT_EQ(o.prefill.max_queue, 5);
  EXPECT_EQ(o.prefill.kv_blocks, 40);
  EXPECT_TRUE(o.prefill.prefix_cache);  // Later flags win.
  EXPECT_THAT(
      ApplyClusterArgs(ArgsRole::kPrefill, "--schedule_policy chunked", o),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("prefill worker's --schedule_policy"), HasSubstr("--max_queue"))));
}

TEST(ClusterArgsTest, RouterFlagsAct) {
  SimClusterOptions o;
  ASSERT_OK(ApplyClusterArgs(ArgsRole::kRouter,
                             "--prefix_routing_load_tokens 64 --routing_policy prefix "
                             "--local_prefill_tokens 32 --health_interval 250ms --max_inflight 9 "
                             "--max_queued 3 --queue_timeout 5s",
                             o));
  ASSERT_NE(o.router.driver.prefix_router, nullptr);
  EXPECT_EQ(o.router.driver.prefix_router->options().load_tokens, 64);
  EXPECT_EQ(o.router.driver.local_prefill_tokens, 32);
  EXPECT_EQ(o.poll_interval, absl::Milliseconds(250));
  EXPECT_EQ(o.router.max_inflight, 9);
  EXPECT_EQ(o.router.max_queued, 3);
  EXPECT_EQ(o.router.queue_timeout, absl::Seconds(5));
  ASSERT_OK(ApplyClusterArgs(ArgsRole::kRouter, "--prefix_routing_load_tokens=16", o));
  EXPECT_EQ(o.router.driver.prefix_router->options().load_tokens, 16);
  ASSERT_OK(ApplyClusterArgs(ArgsRole::kRouter, "--routing_policy=load", o));
  EXPECT_EQ(o.router.driver.prefix_router, nullptr);
}

TEST(ClusterArgsTest, WhatIsNotModelledOrMalformedIsRefused) {
  SimClusterOptions o;
  EXPECT_THAT(ApplyClusterArgs(ArgsRole::kDecode, "--threads 2", o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("does not model the decode worker's --threads"),
                             HasSubstr("--kv_blocks"))));
  EXPECT_THAT(ApplyClusterArgs(ArgsRole::kDecode, "--kv_blocks many", o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--kv_blocks=many")));
  EXPECT_THAT(ApplyClusterArgs(ArgsRole::kDecode, "--kv_blocks -1", o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("give 0 or more")));
  EXPECT_THAT(ApplyClusterArgs(ArgsRole::kDecode, "kv_blocks 3", o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("where a --flag belongs")));
  EXPECT_THAT(ApplyClusterArgs(ArgsRole::kDecode, "--max_sequences", o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs a value")));
  EXPECT_THAT(ApplyClusterArgs(ArgsRole::kDecode, "--schedule_policy fastest", o),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ApplyClusterArgs(ArgsRole::kDecode, "--nomax_sequences", o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--nomax_sequences")));
  EXPECT_THAT(ApplyClusterArgs(ArgsRole::kRouter, "--health_interval 0s", o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positive")));
  EXPECT_THAT(ApplyClusterArgs(ArgsRole::kRouter, "--routing_policy random", o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prefix or load")));
}

}  // namespace
}  // namespace tandem::sim
