// API keys on gRPC: a client sends "authorization: Bearer <key>" metadata
// with each call; a service checks it first thing.
//
// Which keys are valid is the caller's business (the router keeps SHA-256
// digests of its keys and compares in constant time: router/api_keys.h);
// this only takes the key out of the call's metadata, bounded in size, and
// words the refusal.
#ifndef TANDEM_COMMON_RPC_AUTH_H_
#define TANDEM_COMMON_RPC_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace tandem::rpc {

// The metadata key (gRPC metadata keys are lower case).
inline constexpr std::string_view kAuthorizationMetadata = "authorization";
// Longest authorization value looked at (room for a 4 KiB key and the
// scheme); longer ones are refused unread. gRPC itself refuses metadata over
// 8 KiB with RESOURCE_EXHAUSTED before a service sees it.
inline constexpr size_t kMaxAuthorizationBytes = 4200;

// OK when the call carries exactly one `authorization` entry of the form
// "Bearer <key>" (the scheme's case ignored) and `is_valid_key(key)` holds.
// Otherwise UNAUTHENTICATED saying what was wrong: no key, a malformed
// value, or a key that is not valid (the key itself is never echoed).
absl::Status CheckBearerKey(const grpc::ServerContextBase& context,
                            absl::FunctionRef<bool(std::string_view key)> is_valid_key);

// Makes a call present `key` as "authorization: Bearer <key>".
void AttachBearerKey(grpc::ClientContext& context, std::string_view key);

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_RPC_AUTH_H_
