// Conversions between absl::Status (inside tandem) and grpc::Status (on the
// wire). Codes map one to one; messages pass through unchanged.
#ifndef TANDEM_COMMON_RPC_GRPC_STATUS_H_
#define TANDEM_COMMON_RPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tandem::rpc {

grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status);

// The gRPC deadline type for an absl::Time (InfiniteFuture: none).
std::chrono::system_clock::time_point ToChrono(absl::Time t);

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_RPC_GRPC_STATUS_H_
