// Minimal leveled logging to stderr and invariant checks. Debian's Abseil
// 20220623 predates absl/log, so this is a small stand-in with the same
// spelling: LOG(INFO) << ...; CHECK(cond) << ...; a failed CHECK aborts.
// Thread-safe: each message is formatted on its own and written with one call.
#ifndef TANDEM_COMMON_BASE_LOGGING_H_
#define TANDEM_COMMON_BASE_LOGGING_H_

#include <sstream>

namespace tandem {

enum class LogSeverity { kInfo = 0, kWarning = 1, kError = 2, kFatal = 3 };

// Messages below this severity are dropped. Default kInfo; tools lower the
// noise with --v / flags where they need to.
void SetMinLogSeverity(LogSeverity severity);
LogSeverity MinLogSeverity();

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogSeverity severity);
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();  // Writes the line; aborts for kFatal.
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

// Makes `cond ? (void)0 : Voidify() & stream` well-formed.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace tandem

#define TANDEM_LOG_INFO ::tandem::LogSeverity::kInfo
#define TANDEM_LOG_WARNING ::tandem::LogSeverity::kWarning
#define TANDEM_LOG_ERROR ::tandem::LogSeverity::kError
#define TANDEM_LOG_FATAL ::tandem::LogSeverity::kFatal

#define LOG(severity)                                  \
  (TANDEM_LOG_##severity < ::tandem::MinLogSeverity()) \
      ? (void)0                                        \
      : ::tandem::LogVoidify() &                       \
            ::tandem::LogMessage(__FILE__, __LINE__, TANDEM_LOG_##severity).stream()

#define CHECK(cond)                                                                             \
  (cond) ? (void)0                                                                              \
         : ::tandem::LogVoidify() &                                                             \
               ::tandem::LogMessage(__FILE__, __LINE__, ::tandem::LogSeverity::kFatal).stream() \
                   << "Check failed: " #cond " "

#define CHECK_OK(expr)                                                   \
  do {                                                                   \
    const ::absl::Status tandem_check_status_ = (expr);                  \
    CHECK(tandem_check_status_.ok()) << tandem_check_status_.ToString(); \
  } while (false)

#ifdef NDEBUG
#define DCHECK(cond) \
  while (false) CHECK(cond)
#else
#define DCHECK(cond) CHECK(cond)
#endif

#endif  // TANDEM_COMMON_BASE_LOGGING_H_
