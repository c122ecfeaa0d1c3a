// Reading a process's Prometheus /metrics endpoint in e2e tests.
#ifndef TANDEM_TESTS_E2E_METRICS_SCRAPE_H_
#define TANDEM_TESTS_E2E_METRICS_SCRAPE_H_

#include <cmath>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "httplib.h"

namespace tandem::testing {

using Samples = std::map<std::string, double>;  // "name{labels}" -> value.

// Scrapes http://127.0.0.1:port/metrics into samples; empty on failure.
inline Samples Scrape(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result result = client.Get("/metrics");
  Samples samples;
  if (!result || result->status != 200) return samples;
  for (absl::string_view line : absl::StrSplit(result->body, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space == absl::string_view::npos || !absl::SimpleAtod(line.substr(space + 1), &value)) {
      continue;
    }
    samples[std::string(line.substr(0, space))] = value;
  }
  return samples;
}

// A sample's value; NaN (which fails every comparison) when absent.
inline double Get(const Samples& s, const std::string& name) {
  auto it = s.find(name);
  return it == s.end() ? std::nan("") : it->second;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_E2E_METRICS_SCRAPE_H_
