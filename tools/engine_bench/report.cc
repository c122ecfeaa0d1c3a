// The engine bench's table and JSON line of report.h, and the limits each
// figure is set against.
#include "tools/engine_bench/report.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tandem::engine_bench {

namespace {

// The product rate that bounds a prefill with `dtype` weights, and its name.
std::pair<double, std::string> PrefillLimit(const MeasuredLimits& limits, DType dtype) {
  for (auto [type, rate] : limits.gemm16) {
    if (type == dtype) {
      return {rate, absl::StrCat("cuBLAS ", std::string(DTypeName(type)), " GEMM rate")};
    }
  }
  return {limits.gemm_flops, "GEMM rate"};
}

// Prefill: 2 flops per weight per token (of a mixture of experts, the
// token's top-k experts), classifier excluded (only the last token's logits
// are computed), attention excluded.
double PrefillFlops(const Result& r) {
  const double experts = r.experts > 0 ? r.expert_params * r.top_k / r.experts : 0;
  return 2.0 * (r.weight_params - r.classifier_params + experts);
}

// The bytes a decode step of `batch` rows reads: every weight once, the
// routed experts its rows touch (in expectation E (1 - (1 - k/E)^batch) of
// each sparse layer's E, for rows routed independently), and each
// sequence's KV.
double DecodeBytes(const Result& r, int batch) {
  double experts = 0;
  if (r.experts > 0) {
    // The share of each layer's experts touched.
    experts = r.expert_bytes * (1 - std::pow(1 - static_cast<double>(r.top_k) / r.experts, batch));
  }
  return r.weight_bytes + experts + batch * r.kv_bytes_per_sequence;
}

double DecodeLimit(const MeasuredLimits& limits, const Result& r, int batch) {
  return batch * limits.bandwidth / DecodeBytes(r, batch);
}

}  // namespace

Anchor AnchorFor(const std::string& shape, bool on_cpu) {
  if (!on_cpu) return {};
  if (shape == "stories15M") return {11130, 9702, 641, 1528};
  if (shape == "stories110M") return {1131, 1138, 84, 306};
  return {};
}

void PrintTable(const std::vector<Result>& results, const MeasuredLimits& limits, bool on_cpu) {
  const double bandwidth = limits.bandwidth;
  if (on_cpu) {
    std::printf("%-18s %-22s %12s %12s %8s\n", "model", "measurement", "tandem tok/s", "llama.cpp",
                "ratio");
  } else {
    std::printf("%-18s %-22s %12s %12s %9s\n", "model", "measurement", "tandem tok/s",
                "limit tok/s", "of limit");
  }
  for (const Result& r : results) {
    // The llama.cpp anchors are for f32 weights.
    const Anchor a = r.dtype == "f32" ? AnchorFor(r.shape, on_cpu) : Anchor{};
    const std::string name = absl::StrCat(r.shape, " ", r.dtype);
    const double gemm_limit = PrefillLimit(limits, r.wtype).first;
    for (auto [p, tps] : r.prefill) {
      if (!on_cpu) {
        const double limit = gemm_limit / PrefillFlops(r);
        std::printf("%-18s %-22s %12.0f %12.0f %8.0f%%\n", name.c_str(),
                    absl::StrCat("prefill ", p).c_str(), tps, limit, 100.0 * tps / limit);
        continue;
      }
      const double anchor = p == 128 ? a.prefill128 : p == 512 ? a.prefill512 : 0;
      std::printf("%-18s %-22s %12.0f %12s %8s\n", name.c_str(),
                  absl::StrCat("prefill ", p).c_str(), tps,
                  anchor > 0 ? absl::StrFormat("%.0f", anchor).c_str() : "-",
                  anchor > 0 ? absl::StrFormat("%.2f", tps / anchor).c_str() : "-");
    }
    for (auto [b, tps] : r.decode) {
      if (!on_cpu) {
        const double limit = DecodeLimit(limits, r, b);
        std::printf("%-18s %-22s %12.1f %12.1f %8.0f%%\n", name.c_str(),
                    absl::StrCat("decode batch ", b).c_str(), tps, limit, 100.0 * tps / limit);
        continue;
      }
      const double anchor = b == 1 ? a.decode1 : b == 16 ? a.decode16 : 0;
      std::printf("%-18s %-22s %12.1f %12s %8s\n", name.c_str(),
                  absl::StrCat("decode batch ", b).c_str(), tps,
                  anchor > 0 ? absl::StrFormat("%.0f", anchor).c_str() : "-",
                  anchor > 0 ? absl::StrFormat("%.2f", tps / anchor).c_str() : "-");
    }
    const auto [rate, rate_name] = PrefillLimit(limits, r.wtype);
    for (auto [p, tps] : r.prefill) {
      std::printf("%-18s prefill %d at %.0f GFLOP/s of weight products, %.0f%% of the %s",
                  name.c_str(), p, tps * PrefillFlops(r) / 1e9,
                  100.0 * tps * PrefillFlops(r) / rate, rate_name.c_str());
      if (!on_cpu) std::printf(" (%.1f TFLOP/s)", rate / 1e12);
      std::printf("\n");
    }
    for (auto [b, tps] : r.decode) {
      const double bytes = DecodeBytes(r, b);
      const double limit = DecodeLimit(limits, r, b);
      std::printf(
          "%-18s decode batch %d: bandwidth limit %.1f tok/s (%.0f MB/step at %.1f GB/s); "
          "at %.0f%% (%.2fx the limit's step time)\n",
          name.c_str(), b, limit, bytes / 1e6, bandwidth / 1e9, 100.0 * tps / limit, limit / tps);
    }
    std::printf("\n");
  }
}

void PrintJsonLine(const std::vector<Result>& results, const MeasuredLimits& limits,
                   const std::string& backend_name) {
  std::vector<std::string> parts;
  for (const Result& r : results) {
    std::vector<std::string> pf, dc;
    for (auto [p, t] : r.prefill) pf.push_back(absl::StrFormat("\"%d\":%.1f", p, t));
    for (auto [b, t] : r.decode) dc.push_back(absl::StrFormat("\"%d\":%.1f", b, t));
    parts.push_back(absl::StrFormat(
        "\"%s %s\":{\"prefill_tok_s\":{%s},\"decode_tok_s\":{%s},\"weight_bytes\":%.0f}", r.shape,
        r.dtype, absl::StrJoin(pf, ","), absl::StrJoin(dc, ","), r.weight_bytes));
  }
  for (auto [dtype, rate] : limits.gemm16) {
    parts.insert(parts.begin(), absl::StrFormat("\"gemm_%s_gflops\":%.1f",
                                                std::string(DTypeName(dtype)), rate / 1e9));
  }
  std::printf(
      "{\"bench\":\"tandem-engine-bench\",\"backend\":\"%s\",\"bandwidth_gbs\":%.2f,"
      "\"gemm_gflops\":%.1f,%s}\n",
      backend_name.c_str(), limits.bandwidth / 1e9, limits.gemm_flops / 1e9,
      absl::StrJoin(parts, ",").c_str());
}

}  // namespace tandem::engine_bench
