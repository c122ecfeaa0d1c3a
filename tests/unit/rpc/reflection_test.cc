// grpc.reflection.v1 on every server StartServer builds: the services, the
// files that define a symbol (with their imports), and errors for what is
// not there, through a real in-process server.
#include <google/protobuf/descriptor.pb.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/reflection_v1.h"
#include "common/rpc/server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::rpc {
namespace {

using grpc::reflection::v1::ServerReflection;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;
using ::testing::IsSupersetOf;

class ReflectionV1Test : public ::testing::Test {
 protected:
  void SetUp() override {
    auto running = StartServer(ServerOptions{}, {&prefill_, &decode_});
    ASSERT_TRUE(running.ok()) << running.status();
    server_ = std::move(running).value();
    stub_ = ServerReflection::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", server_.port)));
  }
  void TearDown() override { server_.server->Shutdown(ToChrono(absl::Now() + absl::Seconds(5))); }

  // The answers to `requests`, sent on one stream.
  std::vector<ServerReflectionResponse> Ask(const std::vector<ServerReflectionRequest>& requests) {
    grpc::ClientContext ctx;
    ctx.set_deadline(ToChrono(absl::Now() + absl::Seconds(30)));
    auto stream = stub_->ServerReflectionInfo(&ctx);
    std::vector<ServerReflectionResponse> out;
    for (const ServerReflectionRequest& r : requests) {
      EXPECT_TRUE(stream->Write(r));
      ServerReflectionResponse response;
      EXPECT_TRUE(stream->Read(&response));
      out.push_back(response);
    }
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return out;
  }

  v1::PrefillWorker::CallbackService prefill_;
  v1::DecodeWorker::CallbackService decode_;
  RunningServer server_;
  std::unique_ptr<ServerReflection::Stub> stub_;
};

TEST_F(ReflectionV1Test, ListsTheServicesAndFindsTheFilesThatDefineThem) {
  ServerReflectionRequest list;
  list.set_list_services("*");
  ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("tandem.v1.DecodeWorker.Generate");
  ServerReflectionRequest missing;
  missing.set_file_containing_symbol("tandem.v1.NoSuchService");
  ServerReflectionRequest by_name;
  by_name.set_file_by_filename("tandem/v1/worker.proto");
  ServerReflectionRequest nothing;
  const std::vector<ServerReflectionResponse> r = Ask({list, symbol, missing, by_name, nothing});
  ASSERT_EQ(r.size(), 5u);

  std::vector<std::string> names;
  for (const auto& s : r[0].list_services_response().service()) names.push_back(s.name());
  EXPECT_THAT(names, IsSupersetOf({"tandem.v1.PrefillWorker", "tandem.v1.DecodeWorker",
                                   "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                                   "grpc.reflection.v1alpha.ServerReflection"}));
  EXPECT_EQ(r[0].original_request().list_services(), "*");

  // The defining file first, then every file it imports.
  const auto& files = r[1].file_descriptor_response().file_descriptor_proto();
  ASSERT_GE(files.size(), 1);
  std::vector<google::protobuf::FileDescriptorProto> protos(files.size());
  std::vector<std::string> file_names;
  for (int i = 0; i < files.size(); ++i) {
    ASSERT_TRUE(protos[i].ParseFromString(files[i]));
    file_names.push_back(protos[i].name());
  }
  EXPECT_EQ(file_names[0], "tandem/v1/worker.proto");
  bool has_service = false;
  for (const auto& s : protos[0].service()) has_service |= s.name() == "DecodeWorker";
  EXPECT_TRUE(has_service);
  EXPECT_THAT(file_names, IsSupersetOf(std::vector<std::string>(protos[0].dependency().begin(),
                                                                protos[0].dependency().end())));

  EXPECT_EQ(r[2].error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(r[3].file_descriptor_response().file_descriptor_proto_size(), files.size());
  EXPECT_EQ(r[4].error_response().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace tandem::rpc
