// The router under test as a child process: started with its port file,
// optionally pinned to one CPU, its CPU time and memory read from /proc.
#ifndef TANDEM_TOOLS_ROUTER_BENCH_ROUTER_PROCESS_H_
#define TANDEM_TOOLS_ROUTER_BENCH_ROUTER_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::router_bench {

struct RouterLaunch {
  std::string binary;
  // Everything after the binary's name, --port_file excluded (added here).
  std::vector<std::string> args;
  // Pin the router to this CPU; -1 = not pinned.
  int cpu = -1;
  // The router's stdout and stderr go here.
  std::string log_path;
  absl::Duration startup_timeout = absl::Seconds(60);
};

// What /proc says about the router.
struct ProcessSample {
  double cpu_seconds = 0;  // user + system, all threads
  int64_t rss_kb = 0;
  int64_t threads = 0;
};

// Not thread-safe.
class RouterProcess {
 public:
  // Starts the router and waits for its port file. The error quotes the end
  // of the router's log when it exits or times out first.
  static absl::StatusOr<std::unique_ptr<RouterProcess>> Start(const RouterLaunch& launch);
  // Stops the router (Stop with a short grace) if still running.
  ~RouterProcess();

  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  absl::StatusOr<ProcessSample> Sample() const;
  // SIGTERM, then SIGKILL after `grace`; the router's exit as a status.
  absl::Status Stop(absl::Duration grace);

 private:
  RouterProcess(pid_t pid, std::string log_path, std::string dir)
      : pid_(pid), log_path_(std::move(log_path)), dir_(std::move(dir)) {}

  pid_t pid_;
  int port_ = 0;
  const std::string log_path_;
  // Temporary folder of the port file.
  const std::string dir_;
};

// The last `max_bytes` of a file (for error messages), "" when unreadable.
std::string TailOfFile(const std::string& path, size_t max_bytes);

// Raises this process's open-file limit to its hard limit (children inherit
// it); returns the soft limit now in force.
int64_t RaiseFileLimit();

// Moves every thread of this process off `cpu` (to the other allowed CPUs),
// so that a router pinned there has it alone. No-op when that would leave
// no CPU.
absl::Status AvoidCpu(int cpu);

}  // namespace tandem::router_bench

#endif  // TANDEM_TOOLS_ROUTER_BENCH_ROUTER_PROCESS_H_
