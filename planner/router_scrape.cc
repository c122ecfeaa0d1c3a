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
    } else if (s->name == "tandem_router_burst_prefill_requests_total") {
      r.burst_prefills = s->value;
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

namespace {

using Buckets = std::vector<std::pair<double, double>>;

// Each bucket's growth between two readings, matched by bound (a reading
// without buckets counts as zero: the histogram had nothing yet).
Buckets Growth(const Buckets& before, const Buckets& after) {
  Buckets growth;
  for (const auto& [bound, count] : after) {
    double was = 0;
    for (const auto& [b, c] : before) {
      if (b == bound) was = c;
    }
    growth.emplace_back(bound, std::max(0.0, count - was));
  }
  return growth;
}

// Adds `growth` into `sum` bound by bound; false when their bounds differ
// (routers of other versions), leaving `sum` as it was.
bool AddGrowth(const Buckets& growth, Buckets& sum) {
  if (sum.empty()) {
    sum = growth;
    return true;
  }
  if (sum.size() != growth.size()) return false;
  for (size_t i = 0; i < sum.size(); ++i) {
    if (sum[i].first != growth[i].first) return false;
  }
  for (size_t i = 0; i < sum.size(); ++i) sum[i].second += growth[i].second;
  return true;
}

// The value at `q` of cumulative bucket counts, interpolated within the
// bucket it falls in.
std::optional<double> Quantile(const Buckets& growth, double q) {
  if (growth.empty()) return std::nullopt;
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

}  // namespace

std::optional<double> QuantileOfGrowth(const Buckets& before, const Buckets& after, double q) {
  return Quantile(Growth(before, after), q);
}

Observation Between(const RouterScrape& before, const RouterScrape& after, double q) {
  return BetweenRouters({{"router", before}}, {{"router", after}}, q);
}

Observation BetweenRouters(const RouterScrapes& before, const RouterScrapes& after, double q) {
  Observation o;
  double rate = 0, requests = 0, refused = 0, bursts = 0;
  bool any_rate = false;
  Buckets ttft, tpot;
  for (const auto& [address, now] : after) {
    o.at = std::max(o.at, now.at);
    o.prefill_ready = std::max(o.prefill_ready, now.prefill_ready);
    o.decode_ready = std::max(o.decode_ready, now.decode_ready);
    const auto was_it = before.find(address);
    if (was_it == before.end()) continue;  // counts from its next reading
    const RouterScrape& was = was_it->second;
    const double seconds = absl::ToDoubleSeconds(now.at - was.at);
    // A counter that went down: the router restarted between the readings.
    if (!(seconds > 0) || now.requests < was.requests || now.refused < was.refused) continue;
    rate += (now.requests - was.requests) / seconds;
    requests += now.requests - was.requests;
    refused += now.refused - was.refused;
    bursts += std::max(0.0, now.burst_prefills - was.burst_prefills);
    any_rate = true;
    AddGrowth(Growth(was.ttft_buckets, now.ttft_buckets), ttft);
    AddGrowth(Growth(was.tpot_buckets, now.tpot_buckets), tpot);
  }
  if (any_rate) o.request_rate = rate;
  if (requests > 0) {
    o.refused_fraction = refused / requests;
    o.burst_fraction = bursts / requests;
  }
  o.ttft_p99 = Quantile(ttft, q);
  o.tpot_p99 = Quantile(tpot, q);
  return o;
}

}  // namespace tandem::planner
