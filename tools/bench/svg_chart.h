// A small SVG chart drawer (lines and scatter, linear axes) for the HTML
// report, so the page needs no script or external library.
#ifndef TANDEM_TOOLS_BENCH_SVG_CHART_H_
#define TANDEM_TOOLS_BENCH_SVG_CHART_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::bench {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;
  bool line = true;  // else dots
};

struct Chart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
};

// An <svg> element; an empty chart draws "no data".
std::string RenderSvg(const Chart& chart);

// Escapes &, <, >, " for HTML text and attributes.
std::string HtmlEscape(std::string_view s);

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_SVG_CHART_H_
