// Telling a supervisor (a test, a script) which port a server bound, when it
// was asked for port 0.
#ifndef TANDEM_COMMON_BASE_PORT_FILE_H_
#define TANDEM_COMMON_BASE_PORT_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace tandem {

// Writes `port` and a newline to `path`, whole: the line goes to a temporary
// file renamed into place, so a reader that polls for the file never sees
// half of it. INVALID_ARGUMENT naming `flag` (the flag that gave the path)
// when it cannot be written.
absl::Status WritePortFile(const std::string& path, int port, const std::string& flag);

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_PORT_FILE_H_
