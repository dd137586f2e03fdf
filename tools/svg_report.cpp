#include "tools/svg_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "runtime/error.h"
#include "runtime/io/output_file.h"

namespace hetmoe::cli {
namespace {

constexpr const char* kColors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948"};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '&') {
      out += "&amp;";
    } else {
      out += c;
    }
  }
  return out;
}

// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten, at least v.
double nice_ceiling(double v) {
  if (v <= 0) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= v) return m * p;
  return 10 * p;
}

// One bar chart of `value` per policy in the box (x, y, w, h).
void bars(std::string& svg, const std::vector<PolicyBar>& b, double PolicyBar::*value, const std::string& label,
          double x, double y, double w, double h) {
  double top = 0;
  for (const PolicyBar& p : b) top = std::max(top, p.*value);
  top = nice_ceiling(top);
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="13" font-weight="bold">{}</text>)", x, y - 8, escape(label));
  svg += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#333"/>)", x, y + h, x + w, y + h);
  for (int i = 0; i <= 4; ++i) {
    const double v = top * i / 4, yy = y + h - h * i / 4;
    svg += fmt::format(R"(<line x1="{}" y1="{:.1f}" x2="{}" y2="{:.1f}" stroke="#ddd"/>)", x, yy, x + w, yy);
    svg += fmt::format(R"(<text x="{}" y="{:.1f}" font-size="10" text-anchor="end">{:g}</text>)", x - 4, yy + 3, v);
  }
  const double slot = w / std::max<size_t>(b.size(), 1);
  for (size_t i = 0; i < b.size(); ++i) {
    const double v = b[i].*value, bh = top > 0 ? h * v / top : 0;
    const double bx = x + slot * static_cast<double>(i) + slot * 0.15;
    svg += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}"/>)", bx, y + h - bh,
                       slot * 0.7, bh, kColors[i % 7]);
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="10" text-anchor="middle">{:.1f}</text>)",
                       bx + slot * 0.35, y + h - bh - 3, v);
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11" text-anchor="middle">{}</text>)", bx + slot * 0.35,
                       y + h + 14, escape(b[i].policy));
  }
}

// A line of text that never runs past the picture's right edge: a line longer than the room (at about 0.6 em per
// character) is squeezed to fit instead of clipped.
std::string fitted_text(double x, double y, double size, const char* weight, const std::string& text, double room) {
  const double estimate = 0.6 * size * static_cast<double>(text.size());
  const std::string squeeze =
      estimate > room ? fmt::format(R"( textLength="{:.0f}" lengthAdjust="spacingAndGlyphs")", room) : "";
  return fmt::format(R"(<text x="{}" y="{}" font-size="{}" font-weight="{}"{}>{}</text>)", x, y, size, weight, squeeze,
                     escape(text));
}

}  // namespace

std::string policies_svg(const SvgLabels& labels, const std::vector<PolicyBar>& b,
                         const std::vector<CostCurve>& curves) {
  const double width = 960, height = 440;
  std::string svg = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif">)", width, height);
  svg += fmt::format(R"(<rect width="100%" height="100%" fill="white"/>)");
  svg += fitted_text(20, 24, 15, "bold", labels.title, width - 40);
  svg += fitted_text(20, 44, 12, "normal", labels.source, width - 40);
  const double top = 82;
  bars(svg, b, &PolicyBar::prefill_tok_s, "prefill tokens/s", 60, top, 190, 300);
  bars(svg, b, &PolicyBar::decode_tok_s, "decode tokens/s", 310, top, 190, 300);

  // The curves: seconds (log) against rows (log), one expert.
  const double cx = 580, cy = top, cw = 340, ch = 300;
  svg += fmt::format(R"(<text x="{}" y="{}" font-size="13" font-weight="bold">one expert: time against rows</text>)",
                     cx, cy - 8);
  double lo = 1e30, hi = 0;
  int64_t max_rows = 1;
  for (const CostCurve& c : curves)
    for (size_t i = 0; i < c.rows.size(); ++i) {
      if (c.seconds[i] > 0) lo = std::min(lo, c.seconds[i]);
      hi = std::max(hi, c.seconds[i]);
      max_rows = std::max(max_rows, c.rows[i]);
    }
  if (curves.empty() || hi <= 0) {
    svg += fitted_text(cx, cy + 20, 11, "normal", labels.no_curves, width - cx - 10);
    return svg + "</svg>\n";
  }
  const double ly0 = std::floor(std::log10(lo)), ly1 = std::ceil(std::log10(hi));
  const double lx1 = std::log10(static_cast<double>(max_rows));
  auto px = [&](double rows) { return cx + cw * std::log10(std::max(rows, 1.0)) / std::max(lx1, 1e-9); };
  auto py = [&](double s) { return cy + ch - ch * (std::log10(s) - ly0) / std::max(ly1 - ly0, 1e-9); };
  svg += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#333"/>)", cx, cy, cw, ch);
  for (double e = ly0; e <= ly1; e += 1)
    svg += fmt::format(R"(<text x="{}" y="{:.1f}" font-size="10" text-anchor="end">{:g} ms</text>)", cx - 4,
                       py(std::pow(10.0, e)) + 3, std::pow(10.0, e) * 1e3);
  for (double r = 1; r <= static_cast<double>(max_rows); r *= 4)
    svg += fmt::format(R"(<text x="{:.1f}" y="{}" font-size="10" text-anchor="middle">{:g}</text>)", px(r),
                       cy + ch + 14, r);
  svg +=
      fmt::format(R"(<text x="{}" y="{}" font-size="10" text-anchor="middle">rows</text>)", cx + cw / 2, cy + ch + 28);
  for (size_t k = 0; k < curves.size(); ++k) {
    const CostCurve& c = curves[k];
    std::string points;
    for (size_t i = 0; i < c.rows.size(); ++i)
      if (c.seconds[i] > 0)
        points += fmt::format("{:.1f},{:.1f} ", px(static_cast<double>(c.rows[i])), py(c.seconds[i]));
    svg += fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>)", points, kColors[k % 7]);
    svg += fmt::format(R"(<text x="{}" y="{}" font-size="11" fill="{}">{}</text>)", cx + 8, cy + 16 + 14 * k,
                       kColors[k % 7], escape(c.label));
    if (c.crossover > 0)
      svg += fmt::format(R"(<line x1="{:.1f}" y1="{}" x2="{:.1f}" y2="{}" stroke="{}" stroke-dasharray="4 3"/>)",
                         px(static_cast<double>(c.crossover)), cy, px(static_cast<double>(c.crossover)), cy + ch,
                         kColors[k % 7]);
  }
  return svg + "</svg>\n";
}

std::vector<CostCurve> crossover_curves(const sched::Machine& machine, const sched::ExpertShape& e) {
  if (!machine.gpu) return {};
  const sched::CostModel cost = machine.cost_model();
  std::vector<CostCurve> curves;
  for (const sched::CpuTier& t : cost.tiers()) {
    CostCurve c{.label = "CPU " + t.isa, .rows = {}, .seconds = {}, .crossover = cost.crossover(t.isa, e).value_or(-1)};
    for (int64_t r = 1; r <= 4096; r *= 2) {
      c.rows.push_back(r);
      c.seconds.push_back(cost.cpu_seconds(t.isa, e, r));
    }
    curves.push_back(std::move(c));
  }
  CostCurve moved{.label = "move + " + machine.gpu_name, .rows = {}, .seconds = {}, .crossover = -1};
  for (int64_t r = 1; r <= 4096; r *= 2) {
    moved.rows.push_back(r);
    moved.seconds.push_back(cost.moved_seconds(e, r));
  }
  curves.push_back(std::move(moved));
  return curves;
}

void write_svg(const std::string& path, const std::string& svg) { io::write_file(path, svg); }

}  // namespace hetmoe::cli
