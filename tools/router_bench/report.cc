#include "tools/router_bench/report.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::router_bench {

namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }
int64_t Us(absl::Duration d) { return absl::ToInt64Microseconds(d); }

// PASS or MISS against the target; FAIL when calls failed or hung (the
// figure then says little).
std::string Verdict(bool met, int64_t errors, bool drained) {
  if (errors > 0 || !drained) return "FAIL (errors)";
  return met ? "PASS" : "MISS";
}

std::string Row(const std::string& metric, const std::string& measured, const std::string& target,
                const std::string& verdict) {
  return absl::StrFormat("%-40s %22s  %-10s %s\n", metric, measured, target, verdict);
}

std::string Drain(bool drained) { return drained ? "" : "; calls still open after the deadline"; }

}  // namespace

std::string Describe(const RunInfo& info) {
  return absl::StrCat(
      "router:  ", info.router, " (pid ", info.router_pid, ", ",
      info.router_cpu >= 0 ? absl::StrCat("pinned to CPU ", info.router_cpu)
                           : std::string("not pinned"),
      "; log ", info.router_log, ")\n", "workers: instant fakes in this process, ",
      info.disaggregated ? "disaggregated (Generate, Prefill, Start)" : "colocated (local prefill)",
      "\nrequests: ", info.prompt_tokens, " prompt token ids, max_tokens 1..", info.max_tokens,
      "; open-file limit ", info.file_limit, "\n");
}

std::string Table(const Figures& figures) {
  std::string out = "\n";
  out += Row("metric", "measured", "target", "verdict");
  if (figures.throughput.has_value()) {
    const ThroughputFigures& t = *figures.throughput;
    out +=
        Row("new streams/s per core (per CPU-s)", absl::StrFormat("%.0f /s", t.streams_per_cpu_s()),
            absl::StrFormat(">= %.0f", kTargetStreamsPerCore),
            Verdict(t.streams_per_cpu_s() >= kTargetStreamsPerCore, t.errors, t.drained));
    out += absl::StrFormat(
        "  closed loop of %d streams for %.1f s: %d streams ended OK = %.0f /s; router CPU %.2f "
        "s (%.0f%% of one core); errors: %s%s\n",
        t.concurrency, t.window_s, t.completed, t.streams_per_s(), t.cpu_s,
        t.window_s > 0 ? 100 * t.cpu_s / t.window_s : 0, t.error_summary, Drain(t.drained));
  }
  if (figures.memory.has_value()) {
    const MemoryFigures& m = *figures.memory;
    out += Row(absl::StrFormat("memory per open stream (%d open)", m.open),
               absl::StrFormat("%.1f KB", m.kb_per_stream()),
               absl::StrFormat("< %.0f KB", kTargetKbPerStream),
               Verdict(m.kb_per_stream() < kTargetKbPerStream, m.errors,
                       m.drained && m.all_opened && m.open == m.requested));
    out += absl::StrFormat(
        "  %d streams asked, %d open (%d held by the worker)%s; router RSS %.1f MB -> %.1f MB "
        "open -> %.1f MB after; threads %d -> %d; errors: %s%s\n",
        m.requested, m.open, m.held_by_worker,
        m.all_opened ? "" : " (not all within --open_timeout)", m.before.rss_kb / 1024.0,
        m.open_sample.rss_kb / 1024.0, m.after.rss_kb / 1024.0, m.before.threads,
        m.open_sample.threads, m.error_summary, Drain(m.drained));
  }
  if (figures.ttft.has_value()) {
    const TtftFigures& t = *figures.ttft;
    const int64_t errors = t.direct.errors + t.routed.errors;
    const bool drained = t.direct.drained && t.routed.drained;
    out += Row("TTFT p50 direct / routed / added",
               absl::StrFormat("%.3f / %.3f / %.3f ms", Ms(t.direct.p50), Ms(t.routed.p50),
                               Ms(t.routed.p50 - t.direct.p50)),
               "", "");
    const absl::Duration added_p99 = t.routed.p99 - t.direct.p99;
    out += Row(
        absl::StrFormat("TTFT p99 direct / routed / added"),
        absl::StrFormat("%.3f / %.3f / %.3f ms", Ms(t.direct.p99), Ms(t.routed.p99), Ms(added_p99)),
        absl::StrFormat("<= %.0f ms", kTargetAddedTtftP99Ms),
        Verdict(Ms(added_p99) <= kTargetAddedTtftP99Ms, errors, drained));
    out += absl::StrFormat(
        "  open loop at %.0f req/s: direct %d sent (%.0f/s), routed %d sent (%.0f/s); errors: "
        "direct %s, routed %s%s\n",
        t.rate, t.direct.sent, t.direct.achieved_rate, t.routed.sent, t.routed.achieved_rate,
        t.direct.error_summary, t.routed.error_summary, Drain(drained));
  }
  return out;
}

std::string JsonLine(const RunInfo& info, const Figures& figures) {
  nlohmann::json j;
  j["bench"] = "router_bench";
  j["router_cpu"] = info.router_cpu;
  j["disaggregated"] = info.disaggregated;
  j["prompt_tokens"] = info.prompt_tokens;
  j["max_tokens"] = info.max_tokens;
  if (figures.throughput.has_value()) {
    const ThroughputFigures& t = *figures.throughput;
    j["throughput"] = {
        {"concurrency", t.concurrency}, {"window_s", t.window_s},
        {"completed", t.completed},     {"errors", t.errors},
        {"drained", t.drained},         {"streams_per_s", t.streams_per_s()},
        {"router_cpu_s", t.cpu_s},      {"streams_per_cpu_s", t.streams_per_cpu_s()}};
  }
  if (figures.memory.has_value()) {
    const MemoryFigures& m = *figures.memory;
    j["memory"] = {{"streams", m.requested},
                   {"open", m.open},
                   {"errors", m.errors},
                   {"drained", m.drained},
                   {"rss_before_kb", m.before.rss_kb},
                   {"rss_open_kb", m.open_sample.rss_kb},
                   {"rss_after_kb", m.after.rss_kb},
                   {"threads_before", m.before.threads},
                   {"threads_open", m.open_sample.threads},
                   {"kb_per_stream", m.kb_per_stream()}};
  }
  if (figures.ttft.has_value()) {
    const TtftFigures& t = *figures.ttft;
    auto side = [](const TtftFigures::Side& s) {
      return nlohmann::json{{"sent", s.sent},       {"errors", s.errors},
                            {"samples", s.samples}, {"achieved_rate", s.achieved_rate},
                            {"p50_us", Us(s.p50)},  {"p99_us", Us(s.p99)},
                            {"drained", s.drained}};
    };
    j["ttft"] = {{"rate", t.rate},
                 {"direct", side(t.direct)},
                 {"routed", side(t.routed)},
                 {"added_p50_us", Us(t.routed.p50 - t.direct.p50)},
                 {"added_p99_us", Us(t.routed.p99 - t.direct.p99)}};
  }
  return j.dump();
}

}  // namespace tandem::router_bench
