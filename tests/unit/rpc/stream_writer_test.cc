#include "common/rpc/stream_writer.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "gtest/gtest.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::rpc {
namespace {

using v1::GenerateRequest;
using v1::GenerateResponse;

// A Router whose Generate streams max_tokens messages from a thread of its
// own, the way a decode loop feeds a stream. A prompt text of "hold" makes
// it keep writing until the client goes away.
class ThreadedStreamer final : public v1::Router::CallbackService {
 public:
  ~ThreadedStreamer() override {
    for (std::thread& t : threads_) t.join();
  }

  grpc::ServerWriteReactor<GenerateResponse>* Generate(grpc::CallbackServerContext*,
                                                       const GenerateRequest* request) override {
    auto [reactor, writer] = StreamWriter<GenerateResponse>::Create();
    writer->OnCancel([this] { cancelled_.Notify(); });
    const int n = request->max_tokens();
    const bool hold = request->text() == "hold";
    threads_.emplace_back([writer = writer, n, hold, this] {
      for (int i = 0; hold || i < n; ++i) {
        GenerateResponse response;
        response.add_token_ids(i);
        if (!writer->Write(std::move(response))) {
          write_refused_.Notify();
          return;
        }
        if (hold) absl::SleepFor(absl::Milliseconds(1));
      }
      writer->Finish(grpc::Status::OK);
    });
    return reactor;
  }

  absl::Notification cancelled_;
  absl::Notification write_refused_;

 private:
  std::vector<std::thread> threads_;
};

class StreamWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto running = StartServer(ServerOptions{}, {&service_});
    ASSERT_TRUE(running.ok()) << running.status();
    server_ = std::move(running).value();
    stub_ = v1::Router::NewStub(MakeChannel("127.0.0.1:" + std::to_string(server_.port)));
  }
  void TearDown() override { server_.server->Shutdown(ToChrono(absl::Now() + absl::Seconds(5))); }

  ThreadedStreamer service_;
  RunningServer server_;
  std::unique_ptr<v1::Router::Stub> stub_;
};

TEST_F(StreamWriterTest, DeliversEveryMessageInOrderThenTheStatus) {
  grpc::ClientContext ctx;
  ctx.set_deadline(ToChrono(absl::Now() + absl::Seconds(20)));
  GenerateRequest request;
  request.set_max_tokens(2000);
  auto reader = stub_->Generate(&ctx, request);
  GenerateResponse response;
  int expected = 0;
  while (reader->Read(&response)) {
    ASSERT_EQ(response.token_ids_size(), 1);
    EXPECT_EQ(response.token_ids(0), expected++);
  }
  EXPECT_EQ(expected, 2000);
  EXPECT_TRUE(reader->Finish().ok());
}

TEST_F(StreamWriterTest, ClientCancelRunsOnCancelAndRefusesFurtherWrites) {
  grpc::ClientContext ctx;
  ctx.set_deadline(ToChrono(absl::Now() + absl::Seconds(20)));
  GenerateRequest request;
  request.set_text("hold");
  auto reader = stub_->Generate(&ctx, request);
  GenerateResponse response;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(reader->Read(&response));
  ctx.TryCancel();
  EXPECT_TRUE(service_.cancelled_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(service_.write_refused_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST(GrpcStatus, CodesAndMessagesSurviveTheRoundTrip) {
  const absl::Status status = absl::ResourceExhaustedError("3 of 4 blocks in use");
  const grpc::Status wire = ToGrpc(status);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(wire.error_message(), "3 of 4 blocks in use");
  EXPECT_EQ(FromGrpc(wire), status);
  EXPECT_TRUE(ToGrpc(absl::OkStatus()).ok());
}

TEST(StartServer, AnAddressInUseIsAClearError) {
  ThreadedStreamer a, b;
  auto first = StartServer(ServerOptions{}, {&a});
  ASSERT_TRUE(first.ok());
  auto second =
      StartServer(ServerOptions{.address = "127.0.0.1:" + std::to_string(first->port)}, {&b});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("--listen"), std::string::npos);
  first->server->Shutdown();
}

}  // namespace
}  // namespace tandem::rpc
