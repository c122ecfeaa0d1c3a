#include "common/rpc/grpc_status.h"

#include <string>

namespace tandem::rpc {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

std::chrono::system_clock::time_point ToChrono(absl::Time t) {
  if (t == absl::InfiniteFuture()) return std::chrono::system_clock::time_point::max();
  return absl::ToChronoTime(t);
}

}  // namespace tandem::rpc
