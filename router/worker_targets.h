// Worker targets: "host:port" names resolved to worker addresses, and
// "file:PATH" targets, files that list such names (see ReadTargetFile).
// Stateless functions; thread-safe.
#ifndef TANDEM_ROUTER_WORKER_TARGETS_H_
#define TANDEM_ROUTER_WORKER_TARGETS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::router {

// Resolves "host:port" to the worker addresses ("ip:port", "[ipv6]:port").
using Resolver = std::function<absl::StatusOr<std::vector<std::string>>(const std::string&)>;

// getaddrinfo over IPv4 and IPv6, duplicates removed, sorted. NOT_FOUND /
// UNAVAILABLE naming the target when the name does not resolve;
// INVALID_ARGUMENT when the target is not host:port.
absl::StatusOr<std::vector<std::string>> ResolveTarget(const std::string& target);

// Worker target files ("file:PATH" targets) are bounded: a larger file is
// refused as a whole.
inline constexpr int64_t kMaxTargetFileBytes = 1 << 20;
inline constexpr int kMaxTargetFileTargets = 4096;

// The targets of a worker target file: one host:port per line (names
// resolve as any target's), surrounding blanks ignored, blank lines and
// '#' comments skipped, duplicates dropped (first kept). NOT_FOUND or
// FAILED_PRECONDITION when it cannot be read, INVALID_ARGUMENT naming the
// line of a malformed target or when it is over the bounds above.
absl::StatusOr<std::vector<std::string>> ReadTargetFile(const std::string& path);

// What a file target starts with.
inline constexpr absl::string_view kFileTargetPrefix = "file:";
bool IsFileTarget(const std::string& target);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_WORKER_TARGETS_H_
