#include "tests/testing/health_client.h"

#include <grpcpp/generic/generic_stub.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/grpc_status.h"

namespace tandem::testing {

absl::StatusOr<ServingStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                          const std::string& service, absl::Duration timeout) {
  if (service.size() > 127) return absl::InvalidArgumentError("service name over 127 bytes");
  // HealthCheckRequest: field 1 (service), length-delimited.
  std::string request_bytes;
  if (!service.empty()) {
    request_bytes = absl::StrCat(std::string(1, '\x0a'),
                                 std::string(1, static_cast<char>(service.size())), service);
  }
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  ctx.set_deadline(rpc::ToChrono(absl::Now() + timeout));
  grpc::GenericStub stub(channel);
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return rpc::FromGrpc(status);
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("unreadable health response");
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse: field 1 (status), varint; absent = UNKNOWN.
  if (bytes.empty()) return ServingStatus::kUnknown;
  if (bytes.size() != 2 || bytes[0] != '\x08' || bytes[1] < 0 || bytes[1] > 3) {
    return absl::InternalError(
        absl::StrCat("unexpected health response of ", bytes.size(), " bytes"));
  }
  return static_cast<ServingStatus>(bytes[1]);
}

}  // namespace tandem::testing
