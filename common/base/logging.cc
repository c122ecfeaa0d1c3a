#include "common/base/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem {
namespace {

std::atomic<int> g_min_severity{static_cast<int>(LogSeverity::kInfo)};

const char* SeverityLetter(LogSeverity s) {
  switch (s) {
    case LogSeverity::kInfo:
      return "I";
    case LogSeverity::kWarning:
      return "W";
    case LogSeverity::kError:
      return "E";
    case LogSeverity::kFatal:
      return "F";
  }
  return "?";
}

}  // namespace

void SetMinLogSeverity(LogSeverity severity) {
  g_min_severity.store(static_cast<int>(severity), std::memory_order_relaxed);
}

LogSeverity MinLogSeverity() {
  return static_cast<LogSeverity>(g_min_severity.load(std::memory_order_relaxed));
}

LogMessage::LogMessage(const char* file, int line, LogSeverity severity) : severity_(severity) {
  const char* base = std::strrchr(file, '/');
  stream_ << SeverityLetter(severity)
          << absl::FormatTime("%m%d %H:%M:%E6S ", absl::Now(), absl::LocalTimeZone())
          << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string text = stream_.str();
  // One write per message so that lines from several threads do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace tandem
