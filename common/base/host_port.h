// "host:port" as every flag, target and listen address spells it: a host
// name, an IPv4 address or a bracketed IPv6 address ("[::1]:8200"), a
// colon, and a decimal port. The one parser of them all.
#ifndef TANDEM_COMMON_BASE_HOST_PORT_H_
#define TANDEM_COMMON_BASE_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"

namespace tandem {

struct HostPort {
  std::string host;  // Brackets of an IPv6 address removed.
  int port = 0;
};

// Splits `text` at its last colon. INVALID_ARGUMENT, naming `what` (e.g.
// "worker target") and the text, when there is no host, or the port is not
// a number in [min_port, 65535]: listen addresses take port 0 (pick a free
// one), targets do not.
absl::StatusOr<HostPort> ParseHostPort(const std::string& text, const std::string& what,
                                       int min_port = 1);

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_HOST_PORT_H_
