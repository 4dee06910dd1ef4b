// graft::plot implementation: layout and drawing with cairo, atomic PNG output.
#include "examples/common/plot.h"

#include <cairo.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "graft/nn/train/checkpoint.h"

namespace graft::plot {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr const char* kFontFamily = "sans-serif";

// ---------------------------------------------------------------- cairo RAII

struct SurfaceDeleter {
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
struct ContextDeleter {
  void operator()(cairo_t* c) const { cairo_destroy(c); }
};
using SurfacePtr = std::unique_ptr<cairo_surface_t, SurfaceDeleter>;
using ContextPtr = std::unique_ptr<cairo_t, ContextDeleter>;

[[noreturn]] void fail(const char* fn, const std::string& what) {
  throw std::runtime_error(std::string(fn) + ": " + what);
}

// Creates an opaque white canvas; throws if cairo cannot allocate it.
std::pair<SurfacePtr, ContextPtr> make_canvas(const char* fn, int width, int height) {
  SurfacePtr surface(cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height));
  if (cairo_surface_status(surface.get()) != CAIRO_STATUS_SUCCESS)
    fail(fn, "cannot create " + std::to_string(width) + "x" + std::to_string(height) +
                 " image: " + cairo_status_to_string(cairo_surface_status(surface.get())));
  ContextPtr cr(cairo_create(surface.get()));
  if (cairo_status(cr.get()) != CAIRO_STATUS_SUCCESS)
    fail(fn, std::string("cannot create drawing context: ") +
                 cairo_status_to_string(cairo_status(cr.get())));
  cairo_set_source_rgb(cr.get(), 1, 1, 1);
  cairo_paint(cr.get());
  return {std::move(surface), std::move(cr)};
}

// cairo's PNG bytes, appended to a std::string. No exception may cross cairo's C frames: an
// out-of-memory append is reported to cairo as its own error.
cairo_status_t append_png_bytes(void* closure, const unsigned char* data, unsigned int length) {
  try {
    static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  } catch (const std::bad_alloc&) {
    return CAIRO_STATUS_NO_MEMORY;
  }
  return CAIRO_STATUS_SUCCESS;
}

// Encodes the surface as PNG and writes it through train::atomic_write (a temp file created
// exclusively beside path, never through a planted link). On any failure the temp file is
// removed and the target is left untouched.
void write_png_atomic(const char* fn, cairo_t* cr, cairo_surface_t* surface,
                      const std::string& path) {
  if (cairo_status(cr) != CAIRO_STATUS_SUCCESS)
    fail(fn, std::string("drawing failed: ") + cairo_status_to_string(cairo_status(cr)));
  cairo_surface_flush(surface);
  std::string png;
  const cairo_status_t st = cairo_surface_write_to_png_stream(surface, append_png_bytes, &png);
  if (st != CAIRO_STATUS_SUCCESS)
    fail(fn, "cannot write '" + path + "': " + cairo_status_to_string(st));
  try {
    train::atomic_write(
        path, [&](std::ostream& os) { os.write(png.data(), std::streamsize(png.size())); });
  } catch (const std::exception& e) {
    fail(fn, "cannot write '" + path + "': " + e.what());
  }
}

// ---------------------------------------------------------------- text

// Returns s as valid UTF-8 (cairo rejects anything else and would put the
// context into an error state): malformed sequences become U+FFFD and control
// characters become spaces.
std::string clean_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      out += (c < 0x20 || c == 0x7f) ? ' ' : static_cast<char>(c);
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
      cp = c & 0x1fu;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      cp = c & 0x0fu;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      cp = c & 0x07u;
    }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xc0u) != 0x80u) ok = false;
      else cp = (cp << 6) | (p[i + k] & 0x3fu);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF.
    if (ok && ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
               (cp >= 0xd800 && cp <= 0xdfff)))
      ok = false;
    if (ok) {
      if (cp >= 0x80 && cp < 0xa0) out += ' ';  // C1 controls
      else out.append(s, i, len);
      i += len;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out;
}

void set_font(cairo_t* cr, double size, bool bold = false) {
  cairo_select_font_face(cr, kFontFamily, CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
}

// Advance width of (already clean) text in the current font.
double text_width(cairo_t* cr, const std::string& s) {
  if (s.empty()) return 0;
  cairo_text_extents_t ext;
  cairo_text_extents(cr, s.c_str(), &ext);
  return ext.x_advance;
}

// Height of a line of text in the current font (ascent + descent).
double line_height(cairo_t* cr) {
  cairo_font_extents_t fe;
  cairo_font_extents(cr, &fe);
  return fe.ascent + fe.descent;
}

// Shortens s (at code point boundaries) with a trailing "…" until it fits max_w.
std::string fit_text(cairo_t* cr, const std::string& s, double max_w) {
  if (text_width(cr, s) <= max_w) return s;
  std::string cut = s;
  while (!cut.empty()) {
    size_t k = cut.size() - 1;
    while (k > 0 && (static_cast<unsigned char>(cut[k]) & 0xc0u) == 0x80u) --k;
    cut.erase(k);
    const std::string t = cut + "\xe2\x80\xa6";
    if (text_width(cr, t) <= max_w) return t;
  }
  return "\xe2\x80\xa6";
}

// Draws text with its anchor at (x, y): ha = 0 left, 0.5 centre, 1 right;
// y is the vertical centre of the line.
void draw_text(cairo_t* cr, const std::string& s, double x, double y, double ha) {
  if (s.empty()) return;
  cairo_font_extents_t fe;
  cairo_font_extents(cr, &fe);
  const double w = text_width(cr, s);
  cairo_move_to(cr, x - ha * w, y + (fe.ascent - fe.descent) / 2);
  cairo_show_text(cr, s.c_str());
}

// Same, rotated 90 degrees counter-clockwise (reads bottom to top); ha is along
// the text direction, (x, y) the anchor, x the vertical centre of the line.
void draw_text_up(cairo_t* cr, const std::string& s, double x, double y, double ha) {
  if (s.empty()) return;
  cairo_save(cr);
  cairo_translate(cr, x, y);
  cairo_rotate(cr, -kPi / 2);
  draw_text(cr, s, 0, 0, ha);
  cairo_restore(cr);
}

// ---------------------------------------------------------------- ticks

struct Ticks {
  std::vector<double> pos;          // in axis coordinates (log10 for log axes)
  std::vector<std::string> labels;  // one per position
};

// Step of roughly (hi - lo) / target rounded to 1, 2 or 5 times a power of ten.
double nice_step(double lo, double hi, int target) {
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double m = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  return m * mag;
}

std::string format_number(double v, double step) {
  char buf[64];
  const double a = std::fabs(v);
  if (a < std::fabs(step) * 1e-9) v = 0;
  if (a >= 1e6 || (a != 0 && a < 1e-4) || step < 1e-5) {
    std::snprintf(buf, sizeof buf, "%.4g", v);
  } else {
    const int decimals = std::clamp(static_cast<int>(-std::floor(std::log10(step) + 1e-9)), 0, 8);
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  }
  std::string s = buf;
  if (s == "-0") s = "0";
  return s;
}

Ticks linear_ticks(double lo, double hi, int target) {
  Ticks t;
  const double step = nice_step(lo, hi, target);
  if (!(step > 0) || !std::isfinite(step)) return t;
  const double k0 = std::ceil(lo / step - 1e-9), k1 = std::floor(hi / step + 1e-9);
  for (double k = k0; k <= k1 && t.pos.size() < 200; k += 1) {
    const double v = k * step;
    t.pos.push_back(v);
    t.labels.push_back(format_number(v, step));
  }
  return t;
}

std::string format_log(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Ticks for a log10 axis spanning [lo, hi] (exponents).
Ticks log_ticks(double lo, double hi, int target) {
  Ticks t;
  const double d0 = std::ceil(lo - 1e-9), d1 = std::floor(hi + 1e-9);
  if (d1 - d0 + 1 >= 2) {  // at least two decades: label powers of ten
    const int every = std::max(1, static_cast<int>(std::ceil((d1 - d0 + 1) / std::max(target, 2))));
    for (double d = d0; d <= d1; d += every) {
      t.pos.push_back(d);
      t.labels.push_back(format_log(std::pow(10.0, d)));
    }
    return t;
  }
  // Within about a decade: the densest of these mantissa sets that fits.
  const std::vector<std::vector<double>> sets{{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 2, 3, 5}, {1, 2, 5}};
  for (size_t si = 0; si < sets.size(); ++si) {
    t = Ticks{};
    for (double d = std::floor(lo); d <= std::ceil(hi); d += 1)
      for (const double m : sets[si]) {
        const double e = d + std::log10(m);
        if (e >= lo - 1e-9 && e <= hi + 1e-9) {
          t.pos.push_back(e);
          t.labels.push_back(format_log(m * std::pow(10.0, d)));
        }
      }
    if (t.pos.size() < 2) break;  // too narrow for any set
    if (static_cast<int>(t.pos.size()) <= target || si + 1 == sets.size()) return t;
  }
  // Less than a factor of ~2 in range: evenly spaced values, placed on the log axis.
  const Ticks lin = linear_ticks(std::pow(10.0, lo), std::pow(10.0, hi), std::min(target, 5));
  t = Ticks{};
  for (size_t i = 0; i < lin.pos.size(); ++i)
    if (lin.pos[i] > 0) {
      t.pos.push_back(std::log10(lin.pos[i]));
      t.labels.push_back(lin.labels[i]);
    }
  return t;
}

// ---------------------------------------------------------------- line chart

struct Rgb {
  double r, g, b;
};

constexpr std::array<Rgb, 10> kPalette{{{0.16, 0.42, 0.76},
                                        {0.91, 0.47, 0.11},
                                        {0.20, 0.60, 0.27},
                                        {0.82, 0.17, 0.20},
                                        {0.52, 0.36, 0.76},
                                        {0.55, 0.36, 0.27},
                                        {0.88, 0.42, 0.70},
                                        {0.45, 0.45, 0.45},
                                        {0.68, 0.68, 0.12},
                                        {0.10, 0.68, 0.78}}};

constexpr double kLimit = 1e150;  // larger magnitudes are treated like inf

struct Range {
  double lo, hi;
};

// Pads [lo, hi] by frac of its width; a degenerate range gets a sensible width.
Range pad_range(double lo, double hi, double frac, double unit_if_zero) {
  double span = hi - lo;
  if (!(span > std::max(std::fabs(lo), std::fabs(hi)) * 1e-12)) {
    const double mid = (lo + hi) / 2;
    const double half = mid != 0 ? std::fabs(mid) * 0.05 : unit_if_zero;
    return {mid - half, mid + half};
  }
  return {lo - span * frac, hi + span * frac};
}

struct Point {
  double x, y;  // axis coordinates (y already log10 on log axes)
};

std::vector<Point> usable_points(const Series& s, bool log_y) {
  std::vector<Point> pts;
  for (size_t i = 0; i < s.x.size(); ++i) {
    const double x = s.x[i], y = s.y[i];
    if (!std::isfinite(x) || !std::isfinite(y) || std::fabs(x) > kLimit || std::fabs(y) > kLimit)
      continue;
    if (log_y) {
      if (!(y > 0) || y < 1 / kLimit) continue;
      pts.push_back({x, std::log10(y)});
    } else {
      pts.push_back({x, y});
    }
  }
  return pts;
}

// A panel's plot area on the page: where the axes go, their ranges and ticks, the fonts' line
// heights, and the data in axis units.
struct PanelLayout {
  double px0 = 0, pw = 0;                 // the panel's column on the page
  double ax = 0, ay = 0, aw = 1, ah = 1;  // the plot area
  Range xr{0, 1}, yr{0, 1};
  Ticks xt, yt;
  double title_h = 0, label_h = 0, tick_h = 0;
  std::vector<std::vector<Point>> data;  // per series, in axis units (log10 on a log axis)
  double sx(double x) const { return ax + (x - xr.lo) / (xr.hi - xr.lo) * aw; }
  double sy(double y) const { return ay + ah - (y - yr.lo) / (yr.hi - yr.lo) * ah; }
};

constexpr double kTickFont = 11, kLabelFont = 12.5, kTitleFont = 15, kTickLen = 4;

// The data's range, padded (an empty panel gets 0..1; log axes 1..10).
void fit_ranges(const Panel& panel, PanelLayout& L) {
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (const Series& s : panel.series) {
    L.data.push_back(usable_points(s, panel.log_y));
    for (const Point& p : L.data.back()) {
      xmin = std::min(xmin, p.x);
      xmax = std::max(xmax, p.x);
      ymin = std::min(ymin, p.y);
      ymax = std::max(ymax, p.y);
    }
  }
  if (xmin <= xmax) {
    L.xr = pad_range(xmin, xmax, 0.03, 0.5);
    L.yr = pad_range(ymin, ymax, 0.05, 0.5);
  }
}

// Margins from the title, labels and tick labels; x ticks thinned until their labels do not
// collide.
PanelLayout lay_out_panel(cairo_t* cr, const Panel& panel, double px0, double pw, double height) {
  PanelLayout L;
  L.px0 = px0, L.pw = pw;
  fit_ranges(panel, L);
  set_font(cr, kTitleFont, true);
  L.title_h = line_height(cr);
  set_font(cr, kLabelFont);
  L.label_h = line_height(cr);
  set_font(cr, kTickFont);
  L.tick_h = line_height(cr);
  const double top = 8 + (clean_utf8(panel.title).empty() ? 6 : L.title_h + 8);
  const double bottom =
      6 + (clean_utf8(panel.xlabel).empty() ? 0 : L.label_h + 4) + L.tick_h + kTickLen + 4;
  L.ay = top, L.ah = std::max(1.0, height - top - bottom);

  const int ytarget = std::max(2, static_cast<int>(L.ah / 45));
  L.yt =
      panel.log_y ? log_ticks(L.yr.lo, L.yr.hi, ytarget) : linear_ticks(L.yr.lo, L.yr.hi, ytarget);
  double ytick_w = 0;
  for (const auto& l : L.yt.labels) ytick_w = std::max(ytick_w, text_width(cr, l));
  const double left =
      8 + (clean_utf8(panel.ylabel).empty() ? 0 : L.label_h + 6) + ytick_w + kTickLen + 4;
  const double right = 16;
  L.ax = px0 + left, L.aw = std::max(1.0, pw - left - right);

  for (int target = std::max(2, static_cast<int>(L.aw / 80)); target >= 1; --target) {
    L.xt = linear_ticks(L.xr.lo, L.xr.hi, target);
    double w = 0;
    for (const auto& l : L.xt.labels) w = std::max(w, text_width(cr, l));
    const double spacing =
        L.xt.pos.size() >= 2 ? (L.xt.pos[1] - L.xt.pos[0]) / (L.xr.hi - L.xr.lo) * L.aw : L.aw;
    if (spacing >= w + 12) break;
  }
  return L;
}

void draw_grid(cairo_t* cr, const PanelLayout& L) {
  cairo_set_line_width(cr, 1);
  cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
  for (const double v : L.xt.pos) {
    const double x = std::round(L.sx(v)) + 0.5;
    cairo_move_to(cr, x, L.ay);
    cairo_line_to(cr, x, L.ay + L.ah);
  }
  for (const double v : L.yt.pos) {
    const double y = std::round(L.sy(v)) + 0.5;
    cairo_move_to(cr, L.ax, y);
    cairo_line_to(cr, L.ax + L.aw, y);
  }
  cairo_stroke(cr);
}

// Each series as a line, with dots when it has few points, clipped to the plot area.
void draw_series(cairo_t* cr, const PanelLayout& L) {
  cairo_save(cr);
  cairo_rectangle(cr, L.ax, L.ay, L.aw, L.ah);
  cairo_clip(cr);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
  for (size_t i = 0; i < L.data.size(); ++i) {
    const Rgb c = kPalette[i % kPalette.size()];
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    const auto& pts = L.data[i];
    if (pts.size() >= 2) {
      cairo_set_line_width(cr, 1.8);
      cairo_move_to(cr, L.sx(pts[0].x), L.sy(pts[0].y));
      for (size_t k = 1; k < pts.size(); ++k) cairo_line_to(cr, L.sx(pts[k].x), L.sy(pts[k].y));
      cairo_stroke(cr);
    }
    if (pts.size() <= 40) {
      const double r = pts.size() == 1 ? 4 : 2.8;
      for (const Point& p : pts) {
        cairo_new_sub_path(cr);
        cairo_arc(cr, L.sx(p.x), L.sy(p.y), r, 0, 2 * kPi);
      }
      cairo_fill(cr);
    }
  }
  cairo_restore(cr);
}

// Frame, tick marks and tick labels.
void draw_frame_and_ticks(cairo_t* cr, const PanelLayout& L) {
  const double ax = L.ax, ay = L.ay, aw = L.aw, ah = L.ah;
  cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, std::round(ax) + 0.5, std::round(ay) + 0.5, std::round(aw), std::round(ah));
  for (const double v : L.xt.pos) {
    const double x = std::round(L.sx(v)) + 0.5;
    cairo_move_to(cr, x, std::round(ay + ah) + 0.5);
    cairo_line_to(cr, x, std::round(ay + ah) + 0.5 + kTickLen);
  }
  for (const double v : L.yt.pos) {
    const double y = std::round(L.sy(v)) + 0.5;
    cairo_move_to(cr, std::round(ax) + 0.5, y);
    cairo_line_to(cr, std::round(ax) + 0.5 - kTickLen, y);
  }
  cairo_stroke(cr);
  cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
  set_font(cr, kTickFont);
  for (size_t i = 0; i < L.xt.pos.size(); ++i) {
    const double w = text_width(cr, L.xt.labels[i]);
    const double x = std::clamp(L.sx(L.xt.pos[i]), L.px0 + 2 + w / 2, L.px0 + L.pw - 2 - w / 2);
    draw_text(cr, L.xt.labels[i], x, ay + ah + kTickLen + 3 + L.tick_h / 2, 0.5);
  }
  for (size_t i = 0; i < L.yt.pos.size(); ++i)
    draw_text(cr, L.yt.labels[i], ax - kTickLen - 4, L.sy(L.yt.pos[i]), 1.0);
}

void draw_labels_and_title(cairo_t* cr, const PanelLayout& L, const std::string& title,
                           const std::string& xlabel, const std::string& ylabel) {
  cairo_set_source_rgb(cr, 0, 0, 0);
  set_font(cr, kLabelFont);
  if (!xlabel.empty())
    draw_text(cr, fit_text(cr, xlabel, L.aw), L.ax + L.aw / 2,
              L.ay + L.ah + kTickLen + 3 + L.tick_h + 4 + L.label_h / 2, 0.5);
  if (!ylabel.empty())
    draw_text_up(cr, fit_text(cr, ylabel, L.ah), L.px0 + 8 + L.label_h / 2, L.ay + L.ah / 2, 0.5);
  if (title.empty()) return;
  set_font(cr, kTitleFont, true);
  const std::string t = fit_text(cr, title, L.pw - 16);
  const double w = text_width(cr, t);  // centred over the plot area, kept inside the panel
  draw_text(cr, t,
            std::clamp(L.ax + L.aw / 2, L.px0 + 8 + w / 2,
                       std::max(L.px0 + 8 + w / 2, L.px0 + L.pw - 8 - w / 2)),
            8 + L.title_h / 2, 0.5);
}

// Of the plot area's four corners, the one where a box of lw x lh hides the fewest data points
// (and segment midpoints).
std::pair<double, double> emptiest_corner(const PanelLayout& L, double lw, double lh) {
  const double inset = 8;
  const std::array<std::pair<double, double>, 4> corners{
      {{L.ax + L.aw - inset - lw, L.ay + inset},
       {L.ax + inset, L.ay + inset},
       {L.ax + L.aw - inset - lw, L.ay + L.ah - inset - lh},
       {L.ax + inset, L.ay + L.ah - inset - lh}}};
  size_t best = 0, best_hits = SIZE_MAX;
  for (size_t c = 0; c < corners.size(); ++c) {
    const double lx = corners[c].first,
                 ly = corners[c].second;  // no structured binding: clang 14 cannot capture one
    size_t hits = 0;
    auto inside = [&](double x, double y) {
      return x >= lx && x <= lx + lw && y >= ly && y <= ly + lh;
    };
    for (const auto& pts : L.data)
      for (size_t k = 0; k < pts.size(); ++k) {
        const double x = L.sx(pts[k].x), y = L.sy(pts[k].y);
        hits += inside(x, y);
        if (k > 0) hits += inside((x + L.sx(pts[k - 1].x)) / 2, (y + L.sy(pts[k - 1].y)) / 2);
      }
    if (hits < best_hits) {
      best_hits = hits;
      best = c;
    }
  }
  return corners[best];
}

// The legend of the named series, in the plot corner that hides the fewest data points.
void draw_legend(cairo_t* cr, const PanelLayout& L, const Panel& panel) {
  std::vector<std::pair<std::string, size_t>> entries;
  for (size_t i = 0; i < panel.series.size(); ++i)
    if (!panel.series[i].name.empty()) entries.emplace_back(clean_utf8(panel.series[i].name), i);
  if (entries.empty()) return;
  const double lfont = 12, row_h = 18, sample_w = 24, padding = 7;
  set_font(cr, lfont);
  double name_w = 0;
  for (auto& e : entries) {
    e.first = fit_text(cr, e.first, std::max(40.0, L.aw * 0.6));
    name_w = std::max(name_w, text_width(cr, e.first));
  }
  const double lw = padding + sample_w + 6 + name_w + padding;
  const double lh = padding * 2 + row_h * static_cast<double>(entries.size()) - 4;
  const auto [lx, ly] = emptiest_corner(L, lw, lh);
  cairo_rectangle(cr, std::round(lx) + 0.5, std::round(ly) + 0.5, std::round(lw), std::round(lh));
  cairo_set_source_rgba(cr, 1, 1, 1, 0.88);
  cairo_fill_preserve(cr);
  cairo_set_source_rgb(cr, 0.75, 0.75, 0.75);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  for (size_t k = 0; k < entries.size(); ++k) {
    const double y = ly + padding + row_h * (static_cast<double>(k) + 0.5) - 2;
    const Rgb c = kPalette[entries[k].second % kPalette.size()];
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    cairo_set_line_width(cr, 2.2);
    cairo_move_to(cr, lx + padding, y);
    cairo_line_to(cr, lx + padding + sample_w, y);
    cairo_stroke(cr);
    if (L.data[entries[k].second].size() <= 40) {  // same rule as for the curve
      cairo_arc(cr, lx + padding + sample_w / 2, y, 2.8, 0, 2 * kPi);
      cairo_fill(cr);
    }
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    draw_text(cr, entries[k].first, lx + padding + sample_w + 6, y, 0);
  }
}

void draw_panel(cairo_t* cr, const Panel& panel, double px0, double pw, double height) {
  const PanelLayout L = lay_out_panel(cr, panel, px0, pw, height);
  draw_grid(cr, L);
  draw_series(cr, L);
  draw_frame_and_ticks(cr, L);
  draw_labels_and_title(cr, L, clean_utf8(panel.title), clean_utf8(panel.xlabel),
                        clean_utf8(panel.ylabel));
  draw_legend(cr, L, panel);
}

// ---------------------------------------------------------------- heatmap

// Own colour ramp, dark violet to pale yellow, with luminance rising
// monotonically so brighter always means a larger value.
Rgb ramp(double v) {
  static constexpr std::array<Rgb, 5> stops{{{0.03, 0.02, 0.12},
                                             {0.25, 0.07, 0.46},
                                             {0.70, 0.18, 0.42},
                                             {0.97, 0.52, 0.20},
                                             {0.99, 0.96, 0.62}}};
  v = std::clamp(v, 0.0, 1.0) * (stops.size() - 1);
  const size_t i = std::min(static_cast<size_t>(v), stops.size() - 2);
  const double t = v - static_cast<double>(i);
  const Rgb a = stops[i], b = stops[i + 1];
  return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t};
}

}  // namespace

void line_chart(const std::string& png_path, const std::vector<Panel>& panels, int width,
                int height) {
  const char* fn = "line_chart";
  if (panels.empty()) fail(fn, "no panels");
  if (width < 1 || height < 1 || width > 32767 || height > 32767)
    fail(fn, "invalid size " + std::to_string(width) + "x" + std::to_string(height));
  for (const Panel& p : panels)
    for (const Series& s : p.series)
      if (s.x.size() != s.y.size())
        fail(fn, "series '" + s.name + "' in panel '" + p.title + "' has " +
                     std::to_string(s.x.size()) + " x values but " + std::to_string(s.y.size()) +
                     " y values");

  auto [surface, cr] = make_canvas(fn, width, height);
  const double pw = static_cast<double>(width) / static_cast<double>(panels.size());
  for (size_t i = 0; i < panels.size(); ++i) {
    cairo_save(cr.get());
    const double px0 = std::round(pw * static_cast<double>(i));
    const double px1 = std::round(pw * static_cast<double>(i + 1));
    cairo_rectangle(cr.get(), px0, 0, px1 - px0, height);
    cairo_clip(cr.get());
    draw_panel(cr.get(), panels[i], px0, px1 - px0, height);
    cairo_restore(cr.get());
  }
  write_png_atomic(fn, cr.get(), surface.get(), png_path);
}

namespace {

// The matrix is rectangular, the labels match it, and it is small enough to draw.
void check_heatmap_input(const char* fn, const std::vector<std::vector<double>>& m,
                         const std::vector<std::string>& row_labels,
                         const std::vector<std::string>& col_labels) {
  if (m.empty() || m[0].empty()) fail(fn, "matrix is empty");
  const size_t rows = m.size(), cols = m[0].size();
  for (size_t r = 1; r < rows; ++r)
    if (m[r].size() != cols)
      fail(fn, "row " + std::to_string(r) + " has " + std::to_string(m[r].size()) +
                   " values but row 0 has " + std::to_string(cols));
  const std::string dims = std::to_string(rows) + "x" + std::to_string(cols);
  if (row_labels.size() != rows)
    fail(fn, "matrix is " + dims + " but " + std::to_string(row_labels.size()) + " row labels");
  if (col_labels.size() != cols)
    fail(fn, "matrix is " + dims + " but " + std::to_string(col_labels.size()) + " column labels");
  if (rows > 4000 || cols > 4000)
    fail(fn, "matrix is " + dims + ", too large to draw (max 4000x4000)");
}

// Where a heatmap's parts go. The labels decide the image size, so they are measured first.
struct HeatmapLayout {
  size_t rows = 0, cols = 0, stride = 1;  // every stride-th row/column is labelled
  double cell = 0, font = 0;
  std::vector<std::string> rl, cl;  // labels, cleaned and fitted
  double title_h = 0;
  double grid_w = 0, grid_h = 0, bar_w = 16, bar_h = 0, x0 = 0, y0 = 0, bar_x = 0;
  int width = 0, height = 0;
};

constexpr double kHeatMargin = 14, kHeatTickLen = 4, kHeatTickFont = 11, kHeatTitleFont = 16;

HeatmapLayout lay_out_heatmap(const char* fn, size_t rows, size_t cols,
                              const std::vector<std::string>& row_labels,
                              const std::vector<std::string>& col_labels,
                              const std::string& title) {
  HeatmapLayout L;
  L.rows = rows, L.cols = cols;
  // Cell size: large for short sentences, never below 14 px while labels can
  // still be shown on every row/column; huge matrices get thinned labels.
  const size_t maxdim = std::max(rows, cols);
  L.cell = std::clamp(std::floor(640.0 / static_cast<double>(maxdim)), 14.0, 40.0);
  if (maxdim > 160) L.cell = std::max(2.0, std::floor(2400.0 / static_cast<double>(maxdim)));
  L.font = std::clamp(L.cell * 0.62, 10.0, 14.0);
  L.stride = static_cast<size_t>(std::ceil((L.font + 2) / L.cell));
  const double max_label_w = 180;

  // Measure on a scratch surface.
  L.rl.resize(rows), L.cl.resize(cols);
  double row_w = 0, col_w = 0, title_w = 0, bar_label_w = 0;
  {
    auto [scratch_surface, scratch] = make_canvas(fn, 1, 1);
    cairo_t* c = scratch.get();
    set_font(c, L.font);
    for (size_t r = 0; r < rows; ++r) {
      L.rl[r] = fit_text(c, clean_utf8(row_labels[r]), max_label_w);
      if (r % L.stride == 0) row_w = std::max(row_w, text_width(c, L.rl[r]));
    }
    for (size_t k = 0; k < cols; ++k) {
      L.cl[k] = fit_text(c, clean_utf8(col_labels[k]), max_label_w);
      if (k % L.stride == 0) col_w = std::max(col_w, text_width(c, L.cl[k]));
    }
    set_font(c, kHeatTickFont);
    bar_label_w = text_width(c, "0.75");
    set_font(c, kHeatTitleFont, true);
    L.title_h = line_height(c);
    title_w = text_width(c, clean_utf8(title));
  }

  L.grid_w = L.cell * static_cast<double>(cols), L.grid_h = L.cell * static_cast<double>(rows);
  const double bar_gap = 24;
  L.bar_h = std::max(L.grid_h, 160.0);
  const double content_w = kHeatMargin + row_w + kHeatTickLen + 4 + L.grid_w + bar_gap + L.bar_w +
                           kHeatTickLen + 4 + bar_label_w + kHeatMargin;
  const double title_box = title_w + 2 * kHeatMargin;
  const double shift =
      title_box > content_w ? std::floor((title_box - content_w) / 2) : 0;  // centre under title
  L.x0 = std::round(shift + kHeatMargin + row_w + kHeatTickLen + 4);
  L.y0 = std::round(kHeatMargin + (title.empty() ? 0 : L.title_h + 12));
  L.bar_x = L.x0 + L.grid_w + bar_gap;
  const double content_h =
      L.y0 + std::max(L.grid_h + kHeatTickLen + 4 + col_w, L.bar_h) + kHeatMargin;
  L.width = static_cast<int>(std::ceil(std::max(content_w, title_box)));
  L.height = static_cast<int>(std::ceil(content_h));
  return L;
}

// Cells and the colour bar, with crisp edges (integer cell size and origin).
void draw_heatmap_cells(cairo_t* cr, const HeatmapLayout& L,
                        const std::vector<std::vector<double>>& m) {
  cairo_set_antialias(cr, CAIRO_ANTIALIAS_NONE);
  for (size_t r = 0; r < L.rows; ++r)
    for (size_t k = 0; k < L.cols; ++k) {
      const double v = m[r][k];
      if (std::isfinite(v)) {
        const Rgb c = ramp(v);
        cairo_set_source_rgb(cr, c.r, c.g, c.b);
      } else {
        cairo_set_source_rgb(cr, 0.8, 0.8, 0.8);
      }
      cairo_rectangle(cr, L.x0 + L.cell * static_cast<double>(k),
                      L.y0 + L.cell * static_cast<double>(r), L.cell, L.cell);
      cairo_fill(cr);
    }
  const int bar_steps = static_cast<int>(L.bar_h);
  for (int i = 0; i < bar_steps; ++i) {
    const Rgb c = ramp(1.0 - (i + 0.5) / bar_steps);
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    cairo_rectangle(cr, L.bar_x, L.y0 + i, L.bar_w, 1);
    cairo_fill(cr);
  }
  cairo_set_antialias(cr, CAIRO_ANTIALIAS_DEFAULT);
}

void draw_heatmap_frames(cairo_t* cr, const HeatmapLayout& L) {
  cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, L.x0 - 0.5, L.y0 - 0.5, L.grid_w + 1, L.grid_h + 1);
  cairo_rectangle(cr, L.bar_x - 0.5, L.y0 - 0.5, L.bar_w + 1, L.bar_h + 1);
  for (size_t r = 0; r < L.rows; r += L.stride) {
    const double y = std::round(L.y0 + L.cell * (static_cast<double>(r) + 0.5)) + 0.5;
    cairo_move_to(cr, L.x0 - 0.5, y);
    cairo_line_to(cr, L.x0 - 0.5 - kHeatTickLen, y);
  }
  for (size_t k = 0; k < L.cols; k += L.stride) {
    const double x = std::round(L.x0 + L.cell * (static_cast<double>(k) + 0.5)) + 0.5;
    cairo_move_to(cr, x, L.y0 + L.grid_h + 0.5);
    cairo_line_to(cr, x, L.y0 + L.grid_h + 0.5 + kHeatTickLen);
  }
  for (int i = 0; i <= 4; ++i) {
    const double y = std::round(L.y0 + L.bar_h * (1 - i / 4.0)) - (i == 0 ? 0.5 : -0.5);
    cairo_move_to(cr, L.bar_x + L.bar_w + 0.5, y);
    cairo_line_to(cr, L.bar_x + L.bar_w + 0.5 + kHeatTickLen, y);
  }
  cairo_stroke(cr);
}

void draw_heatmap_labels(cairo_t* cr, const HeatmapLayout& L, const std::string& title) {
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  set_font(cr, L.font);
  for (size_t r = 0; r < L.rows; r += L.stride)
    draw_text(cr, L.rl[r], L.x0 - kHeatTickLen - 4, L.y0 + L.cell * (static_cast<double>(r) + 0.5),
              1.0);
  for (size_t k = 0; k < L.cols; k += L.stride)
    draw_text_up(cr, L.cl[k], L.x0 + L.cell * (static_cast<double>(k) + 0.5),
                 L.y0 + L.grid_h + kHeatTickLen + 4, 1.0);
  set_font(cr, kHeatTickFont);
  for (int i = 0; i <= 4; ++i) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%.2g", i / 4.0);
    draw_text(cr, buf, L.bar_x + L.bar_w + kHeatTickLen + 4, L.y0 + L.bar_h * (1 - i / 4.0), 0);
  }
  if (!title.empty()) {
    cairo_set_source_rgb(cr, 0, 0, 0);
    set_font(cr, kHeatTitleFont, true);
    draw_text(cr, clean_utf8(title), L.width / 2.0, kHeatMargin + L.title_h / 2, 0.5);
  }
}

}  // namespace

void heatmap(const std::string& png_path, const std::vector<std::vector<double>>& m,
             const std::vector<std::string>& row_labels, const std::vector<std::string>& col_labels,
             const std::string& title) {
  const char* fn = "heatmap";
  check_heatmap_input(fn, m, row_labels, col_labels);
  const HeatmapLayout L = lay_out_heatmap(fn, m.size(), m[0].size(), row_labels, col_labels, title);
  auto [surface, crp] = make_canvas(fn, L.width, L.height);
  draw_heatmap_cells(crp.get(), L, m);
  draw_heatmap_frames(crp.get(), L);
  draw_heatmap_labels(crp.get(), L, title);
  write_png_atomic(fn, crp.get(), surface.get(), png_path);
}

}  // namespace graft::plot
