#include "eval/report/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "veloxquant/errors.h"

namespace vq::eval {
namespace {

constexpr int kPanelW = 460, kPanelH = 320, kMarginL = 64, kMarginR = 16, kMarginT = 34,
              kMarginB = 46, kLegendW = 250, kTitleH = 34;

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                         "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939",
                         "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354"};
constexpr int kNumColors = sizeof(kColors) / sizeof(kColors[0]);

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string tick_text(double v) {
  char buf[32];
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) {
    std::snprintf(buf, sizeof buf, "%.0e", v);
  } else {
    std::snprintf(buf, sizeof buf, "%g", v);
  }
  return buf;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

struct Axis {
  double lo, hi;
  bool log;
  double map(double v, double a, double b) const {
    const double t = log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo))
                         : (v - lo) / (hi - lo);
    return a + t * (b - a);
  }
  std::vector<double> ticks() const {
    std::vector<double> t;
    if (log) {
      for (double p = std::floor(std::log10(lo)); p <= std::ceil(std::log10(hi)); p += 1) {
        for (double m : {1.0, 2.0, 5.0}) {
          const double v = m * std::pow(10.0, p);
          if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
        }
      }
      return t;
    }
    const double span = hi - lo;
    const double raw = span / 5;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
      if (raw <= m * mag) {
        step = m * mag;
        break;
      }
    }
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
      t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
    }
    return t;
  }
};

// An interval bar that can be drawn: finite ends, lo < hi, positive on a log axis.
bool interval_drawable(const std::pair<double, double>& i, bool log) {
  return std::isfinite(i.first) && std::isfinite(i.second) && i.first < i.second &&
         (!log || i.first > 0);
}

Axis make_axis(double lo, double hi, bool log) {
  if (!(lo < hi)) {
    const double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    lo -= log ? lo * 0.5 : pad;
    hi += log ? hi : pad;
  }
  if (log) {
    lo /= 1.15;
    hi *= 1.15;
  } else {
    const double pad = (hi - lo) * 0.05;
    lo -= pad;
    hi += pad;
  }
  return Axis{lo, hi, log};
}

// Every distinct label once, in order of first appearance, with one color per label across
// panels: highlighted series black, the others the palette in order.
struct Legend {
  std::vector<std::string> labels;
  std::vector<bool> dashed, highlight;

  explicit Legend(const std::vector<Panel>& panels) {
    for (const auto& p : panels) {
      for (const auto& s : p.series) {
        if (s.x.size() != s.y.size() || (!s.y_err.empty() && s.y_err.size() != s.y.size()) ||
            (!s.y_lo_hi.empty() && s.y_lo_hi.size() != s.y.size())) {
          throw Error(ErrorCode::kInvalidArgument,
                      "[plot] series '" + s.label + "' has mismatched x/y/err sizes");
        }
        if (std::find(labels.begin(), labels.end(), s.label) == labels.end()) {
          labels.push_back(s.label);
          dashed.push_back(s.dashed);
          highlight.push_back(s.highlight);
        }
      }
    }
  }

  const char* color(const std::string& label) const {
    const auto it = std::find(labels.begin(), labels.end(), label);
    const auto i = static_cast<std::size_t>(it - labels.begin());
    if (highlight[i]) return "#000000";
    std::size_t n = 0;
    for (std::size_t j = 0; j < i; ++j) n += highlight[j] ? 0 : 1;
    return kColors[n % kNumColors];
  }

  std::string svg(double lx) const {
    std::string out;
    for (std::size_t i = 0; i < labels.size(); ++i) {
      const double y = kTitleH + 20 + static_cast<double>(i) * 18;
      out += "<line x1=\"" + num(lx) + "\" y1=\"" + num(y - 4) + "\" x2=\"" + num(lx + 22) +
             "\" y2=\"" + num(y - 4) + "\" stroke=\"" + color(labels[i]) +
             "\" stroke-width=\"2\"" + (dashed[i] ? " stroke-dasharray=\"5,3\"" : "") +
             "/>\n<text x=\"" + num(lx + 28) + "\" y=\"" + num(y) + "\">" + escape(labels[i]) +
             "</text>\n";
    }
    return out;
  }
};

// The panel's axes from its finite points (and their bars).
std::pair<Axis, Axis> panel_axes(const Panel& p) {
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  for (const auto& s : p.series) {
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      const double e = s.y_err.empty() ? 0.0 : s.y_err[i];
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      if ((p.log_x && s.x[i] <= 0) || (p.log_y && s.y[i] <= 0)) {
        throw Error(ErrorCode::kInvalidArgument,
                    "[plot] panel '" + p.title + "' has a non-positive value on a log axis");
      }
      xlo = std::min(xlo, s.x[i]);
      xhi = std::max(xhi, s.x[i]);
      ylo = std::min(ylo, p.log_y ? s.y[i] : s.y[i] - e);
      yhi = std::max(yhi, s.y[i] + e);
      if (!s.y_lo_hi.empty() && interval_drawable(s.y_lo_hi[i], p.log_y)) {
        ylo = std::min(ylo, s.y_lo_hi[i].first);
        yhi = std::max(yhi, s.y_lo_hi[i].second);
      }
    }
  }
  if (!std::isfinite(xlo)) {
    xlo = ylo = p.log_x ? 1 : 0;
    xhi = yhi = 1;
  }
  return {make_axis(xlo, xhi, p.log_x), make_axis(ylo, yhi, p.log_y)};
}

// The frame of a panel: title, box, grid, ticks and axis labels.
std::string panel_frame(const Panel& p, const Axis& ax, const Axis& ay, double ox, double oy) {
  const double x0 = ox + kMarginL, x1 = ox + kPanelW - kMarginR;
  const double y0 = oy + kPanelH - kMarginB, y1 = oy + kMarginT;
  std::string svg = "<g>\n<text x=\"" + num((x0 + x1) / 2) + "\" y=\"" + num(oy + 20) +
                    "\" text-anchor=\"middle\" font-size=\"13\">" + escape(p.title) + "</text>\n";
  svg += "<rect x=\"" + num(x0) + "\" y=\"" + num(y1) + "\" width=\"" + num(x1 - x0) +
         "\" height=\"" + num(y0 - y1) + "\" fill=\"none\" stroke=\"#444\"/>\n";
  for (double t : ax.ticks()) {
    const double x = ax.map(t, x0, x1);
    svg += "<line x1=\"" + num(x) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x) + "\" y2=\"" +
           num(y0) + "\" stroke=\"#eee\"/>\n";
    svg += "<text x=\"" + num(x) + "\" y=\"" + num(y0 + 14) + "\" text-anchor=\"middle\">" +
           tick_text(t) + "</text>\n";
  }
  for (double t : ay.ticks()) {
    const double y = ay.map(t, y0, y1);
    svg += "<line x1=\"" + num(x0) + "\" y1=\"" + num(y) + "\" x2=\"" + num(x1) + "\" y2=\"" +
           num(y) + "\" stroke=\"#eee\"/>\n";
    svg += "<text x=\"" + num(x0 - 4) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">" +
           tick_text(t) + "</text>\n";
  }
  svg += "<text x=\"" + num((x0 + x1) / 2) + "\" y=\"" + num(y0 + 32) +
         "\" text-anchor=\"middle\">" + escape(p.x_label) + "</text>\n";
  svg += "<text transform=\"translate(" + num(ox + 14) + "," + num((y0 + y1) / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">" + escape(p.y_label) + "</text>\n";
  return svg;
}

// One series: its line, markers and bars.
std::string series_svg(const Series& s, const char* color, bool log_y, const Axis& ax,
                       const Axis& ay, double x0, double x1, double y0, double y1) {
  std::string pts;
  for (std::size_t i = 0; i < s.x.size(); ++i) {
    if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
    pts += (pts.empty() ? "" : " ") + num(ax.map(s.x[i], x0, x1)) + "," +
           num(ay.map(s.y[i], y0, y1));
  }
  std::string svg = "<polyline fill=\"none\" stroke=\"" + std::string(color) +
                    "\" stroke-width=\"" + (s.highlight ? "3.2" : "1.6") + "\"" +
                    (s.dashed ? " stroke-dasharray=\"5,3\"" : "") + " points=\"" + pts + "\"/>\n";
  auto bar = [&](double x, double lo, double hi) {
    svg += "<line x1=\"" + num(x) + "\" y1=\"" + num(ay.map(lo, y0, y1)) + "\" x2=\"" + num(x) +
           "\" y2=\"" + num(ay.map(hi, y0, y1)) + "\" stroke=\"" + color + "\"/>\n";
  };
  for (std::size_t i = 0; i < s.x.size(); ++i) {
    if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
    const double x = ax.map(s.x[i], x0, x1), y = ay.map(s.y[i], y0, y1);
    svg += "<circle cx=\"" + num(x) + "\" cy=\"" + num(y) + "\" r=\"" +
           (s.highlight ? "4.5" : "2.5") + "\" fill=\"" + color + "\"/>\n";
    if (!s.y_lo_hi.empty() && interval_drawable(s.y_lo_hi[i], log_y))
      bar(x, s.y_lo_hi[i].first, s.y_lo_hi[i].second);
    if (!s.y_err.empty() && s.y_err[i] > 0 && !log_y) bar(x, s.y[i] - s.y_err[i], s.y[i] + s.y_err[i]);
  }
  return svg;
}

}  // namespace

std::string line_plot_svg(const std::string& title, const std::vector<Panel>& panels, int columns) {
  if (panels.empty()) throw Error(ErrorCode::kInvalidArgument, "[plot] no panels to draw");
  columns = std::max(1, std::min<int>(columns, static_cast<int>(panels.size())));
  const int rows = (static_cast<int>(panels.size()) + columns - 1) / columns;
  const Legend legend(panels);
  const int legend_rows = static_cast<int>(legend.labels.size());
  const int width = columns * kPanelW + kLegendW;
  const int height = std::max(kTitleH + rows * kPanelH, kTitleH + 20 + legend_rows * 18) + 10;
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) +
                    "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " +
                    std::to_string(width) + " " + std::to_string(height) +
                    "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + num(width / 2.0) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" +
         escape(title) + "</text>\n";
  for (std::size_t pi = 0; pi < panels.size(); ++pi) {
    const Panel& p = panels[pi];
    const double ox = static_cast<double>(static_cast<int>(pi) % columns) * kPanelW;
    const double oy = kTitleH + static_cast<double>(static_cast<int>(pi) / columns) * kPanelH;
    const auto [ax, ay] = panel_axes(p);
    svg += panel_frame(p, ax, ay, ox, oy);
    for (const auto& s : p.series) {
      svg += series_svg(s, legend.color(s.label), p.log_y, ax, ay, ox + kMarginL,
                        ox + kPanelW - kMarginR, oy + kPanelH - kMarginB, oy + kMarginT);
    }
    svg += "</g>\n";
  }
  svg += legend.svg(columns * kPanelW + 10);
  svg += "</svg>\n";
  return svg;
}

}  // namespace vq::eval
