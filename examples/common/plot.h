// graft::plot — small PNG chart writer for the translation example (training
// curves and cross-attention heatmaps), drawn with cairo.
//
// Build: compile plot.cpp with `pkg-config --cflags cairo` and link with
// `pkg-config --libs cairo` (Debian: libcairo2-dev). Text is drawn with
// cairo's font API through fontconfig ("sans-serif", DejaVu Sans on Debian).
//
// Both functions validate their input first, then draw, encode the PNG in
// memory and write it through train::atomic_write (a temp file created
// exclusively beside `png_path`, never through a planted link, renamed onto
// it), so a failure never leaves a half-written PNG behind (and never
// clobbers an existing file).
// All errors are std::runtime_error whose message starts with the function
// name, e.g. "heatmap: matrix is 3x4 but 2 row labels" or
// "line_chart: cannot write 'out/loss.png': <reason>".
#pragma once

#include <string>
#include <vector>

namespace graft::plot {

// One curve: y[i] plotted at x[i] (x.size() must equal y.size()). Points with a
// NaN/inf coordinate (or y <= 0 on a log axis) are skipped; the line joins the
// remaining points in order. A series with no points is allowed (it still gets
// a legend entry). Curves with few points also get point markers. An empty name
// keeps the series out of the legend.
struct Series {
  std::string name;
  std::vector<double> x, y;
};

// One chart: axes with tick labels and grid, title, x/y axis labels, a legend
// for the named series, optionally a log10 y axis. Empty strings are omitted.
struct Panel {
  std::string title, xlabel, ylabel;
  std::vector<Series> series;
  bool log_y = false;
};

// Draws the panels side by side (equal widths) in a width x height PNG.
// Throws on: no panels, size outside 1..32767, a series with x.size() != y.size(),
// or a failure to write the file.
void line_chart(const std::string& png_path, const std::vector<Panel>& panels, int width = 1200,
                int height = 450);

// Heatmap of m (m[r][c], rows = target tokens, cols = source tokens), values in
// [0,1] (clamped; NaN/inf cells drawn grey), with row labels at the left, column
// labels rotated under the matrix, a colour bar and a title. Labels are UTF-8
// (e.g. SentencePiece pieces with "▁"); overlong ones are shortened with "…".
// The image size follows from the matrix size and the label widths.
// Throws on: an empty or ragged matrix, label counts that do not match the
// matrix, or a failure to write the file.
void heatmap(const std::string& png_path, const std::vector<std::vector<double>>& m,
             const std::vector<std::string>& row_labels, const std::vector<std::string>& col_labels,
             const std::string& title);

}  // namespace graft::plot
