// grpc.health.v1 by service name, through a real in-process server.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/testing/health_client.h"
#include "tests/testing/status_matchers.h"

namespace tandem::rpc {
namespace {

using ::tandem::testing::CheckHealth;
using ::tandem::testing::IsOkAndHolds;
using ::tandem::testing::ServingStatus;
using ::tandem::testing::StatusIs;
using ::testing::ElementsAre;

class HealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto running = StartServer(ServerOptions{}, {&prefill_, &decode_});
    ASSERT_TRUE(running.ok()) << running.status();
    server_ = std::move(running).value();
    channel_ = MakeChannel(absl::StrCat("127.0.0.1:", server_.port));
  }
  void TearDown() override { server_.server->Shutdown(ToChrono(absl::Now() + absl::Seconds(5))); }

  absl::StatusOr<ServingStatus> Health(const std::string& service) {
    return CheckHealth(channel_, service);
  }

  v1::PrefillWorker::CallbackService prefill_;
  v1::DecodeWorker::CallbackService decode_;
  RunningServer server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(HealthTest, TheServerAndEachServiceReportServingOnceStarted) {
  EXPECT_THAT(server_.services, ElementsAre("tandem.v1.PrefillWorker", "tandem.v1.DecodeWorker"));
  EXPECT_THAT(Health(""), IsOkAndHolds(ServingStatus::kServing));
  EXPECT_THAT(Health("tandem.v1.PrefillWorker"), IsOkAndHolds(ServingStatus::kServing));
  EXPECT_THAT(Health("tandem.v1.DecodeWorker"), IsOkAndHolds(ServingStatus::kServing));
  EXPECT_THAT(Health("tandem.v1.Router"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(HealthTest, OneServiceChangesAlone) {
  server_.SetServing("tandem.v1.DecodeWorker", false);
  EXPECT_THAT(Health("tandem.v1.DecodeWorker"), IsOkAndHolds(ServingStatus::kNotServing));
  EXPECT_THAT(Health("tandem.v1.PrefillWorker"), IsOkAndHolds(ServingStatus::kServing));
  EXPECT_THAT(Health(""), IsOkAndHolds(ServingStatus::kServing));
  server_.SetServing("tandem.v1.DecodeWorker", true);
  EXPECT_THAT(Health("tandem.v1.DecodeWorker"), IsOkAndHolds(ServingStatus::kServing));
}

TEST_F(HealthTest, AServiceNotRegisteredCanBeReported) {
  server_.SetServing("tandem.v1.Router", false);
  EXPECT_THAT(Health("tandem.v1.Router"), IsOkAndHolds(ServingStatus::kNotServing));
  server_.SetServing("tandem.v1.Router", true);
  EXPECT_THAT(Health("tandem.v1.Router"), IsOkAndHolds(ServingStatus::kServing));
}

TEST_F(HealthTest, DrainingTurnsEveryServiceNotServing) {
  server_.SetServing(false);
  EXPECT_THAT(Health(""), IsOkAndHolds(ServingStatus::kNotServing));
  EXPECT_THAT(Health("tandem.v1.PrefillWorker"), IsOkAndHolds(ServingStatus::kNotServing));
  EXPECT_THAT(Health("tandem.v1.DecodeWorker"), IsOkAndHolds(ServingStatus::kNotServing));
}

}  // namespace
}  // namespace tandem::rpc
