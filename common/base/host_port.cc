#include "common/base/host_port.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<HostPort> ParseHostPort(const std::string& text, const std::string& what,
                                       int min_port) {
  const size_t colon = text.rfind(':');
  HostPort out;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(text.substr(colon + 1), &out.port) || out.port < min_port ||
      out.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", text, "' is not host:port with a port in ", min_port, "..65535",
        min_port == 0 ? " (0 picks a free one)" : "", "; e.g. 10.0.0.5:8200 or [::1]:8200"));
  }
  out.host = text.substr(0, colon);
  if (out.host.size() >= 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  return out;
}

}  // namespace tandem
