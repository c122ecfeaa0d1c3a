// The HTML report: charts drawn by svg_chart, tables of the numbers, the
// configuration; one file that opens anywhere without a network.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/report.h"
#include "tools/bench/svg_chart.h"

namespace tandem::bench {
namespace {

std::string RunName(const RunResult& r) {
  const double rate = r.options.request_rate;
  if (rate > 0 && !std::isinf(rate)) return absl::StrFormat("%g req/s", rate);
  return r.options.max_concurrency > 0
             ? absl::StrFormat("concurrency %d", r.options.max_concurrency)
             : "all at once";
}

// Empirical CDF of a per-request value (ms) over completed requests.
Series Cdf(const RunResult& run, double (*value)(const RequestRecord&)) {
  std::vector<double> v;
  for (const RequestRecord& r : run.records) {
    if (r.success) v.push_back(value(r) * 1e3);
  }
  std::sort(v.begin(), v.end());
  Series s;
  s.name = RunName(run);
  for (size_t i = 0; i < v.size(); ++i) {
    s.points.emplace_back(v[i], static_cast<double>(i + 1) / v.size());
  }
  return s;
}

Series OverTime(const RunResult& run, bool tpot) {
  Series s;
  s.name = RunName(run);
  s.line = false;
  for (const RequestRecord& r : run.records) {
    if (!r.success) continue;
    if (tpot) {
      if (auto t = Tpot(r)) s.points.emplace_back(r.start, *t * 1e3);
    } else {
      s.points.emplace_back(r.start, r.ttft * 1e3);
    }
  }
  return s;
}

std::string Td(double v) { return absl::StrFormat("<td>%.2f</td>", v); }

std::string MetricsTable(const std::vector<RunResult>& runs) {
  std::string h =
      "<table><tr><th>run</th><th>ok</th><th>failed</th><th>duration s</th><th>req/s</th>"
      "<th>goodput req/s</th><th>out tok/s</th><th>total tok/s</th>"
      "<th>TTFT mean</th><th>TTFT p50</th><th>TTFT p90</th><th>TTFT p99</th>"
      "<th>TPOT mean</th><th>TPOT p50</th><th>TPOT p90</th><th>TPOT p99</th>"
      "<th>ITL p50</th><th>ITL p99</th><th>E2E p50</th><th>E2E p99</th></tr>\n";
  for (const RunResult& r : runs) {
    const Metrics& m = r.metrics;
    absl::StrAppend(&h, "<tr><td>", HtmlEscape(RunName(r)), "</td><td>", m.completed, "</td><td>",
                    m.failed, "</td>", Td(m.duration_s), Td(m.request_throughput),
                    m.goodput ? Td(*m.goodput) : "<td>-</td>", Td(m.output_throughput),
                    Td(m.total_token_throughput), Td(m.ttft_ms.mean), Td(m.ttft_ms.median),
                    Td(m.ttft_ms.p90), Td(m.ttft_ms.p99), Td(m.tpot_ms.mean), Td(m.tpot_ms.median),
                    Td(m.tpot_ms.p90), Td(m.tpot_ms.p99), Td(m.itl_ms.median), Td(m.itl_ms.p99),
                    Td(m.e2e_ms.median), Td(m.e2e_ms.p99), "</tr>\n");
  }
  return h +
         "</table>\n<p>Latencies in ms (TPOT excludes the first token and requests with "
         "one output token, as vLLM bench serve).</p>\n";
}

}  // namespace

std::string HtmlReport(const std::vector<RunResult>& runs, const nlohmann::json& config) {
  Chart ttft_cdf{"TTFT CDF", "TTFT (ms)", "fraction of requests", {}};
  Chart e2e_cdf{"E2E latency CDF", "E2E latency (ms)", "fraction of requests", {}};
  Chart ttft_time{"TTFT over time", "request start (s)", "TTFT (ms)", {}};
  Chart tpot_time{"TPOT over time", "request start (s)", "TPOT (ms)", {}};
  for (const RunResult& r : runs) {
    ttft_cdf.series.push_back(Cdf(r, [](const RequestRecord& x) { return x.ttft; }));
    e2e_cdf.series.push_back(Cdf(r, [](const RequestRecord& x) { return x.e2e; }));
    ttft_time.series.push_back(OverTime(r, false));
    tpot_time.series.push_back(OverTime(r, true));
  }
  std::string charts = absl::StrCat(RenderSvg(ttft_cdf), RenderSvg(e2e_cdf), RenderSvg(ttft_time),
                                    RenderSvg(tpot_time));
  if (runs.size() > 1) {
    Chart tput{"Throughput vs request rate", "request rate (req/s)", "per second", {}};
    Chart ttft{"TTFT vs request rate", "request rate (req/s)", "TTFT (ms)", {}};
    Series req, tok, p50, p99;
    req.name = "completed req/s";
    tok.name = "output tok/s / 100";
    p50.name = "TTFT p50";
    p99.name = "TTFT p99";
    for (const RunResult& r : runs) {
      const double rate = r.options.request_rate;
      if (!(rate > 0) || std::isinf(rate)) continue;
      req.points.emplace_back(rate, r.metrics.request_throughput);
      tok.points.emplace_back(rate, r.metrics.output_throughput / 100);
      p50.points.emplace_back(rate, r.metrics.ttft_ms.median);
      p99.points.emplace_back(rate, r.metrics.ttft_ms.p99);
    }
    tput.series = {req, tok};
    ttft.series = {p50, p99};
    charts = absl::StrCat(RenderSvg(tput), RenderSvg(ttft), charts);
  }
  return absl::StrCat(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tandem-bench report</title>\n"
      "<style>body{font-family:sans-serif;margin:24px;color:#222}"
      "svg{margin:8px;border:1px solid #eee;background:#fff}"
      "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
      "padding:3px 6px;text-align:right}pre{background:#f6f6f6;padding:8px}</style>\n"
      "</head><body>\n<h1>tandem-bench report</h1>\n",
      MetricsTable(runs), "<div>\n", charts, "</div>\n<h2>Configuration</h2>\n<pre>",
      HtmlEscape(config.dump(2)), "</pre>\n</body></html>\n");
}

}  // namespace tandem::bench
