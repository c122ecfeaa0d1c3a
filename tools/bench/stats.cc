#include "tools/bench/stats.h"

#include <algorithm>
#include <cmath>

namespace tandem::bench {

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  // numpy "linear": virtual index (n - 1) * q / 100, interpolated.
  const double pos = (values.size() - 1) * std::clamp(q, 0.0, 100.0) / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = pos - lo;
  return values[lo] + (values[hi] - values[lo]) * frac;
}

Summary Summarize(const std::vector<double>& values) {
  Summary s;
  s.count = values.size();
  if (values.empty()) return s;
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / values.size();
  double sq = 0;
  for (double v : values) sq += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(sq / values.size());
  s.median = Percentile(values, 50);
  s.p90 = Percentile(values, 90);
  s.p99 = Percentile(values, 99);
  return s;
}

std::optional<double> Tpot(const RequestRecord& r) {
  if (!r.success || r.output_tokens < 2) return std::nullopt;
  return (r.e2e - r.ttft) / (r.output_tokens - 1);
}

Metrics ComputeMetrics(const std::vector<RequestRecord>& records, double duration_s,
                       const Slo& slo) {
  constexpr size_t kMaxErrors = 5;
  Metrics m;
  m.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2es;
  int good = 0;
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++m.failed;
      if (m.first_errors.size() < kMaxErrors) m.first_errors.push_back(r.error);
      continue;
    }
    ++m.completed;
    m.total_input_tokens += r.prompt_tokens;
    m.total_output_tokens += r.output_tokens;
    ttfts.push_back(r.ttft * 1e3);
    e2es.push_back(r.e2e * 1e3);
    for (double gap : r.itls) itls.push_back(gap * 1e3);
    const std::optional<double> tpot = Tpot(r);
    if (tpot) tpots.push_back(*tpot * 1e3);
    // As vLLM: a request with one output token has TPOT 0 for the SLO check.
    const bool ok = (!slo.ttft || r.ttft <= *slo.ttft) &&
                    (!slo.tpot || tpot.value_or(0) <= *slo.tpot) && (!slo.e2e || r.e2e <= *slo.e2e);
    if (ok) ++good;
  }
  m.ttft_ms = Summarize(ttfts);
  m.tpot_ms = Summarize(tpots);
  m.itl_ms = Summarize(itls);
  m.e2e_ms = Summarize(e2es);
  if (duration_s > 0) {
    m.request_throughput = m.completed / duration_s;
    m.output_throughput = m.total_output_tokens / duration_s;
    m.total_token_throughput = (m.total_input_tokens + m.total_output_tokens) / duration_s;
    if (!slo.empty()) m.goodput = good / duration_s;
  } else if (!slo.empty()) {
    m.goodput = 0;
  }
  return m;
}

}  // namespace tandem::bench
