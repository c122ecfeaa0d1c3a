#include "planner/router_scrape.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem::planner {
namespace {

// One sample line of the text format: name, labels and value. Written by
// hand: prometheus-cpp serialises but does not parse, and the planner needs
// only the line grammar (no timestamps, no escapes beyond \" \\ \n).
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

absl::StatusOr<Sample> ParseSample(absl::string_view line) {
  Sample s;
  const size_t name_end = line.find_first_of("{ ");
  if (name_end == absl::string_view::npos || name_end == 0) {
    return absl::InvalidArgumentError(absl::StrCat("not a sample: '", line, "'"));
  }
  s.name = std::string(line.substr(0, name_end));
  absl::string_view rest = line.substr(name_end);
  if (absl::ConsumePrefix(&rest, "{")) {
    while (!absl::ConsumePrefix(&rest, "}")) {
      absl::ConsumePrefix(&rest, ",");
      if (absl::ConsumePrefix(&rest, "}")) break;
      const size_t eq = rest.find("=\"");
      if (eq == absl::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat("malformed labels: '", line, "'"));
      }
      const std::string key(rest.substr(0, eq));
      rest.remove_prefix(eq + 2);
      std::string value;
      bool closed = false;
      while (!rest.empty()) {
        const char c = rest.front();
        rest.remove_prefix(1);
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\' && !rest.empty()) {
          const char e = rest.front();
          rest.remove_prefix(1);
          value += e == 'n' ? '\n' : e;
        } else {
          value += c;
        }
      }
      if (!closed) {
        return absl::InvalidArgumentError(absl::StrCat("unterminated label: '", line, "'"));
      }
      s.labels[key] = std::move(value);
    }
  }
  absl::string_view value = absl::StripAsciiWhitespace(rest);
  value = value.substr(0, value.find(' '));  // a timestamp may follow
  if (value == "+Inf") {
    s.value = std::numeric_limits<double>::infinity();
  } else if (!absl::SimpleAtod(value, &s.value)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed value: '", line, "'"));
  }
  return s;
}

double Bound(const std::string& le) {
  if (le == "+Inf") return std::numeric_limits<double>::infinity();
  double v = 0;
  return absl::SimpleAtod(le, &v) ? v : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

absl::StatusOr<RouterScrape> ParseRouterMetrics(absl::string_view text, absl::Time at) {
  RouterScrape r;
  r.at = at;
  bool saw_requests = false, saw_prefill = false, saw_decode = false;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    absl::StatusOr<Sample> s = ParseSample(line);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, ": ", s.status().message()));
    }
    if (s->name == "tandem_router_requests_total") {
      r.requests += s->value;
      const std::string& outcome = s->labels["outcome"];
      if (outcome == "resource_exhausted" || outcome == "unavailable" ||
          outcome == "deadline_exceeded") {
        r.refused += s->value;
      }
      saw_requests = true;
    } else if (s->name == "tandem_router_time_to_first_token_seconds_bucket") {
      r.ttft_buckets.emplace_back(Bound(s->labels["le"]), s->value);
    } else if (s->name == "tandem_router_time_per_output_token_seconds_bucket") {
      r.tpot_buckets.emplace_back(Bound(s->labels["le"]), s->value);
    } else if (s->name == "tandem_router_workers_ready") {
      if (s->labels["pool"] == "prefill") {
        r.prefill_ready = static_cast<int>(s->value);
        saw_prefill = true;
      } else if (s->labels["pool"] == "decode") {
        r.decode_ready = static_cast<int>(s->value);
        saw_decode = true;
      }
    }
  }
  if (!saw_requests || !saw_prefill || !saw_decode) {
    return absl::InvalidArgumentError(
        "the metrics lack tandem_router_requests_total or tandem_router_workers_ready: is this a "
        "tandem router's /metrics?");
  }
  for (auto* buckets : {&r.ttft_buckets, &r.tpot_buckets}) {
    std::sort(buckets->begin(), buckets->end());
  }
  return r;
}

std::optional<double> QuantileOfGrowth(const std::vector<std::pair<double, double>>& before,
                                       const std::vector<std::pair<double, double>>& after,
                                       double q) {
  if (after.empty()) return std::nullopt;
  // Growth per bucket, matched by bound (a reading without buckets counts
  // as zero: the histogram had nothing yet).
  std::vector<std::pair<double, double>> growth;
  for (const auto& [bound, count] : after) {
    double was = 0;
    for (const auto& [b, c] : before) {
      if (b == bound) was = c;
    }
    growth.emplace_back(bound, std::max(0.0, count - was));
  }
  const double total = growth.back().second;
  if (!(total > 0)) return std::nullopt;
  const double rank = q * total;
  double lower = 0, below = 0;
  for (const auto& [bound, count] : growth) {
    if (count >= rank) {
      if (std::isinf(bound)) return lower;
      if (count == below) return bound;
      return lower + (bound - lower) * (rank - below) / (count - below);
    }
    lower = bound;
    below = count;
  }
  return lower;
}

Observation Between(const RouterScrape& before, const RouterScrape& after, double q) {
  Observation o;
  o.at = after.at;
  o.prefill_ready = after.prefill_ready;
  o.decode_ready = after.decode_ready;
  const double seconds = absl::ToDoubleSeconds(after.at - before.at);
  if (seconds > 0 && after.requests >= before.requests) {
    o.request_rate = (after.requests - before.requests) / seconds;
    if (after.requests > before.requests && after.refused >= before.refused) {
      o.refused_fraction = (after.refused - before.refused) / (after.requests - before.requests);
    }
  }
  o.ttft_p99 = QuantileOfGrowth(before.ttft_buckets, after.ttft_buckets, q);
  o.tpot_p99 = QuantileOfGrowth(before.tpot_buckets, after.tpot_buckets, q);
  return o;
}

}  // namespace tandem::planner
