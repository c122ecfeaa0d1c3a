// API keys in gRPC metadata, checked by a real in-process service.
#include "common/rpc/auth.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/testing/status_matchers.h"

namespace tandem::rpc {
namespace {

using ::tandem::testing::IsOk;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// GetStats answers with the verdict of CheckBearerKey on the call.
class KeyedService final : public v1::PrefillWorker::CallbackService {
 public:
  explicit KeyedService(std::vector<std::string> keys) : keys_(std::move(keys)) {}

  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context, const v1::StatsRequest*,
                                     v1::WorkerStats*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpc(CheckBearerKey(*context, [this](std::string_view key) {
      for (const std::string& k : keys_) {
        if (k == key) return true;
      }
      return false;
    })));
    return reactor;
  }

 private:
  const std::vector<std::string> keys_;
};

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto running = StartServer(ServerOptions{}, {&service_});
    ASSERT_TRUE(running.ok()) << running.status();
    server_ = std::move(running).value();
    stub_ = v1::PrefillWorker::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", server_.port)));
  }
  void TearDown() override { server_.server->Shutdown(ToChrono(absl::Now() + absl::Seconds(5))); }

  // GetStats with `authorization` metadata entries `values`.
  absl::Status Call(const std::vector<std::string>& values) {
    grpc::ClientContext ctx;
    ctx.set_deadline(ToChrono(absl::Now() + absl::Seconds(10)));
    for (const std::string& v : values) ctx.AddMetadata("authorization", v);
    v1::WorkerStats stats;
    return FromGrpc(stub_->GetStats(&ctx, v1::StatsRequest(), &stats));
  }

  KeyedService service_{{"key-one", "key-two"}};
  RunningServer server_;
  std::unique_ptr<v1::PrefillWorker::Stub> stub_;
};

TEST_F(AuthTest, RightKeyIsLetIn) {
  EXPECT_THAT(Call({"Bearer key-two"}), IsOk());
  // The scheme's case does not matter (RFC 7235).
  EXPECT_THAT(Call({"bearer key-one"}), IsOk());
}

TEST_F(AuthTest, AttachBearerKeyMakesTheMetadataTheServiceExpects) {
  grpc::ClientContext ctx;
  ctx.set_deadline(ToChrono(absl::Now() + absl::Seconds(10)));
  AttachBearerKey(ctx, "key-one");
  v1::WorkerStats stats;
  EXPECT_THAT(FromGrpc(stub_->GetStats(&ctx, v1::StatsRequest(), &stats)), IsOk());
}

TEST_F(AuthTest, MissingKeyIsUnauthenticated) {
  EXPECT_THAT(Call({}), StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("missing API key")));
}

TEST_F(AuthTest, WrongKeyIsUnauthenticatedWithoutEchoingIt) {
  const absl::Status s = Call({"Bearer key-three"});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("invalid API key")));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("key-three")));
  // A prefix of a valid key is not that key.
  EXPECT_THAT(Call({"Bearer key-on"}), StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST_F(AuthTest, OtherSchemesAndEmptyKeysAreRefused) {
  EXPECT_THAT(Call({"Basic key-one"}),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("not \"Bearer <key>\"")));
  EXPECT_THAT(Call({"key-one"}), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(Call({"Bearer "}), StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST_F(AuthTest, TwoAuthorizationEntriesAreRefused) {
  EXPECT_THAT(Call({"Bearer key-one", "Bearer key-two"}),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("more than one")));
}

TEST_F(AuthTest, OverlongValueIsRefusedUnread) {
  EXPECT_THAT(Call({"Bearer " + std::string(kMaxAuthorizationBytes, 'k')}),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("bytes")));
}

}  // namespace
}  // namespace tandem::rpc
