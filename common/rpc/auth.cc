#include "common/rpc/auth.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem::rpc {
namespace {

// Debian's Abseil has its own string_view.
constexpr absl::string_view kScheme = "Bearer ";

absl::Status Refuse(absl::string_view why) {
  return absl::UnauthenticatedError(
      absl::StrCat(why, "; send the API key as gRPC metadata \"authorization: Bearer <key>\""));
}

}  // namespace

absl::Status CheckBearerKey(const grpc::ServerContextBase& context,
                            absl::FunctionRef<bool(std::string_view key)> is_valid_key) {
  const auto& metadata = context.client_metadata();
  const auto [first, last] = metadata.equal_range(
      grpc::string_ref(kAuthorizationMetadata.data(), kAuthorizationMetadata.size()));
  if (first == last) return Refuse("missing API key");
  if (std::next(first) != last) return Refuse("more than one authorization entry");
  const absl::string_view value(first->second.data(), first->second.size());
  if (value.size() > kMaxAuthorizationBytes) {
    return Refuse(
        absl::StrCat("the authorization value is over ", kMaxAuthorizationBytes, " bytes"));
  }
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return Refuse("the authorization value is not \"Bearer <key>\"");
  }
  const absl::string_view key = absl::StripLeadingAsciiWhitespace(value.substr(kScheme.size()));
  if (key.empty()) return Refuse("the authorization value is not \"Bearer <key>\"");
  if (!is_valid_key(std::string_view(key.data(), key.size()))) return Refuse("invalid API key");
  return absl::OkStatus();
}

void AttachBearerKey(grpc::ClientContext& context, std::string_view key) {
  context.AddMetadata(std::string(kAuthorizationMetadata),
                      absl::StrCat(kScheme, absl::string_view(key.data(), key.size())));
}

}  // namespace tandem::rpc
