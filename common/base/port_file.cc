#include "common/base/port_file.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status WritePortFile(const std::string& path, int port, const std::string& flag) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  out << port << "\n";
  out.close();
  if (!out.good() || std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write --", flag, " ", path,
                                                   ": check the folder exists and is writable"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
