#include "tools/sim/plan_output.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem::sim {
namespace {

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// A YAML scalar: a JSON string is one.
std::string Yaml(const std::string& s) { return nlohmann::json(s).dump(); }

std::string Ms(double seconds) { return absl::StrFormat("%.1f", seconds * 1e3); }

std::string Joined(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return absl::StrCat(a, " ", b);
}

// "--name value" pairs of a plan's own args as (name, value).
std::vector<std::pair<std::string, std::string>> Pairs(const std::string& args) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::vector<std::string> words = absl::StrSplit(args, ' ', absl::SkipEmpty());
  for (size_t i = 0; i + 1 < words.size(); i += 2) {
    out.emplace_back(std::string(absl::StripPrefix(words[i], "--")), words[i + 1]);
  }
  return out;
}

// A pool's or the router's section: its flags (the plan's) and extraArgs
// (the user's, a word each as cluster.sh splits them).
void Section(std::string& out, const std::string& plan_args, const std::string& base_args) {
  const auto pairs = Pairs(plan_args);
  if (pairs.empty()) {
    absl::StrAppend(&out, "  flags: {}\n");
  } else {
    absl::StrAppend(&out, "  flags:\n");
    for (const auto& [name, value] : pairs) {
      absl::StrAppend(&out, "    ", name, ": ", Yaml(value), "\n");
    }
  }
  // The chart takes whole "--name=value" arguments: a value given as the
  // next word joins its flag.
  const std::vector<std::string> words = absl::StrSplit(base_args, ' ', absl::SkipEmpty());
  std::vector<std::string> args;
  for (size_t i = 0; i < words.size(); ++i) {
    std::string arg = words[i];
    if (absl::StartsWith(arg, "--") && !absl::StrContains(arg, '=') && i + 1 < words.size() &&
        !absl::StartsWith(words[i + 1], "--")) {
      absl::StrAppend(&arg, "=", words[++i]);
    }
    args.push_back(std::move(arg));
  }
  if (args.empty()) {
    absl::StrAppend(&out, "  extraArgs: []\n");
  } else {
    absl::StrAppend(&out, "  extraArgs:\n");
    for (const std::string& a : args) absl::StrAppend(&out, "    - ", Yaml(a), "\n");
  }
}

}  // namespace

std::string PointsTable(const PlanResult& result, const std::vector<int>& ids,
                        const PlanTargets& targets) {
  const std::string q = absl::StrFormat("p%g", targets.percentile);
  std::string out =
      absl::StrFormat("%-52s %7s %9s %9s %9s %9s %6s  %s\n", "configuration", "workers", "good/wkr",
                      "TTFT " + q, "TPOT " + q, "E2E " + q, "ratio", "misses");
  for (int id : ids) {
    const PlanPoint& p = result.points[id];
    absl::StrAppend(
        &out, absl::StrFormat("%-52s %7d %9.3f %9s %9s %9s %6.2f  %s\n", p.config.Describe(),
                              p.config.workers(), p.goodput_per_worker, Ms(p.ttft), Ms(p.tpot),
                              Ms(p.e2e), p.slo_ratio, p.meets ? "meets the SLOs" : p.miss));
  }
  return out;
}

std::string ChosenSummary(const PlanPoint& p) {
  const bench::Metrics& m = p.metrics;
  std::string out = absl::StrFormat("%-6s %9s %9s %9s\n", "ms", "p50", "p90", "p99");
  auto row = [&](const char* name, const bench::Summary& s) {
    absl::StrAppend(&out,
                    absl::StrFormat("%-6s %9.1f %9.1f %9.1f\n", name, s.median, s.p90, s.p99));
  };
  row("TTFT", m.ttft_ms);
  row("TPOT", m.tpot_ms);
  row("ITL", m.itl_ms);
  row("E2E", m.e2e_ms);
  absl::StrAppend(&out,
                  absl::StrFormat("%d requests ok, %d failed; %.2f req/s, %.1f output tok/s, "
                                  "goodput %.2f req/s (%.3f per worker)\n",
                                  m.completed, m.failed, m.request_throughput, m.output_throughput,
                                  m.goodput.value_or(0), p.goodput_per_worker));
  return out;
}

std::string ClusterCommand(const PlanConfig& c, const PlanBaseArgs& base) {
  std::string out =
      absl::StrCat("deploy/local/cluster.sh up --prefill ", c.prefill, " --decode ", c.decode);
  if (!c.kv_dtype.empty()) absl::StrAppend(&out, " --kv_dtype ", c.kv_dtype);
  const std::string decode = Joined(base.decode, c.DecodeArgs());
  const std::string prefill = Joined(base.prefill, c.PrefillArgs());
  const std::string router = Joined(base.router, c.RouterArgs());
  if (!decode.empty()) absl::StrAppend(&out, " --decode_args ", ShellQuote(decode));
  if (!prefill.empty() && c.prefill > 0) {
    absl::StrAppend(&out, " --prefill_args ", ShellQuote(prefill));
  }
  if (!router.empty()) absl::StrAppend(&out, " --router_args ", ShellQuote(router));
  return out;
}

std::string HelmValues(const PlanConfig& c, const PlanBaseArgs& base, const std::string& comment) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(comment, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, "# ", line, "\n");
  }
  if (!c.kv_dtype.empty()) absl::StrAppend(&out, "model:\n  kvDtype: ", Yaml(c.kv_dtype), "\n");
  absl::StrAppend(&out, "router:\n");
  Section(out, c.RouterArgs(), base.router);
  absl::StrAppend(&out, "prefill:\n  enabled: ", c.prefill > 0 ? "true" : "false", "\n");
  if (c.prefill > 0) {
    absl::StrAppend(&out, "  replicas: ", c.prefill, "\n");
    Section(out, c.PrefillArgs(), base.prefill);
  }
  absl::StrAppend(&out, "decode:\n  replicas: ", c.decode, "\n");
  Section(out, c.DecodeArgs(), base.decode);
  return out;
}

nlohmann::json PointJson(const PlanPoint& p) {
  const bench::Metrics& m = p.metrics;
  auto summary = [](const bench::Summary& s) {
    return nlohmann::json{{"p50", s.median}, {"p90", s.p90}, {"p99", s.p99}, {"mean", s.mean}};
  };
  return {
      {"configuration", p.config.Describe()},
      {"prefill", p.config.prefill},
      {"decode", p.config.decode},
      {"decode_args", p.config.DecodeArgs()},
      {"prefill_args", p.config.PrefillArgs()},
      {"router_args", p.config.RouterArgs()},
      {"kv_dtype", p.config.kv_dtype},
      {"meets", p.meets},
      {"misses", p.miss},
      {"slo_ratio", p.slo_ratio},
      {"at_percentile_ms", {{"ttft", p.ttft * 1e3}, {"tpot", p.tpot * 1e3}, {"e2e", p.e2e * 1e3}}},
      {"goodput", m.goodput.value_or(0)},
      {"goodput_per_worker", p.goodput_per_worker},
      {"completed", m.completed},
      {"failed", m.failed},
      {"first_errors", m.first_errors},
      {"request_throughput", m.request_throughput},
      {"output_throughput", m.output_throughput},
      {"ttft_ms", summary(m.ttft_ms)},
      {"tpot_ms", summary(m.tpot_ms)},
      {"itl_ms", summary(m.itl_ms)},
      {"e2e_ms", summary(m.e2e_ms)}};
}

}  // namespace tandem::sim
