// Parsing of the list-valued flags of tandem-bench.
#ifndef TANDEM_TOOLS_BENCH_OPTIONS_H_
#define TANDEM_TOOLS_BENCH_OPTIONS_H_

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/stats.h"

namespace tandem::bench {

// "ttft=500,tpot=50[,e2el=2000]" in milliseconds -> seconds. Empty -> none.
absl::StatusOr<Slo> ParseSlo(std::string_view text);

// "1,2,4.5" -> rates in req/s; "inf" allowed. Empty -> empty list.
absl::StatusOr<std::vector<double>> ParseRates(std::string_view text);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_OPTIONS_H_
