// The router benchmark's figures and how they are printed: a table with the
// targets beside the measurements, and one JSON line for scripts.
#ifndef TANDEM_TOOLS_ROUTER_BENCH_REPORT_H_
#define TANDEM_TOOLS_ROUTER_BENCH_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "tools/router_bench/router_process.h"

namespace tandem::router_bench {

// The targets the router is held to.
inline constexpr double kTargetStreamsPerCore = 5000;
inline constexpr double kTargetKbPerStream = 50;
inline constexpr double kTargetAddedTtftP99Ms = 1;

struct RunInfo {
  std::string router;
  int router_pid = 0;
  int router_cpu = -1;
  bool disaggregated = false;
  int prompt_tokens = 0;
  int max_tokens = 0;
  int64_t file_limit = 0;
  std::string router_log;
};

struct ThroughputFigures {
  int concurrency = 0;
  double window_s = 0;
  // Streams that ended OK inside the window.
  int64_t completed = 0;
  int64_t errors = 0;
  std::string error_summary;
  bool drained = true;
  // Router CPU time (all threads, user + system) over the window; 0 when
  // /proc could not be read.
  double cpu_s = 0;

  double streams_per_s() const { return window_s > 0 ? completed / window_s : 0; }
  // Streams per CPU-second: streams/s on one fully used core.
  double streams_per_cpu_s() const { return cpu_s > 0 ? completed / cpu_s : 0; }
};

struct MemoryFigures {
  int requested = 0;
  // Streams that had their first token and were still open at the sample.
  int64_t open = 0;
  int held_by_worker = 0;
  bool all_opened = false;
  bool drained = true;
  int64_t errors = 0;
  std::string error_summary;
  ProcessSample before;
  ProcessSample open_sample;
  ProcessSample after;

  double kb_per_stream() const {
    return open > 0 ? static_cast<double>(open_sample.rss_kb - before.rss_kb) / open : 0;
  }
};

struct TtftFigures {
  struct Side {
    int64_t sent = 0;
    int64_t errors = 0;
    int64_t samples = 0;
    double achieved_rate = 0;
    absl::Duration p50;
    absl::Duration p99;
    std::string error_summary;
    bool drained = true;
  };
  double rate = 0;
  // Straight to the fake decode worker (the loopback floor), and through
  // the router.
  Side direct;
  Side routed;
};

struct Figures {
  std::optional<ThroughputFigures> throughput;
  std::optional<MemoryFigures> memory;
  std::optional<TtftFigures> ttft;
};

// The set-up, a few lines.
std::string Describe(const RunInfo& info);
// The table of figures and targets.
std::string Table(const Figures& figures);
// {"bench":"router_bench",...}, one line.
std::string JsonLine(const RunInfo& info, const Figures& figures);

}  // namespace tandem::router_bench

#endif  // TANDEM_TOOLS_ROUTER_BENCH_REPORT_H_
