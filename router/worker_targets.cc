#include "router/worker_targets.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/base/host_port.h"

namespace tandem::router {
namespace {

absl::StatusOr<HostPort> SplitTarget(const std::string& target) {
  return ParseHostPort(target, "worker target");
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveTarget(const std::string& target) {
  absl::StatusOr<HostPort> hp = SplitTarget(target);
  if (!hp.ok()) return hp.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(hp->host.c_str(), std::to_string(hp->port).c_str(), &hints, &result);
  if (rc != 0) {
    const std::string why = gai_strerror(rc);
    if (rc == EAI_NONAME) {
      return absl::NotFoundError(absl::StrCat("cannot resolve '", target, "': ", why));
    }
    return absl::UnavailableError(absl::StrCat("cannot resolve '", target, "': ", why));
  }
  std::set<std::string> addresses;
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    char ip[INET6_ADDRSTRLEN] = {};
    if (ai->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr, ip, sizeof(ip));
      addresses.insert(absl::StrCat(ip, ":", hp->port));
    } else if (ai->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, ip, sizeof(ip));
      addresses.insert(absl::StrCat("[", ip, "]:", hp->port));
    }
  }
  freeaddrinfo(result);
  if (addresses.empty()) {
    return absl::NotFoundError(absl::StrCat("'", target, "' resolved to no IP address"));
  }
  return std::vector<std::string>(addresses.begin(), addresses.end());
}

absl::StatusOr<std::vector<std::string>> ReadTargetFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    const std::string why =
        absl::StrCat("cannot open worker target file ", path, ": ", std::strerror(error));
    return error == ENOENT ? absl::NotFoundError(why) : absl::FailedPreconditionError(why);
  }
  std::string text;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("cannot read worker target file ", path, ": ", std::strerror(error)));
    }
    text.append(buffer, static_cast<size_t>(n));
    if (static_cast<int64_t>(text.size()) > kMaxTargetFileBytes) {
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat("worker target file ", path, " is over ",
                                                     kMaxTargetFileBytes, " bytes; list at most ",
                                                     kMaxTargetFileTargets, " host:port targets"));
    }
  }
  close(fd);
  std::vector<std::string> targets;
  std::set<std::string> seen;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::string target(line);
    if (IsFileTarget(target)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " line ", line_number,
                       ": a worker target file lists host:port targets, not "
                       "other files"));
    }
    if (absl::StatusOr<HostPort> hp = SplitTarget(target); !hp.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " line ", line_number, ": ", hp.status().message()));
    }
    if (!seen.insert(target).second) continue;
    if (static_cast<int>(targets.size()) == kMaxTargetFileTargets) {
      return absl::InvalidArgumentError(absl::StrCat("worker target file ", path,
                                                     " lists more than ", kMaxTargetFileTargets,
                                                     " targets; list fewer"));
    }
    targets.push_back(std::move(target));
  }
  return targets;
}

bool IsFileTarget(const std::string& target) { return absl::StartsWith(target, kFileTargetPrefix); }

}  // namespace tandem::router
