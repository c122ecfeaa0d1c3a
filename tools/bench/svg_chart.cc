#include "tools/bench/svg_chart.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::bench {
namespace {

constexpr double kW = 560, kH = 320, kLeft = 64, kRight = 16, kTop = 32, kBottom = 48;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};

// A 1-2-5 step giving about `n` ticks over `span`.
double NiceStep(double span, int n) {
  if (!(span > 0)) return 1;
  const double raw = span / n;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * mag) return m * mag;
  }
  return 10 * mag;
}

std::string Num(double v) { return absl::StrFormat("%g", std::abs(v) < 1e-12 ? 0.0 : v); }

}  // namespace

std::string HtmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string RenderSvg(const Chart& chart) {
  double x0 = INFINITY, x1 = -INFINITY, y1 = -INFINITY;
  for (const Series& s : chart.series) {
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y1 = std::max(y1, y);
    }
  }
  std::string svg = absl::StrFormat(
      "<svg width=\"%g\" height=\"%g\" viewBox=\"0 0 %g %g\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<text x=\"%g\" y=\"18\" font-size=\"14\" "
      "text-anchor=\"middle\">%s</text>\n",
      kW, kH, kW, kH, kW / 2, HtmlEscape(chart.title));
  if (!std::isfinite(x0))
    return absl::StrCat(svg, "<text x=\"280\" y=\"160\">no data</text></svg>\n");
  // Latencies and throughputs start at 0; x starts at 0 unless far from it.
  const double y0 = 0;
  if (x0 > 0 && x0 < (x1 - x0)) x0 = 0;
  const double ystep = NiceStep(y1 - y0, 5), xstep = NiceStep(x1 - x0, 6);
  y1 = std::max(ystep, std::ceil(y1 / ystep) * ystep);
  x0 = std::floor(x0 / xstep) * xstep;
  x1 = std::max(x0 + xstep, std::ceil(x1 / xstep) * xstep);
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return kTop + ph - (y - y0) / (y1 - y0) * ph; };

  for (double y = y0; y <= y1 + ystep / 2; y += ystep) {
    absl::StrAppend(
        &svg, absl::StrFormat("<line x1=\"%g\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                              "<text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                              kLeft, py(y), kW - kRight, py(y), kLeft - 4, py(y) + 4, Num(y)));
  }
  for (double x = x0; x <= x1 + xstep / 2; x += xstep) {
    absl::StrAppend(
        &svg, absl::StrFormat("<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#ddd\"/>"
                              "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%s</text>\n",
                              px(x), kTop, px(x), kTop + ph, px(x), kTop + ph + 14, Num(x)));
  }
  absl::StrAppend(
      &svg,
      absl::StrFormat(
          "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"#444\"/>\n"
          "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%s</text>\n"
          "<text x=\"14\" y=\"%g\" text-anchor=\"middle\" transform=\"rotate(-90 14 "
          "%g)\">%s</text>\n",
          kLeft, kTop, pw, ph, kLeft + pw / 2, kH - 10, HtmlEscape(chart.x_label), kTop + ph / 2,
          kTop + ph / 2, HtmlEscape(chart.y_label)));

  for (size_t i = 0; i < chart.series.size(); ++i) {
    const Series& s = chart.series[i];
    const char* color = kColors[i % std::size(kColors)];
    std::string pts;
    for (auto [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      if (s.line) {
        absl::StrAppend(&pts, absl::StrFormat("%.1f,%.1f ", px(x), py(y)));
      } else {
        absl::StrAppend(
            &svg,
            absl::StrFormat(
                "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\" fill-opacity=\"0.6\"/>",
                px(x), py(y), color));
      }
    }
    if (s.line) {
      absl::StrAppend(
          &svg, absl::StrFormat(
                    "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"/>",
                    pts, color));
    }
    absl::StrAppend(
        &svg, absl::StrFormat("\n<rect x=\"%g\" y=\"%g\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                              "<text x=\"%g\" y=\"%g\">%s</text>\n",
                              kLeft + 8, kTop + 6 + 14 * i, color, kLeft + 22, kTop + 15 + 14 * i,
                              HtmlEscape(s.name)));
  }
  return absl::StrCat(svg, "</svg>\n");
}

}  // namespace tandem::bench
