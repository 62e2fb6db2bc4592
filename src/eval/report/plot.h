// Dependency-free SVG line charts for result files: one or more panels in a grid, each with
// axes, ticks, optional log scales, error bars and a legend. Output is deterministic text.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace vq::eval {

struct Series {
  std::string label;
  std::vector<double> x, y;
  std::vector<double> y_err;  // empty, or one half-width per point (drawn as error bars)
  bool dashed = false;
  bool highlight = false;  // drawn black and thick, with larger markers (e.g. the best per ratio)
  // Empty, or per point the low and high end of an interval around y (drawn as bars, also on a
  // log axis when both ends are positive), e.g. a 95% confidence interval.
  std::vector<std::pair<double, double>> y_lo_hi = {};
};

struct Panel {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  std::vector<Series> series;
};

// The whole figure as an SVG document. Throws Error(kInvalidArgument) for empty panels, series
// whose x and y sizes differ, or non-positive values on a log axis.
std::string line_plot_svg(const std::string& title, const std::vector<Panel>& panels,
                          int columns = 2);

}  // namespace vq::eval
