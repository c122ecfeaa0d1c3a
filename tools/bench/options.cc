#include "tools/bench/options.h"

#include <limits>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::bench {

absl::StatusOr<Slo> ParseSlo(std::string_view text) {
  Slo slo;
  for (absl::string_view item :
       absl::StrSplit(absl::string_view(text.data(), text.size()), ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> kv = absl::StrSplit(item, '=');
    double ms;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &ms) || !(ms > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad --slo item '", item, "': want NAME=MS with MS > 0"));
    }
    if (kv[0] == "ttft") {
      slo.ttft = ms / 1e3;
    } else if (kv[0] == "tpot") {
      slo.tpot = ms / 1e3;
    } else if (kv[0] == "e2el" || kv[0] == "e2e") {
      slo.e2e = ms / 1e3;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown --slo metric '", kv[0], "' (ttft, tpot or e2el)"));
    }
  }
  return slo;
}

absl::StatusOr<std::vector<double>> ParseRates(std::string_view text) {
  std::vector<double> rates;
  for (absl::string_view item :
       absl::StrSplit(absl::string_view(text.data(), text.size()), ',', absl::SkipEmpty())) {
    double r;
    if (item == "inf") {
      r = std::numeric_limits<double>::infinity();
    } else if (!absl::SimpleAtod(item, &r) || !(r > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad request rate '", item, "': want a number > 0 or inf"));
    }
    rates.push_back(r);
  }
  return rates;
}

}  // namespace tandem::bench
