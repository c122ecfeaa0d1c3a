// The API keys clients present as "Authorization: Bearer <key>" (HTTP) or
// in the `authorization` metadata (gRPC). Keys come from a list (--api_key)
// and/or a file of one key per line ('#' starts a comment line; blank lines
// and surrounding spaces are skipped).
//
// Only SHA-256 digests of the keys are kept, and a presented key is compared
// with every one of them in constant time, so neither the time taken nor a
// key's length tells a client how close its guess was.
//
// Immutable after construction; thread-safe.
#ifndef TANDEM_ROUTER_API_KEYS_H_
#define TANDEM_ROUTER_API_KEYS_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::router {

// Longest key accepted from a client or a configuration.
inline constexpr size_t kMaxApiKeyBytes = 4096;

class ApiKeys {
 public:
  // No keys: every request is let in.
  ApiKeys() = default;

  // INVALID_ARGUMENT for an empty key, a key with spaces or control
  // characters, or one over kMaxApiKeyBytes (naming the file and line);
  // NOT_FOUND when `file` cannot be read. `file` "" reads none.
  static absl::StatusOr<ApiKeys> Create(const std::vector<std::string>& keys,
                                        const std::string& file);

  // False when no key is configured (then nothing is checked).
  bool enabled() const { return !digests_.empty(); }
  size_t size() const { return digests_.size(); }

  // Whether `key` is one of the keys.
  bool Check(absl::string_view key) const;
  // Whether an Authorization header value is "Bearer <one of the keys>"
  // (the scheme's case is ignored, as RFC 7235 says).
  bool CheckAuthorization(absl::string_view header) const;

 private:
  using Digest = std::array<uint8_t, 32>;
  static Digest Sha256(absl::string_view data);
  absl::Status Add(absl::string_view key, absl::string_view where);

  std::vector<Digest> digests_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_API_KEYS_H_
