// Tests for graft::plot (examples/common/plot.h): PNG output, sizes,
// heatmap colouring and error handling.
#include <boost/test/unit_test.hpp>

#include <cairo.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "examples/common/plot.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using graft::plot::Panel;
using graft::plot::Series;

namespace {

using graft::testing::TempDir;

// How many files and directories `dir` holds.
size_t entries(const TempDir& dir) {
  return static_cast<size_t>(
      std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()));
}

bool has_png_signature(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char buf[8] = {};
  in.read(buf, 8);
  return in.gcount() == 8 && std::string(buf, 8) == std::string("\x89PNG\r\n\x1a\n", 8);
}

// Decoded PNG; pixels are cairo's native-endian 0xAARRGGBB.
struct Image {
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface{nullptr,
                                                                             cairo_surface_destroy};
  int width = 0, height = 0;

  explicit Image(const std::string& path) {
    surface.reset(cairo_image_surface_create_from_png(path.c_str()));
    BOOST_REQUIRE_MESSAGE(cairo_surface_status(surface.get()) == CAIRO_STATUS_SUCCESS,
                          "cannot read "
                              << path << ": "
                              << cairo_status_to_string(cairo_surface_status(surface.get())));
    cairo_surface_flush(surface.get());
    width = cairo_image_surface_get_width(surface.get());
    height = cairo_image_surface_get_height(surface.get());
  }
  uint32_t pixel(int x, int y) const {
    const unsigned char* row =
        cairo_image_surface_get_data(surface.get()) +
        static_cast<ptrdiff_t>(y) * cairo_image_surface_get_stride(surface.get());
    return reinterpret_cast<const uint32_t*>(row)[x] & 0xffffffu;
  }
  double luminance(int x, int y) const {
    const uint32_t p = pixel(x, y);
    return 0.2126 * ((p >> 16) & 0xff) + 0.7152 * ((p >> 8) & 0xff) + 0.0722 * (p & 0xff);
  }
  size_t non_white() const {
    size_t n = 0;
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x) n += pixel(x, y) != 0xffffffu;
    return n;
  }
};

// Runs f, requires a std::runtime_error whose message starts with `expected`.
template <class F>
void require_error(F&& f, const std::string& expected) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    BOOST_TEST_CONTEXT("message: " << e.what()) {
      BOOST_TEST(std::string(e.what()).rfind(expected, 0) == 0u);
    }
    return;
  }
  BOOST_FAIL("no std::runtime_error, expected: " << expected);
}

std::vector<Panel> training_panels() {
  Series train{"train loss", {}, {}}, valid{"valid loss", {}, {}}, bleu{"valid BLEU", {}, {}};
  for (int s = 0; s <= 20000; s += 100) {
    train.x.push_back(s);
    train.y.push_back(8.0 * std::exp(-s / 3000.0) + 1.6 + 0.05 * std::sin(s / 70.0));
  }
  for (int s = 1000; s <= 20000; s += 1000) {
    valid.x.push_back(s);
    valid.y.push_back(7.5 * std::exp(-s / 3500.0) + 1.9);
    bleu.x.push_back(s);
    bleu.y.push_back(30.0 * (1 - std::exp(-s / 6000.0)));
  }
  Panel loss{"Training loss", "step", "cross-entropy", {train, valid}, true};
  Panel score{"Validation BLEU", "step", "BLEU", {bleu}, false};
  return {loss, score};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(plot)

BOOST_AUTO_TEST_CASE(line_chart_writes_png_of_requested_size) {
  TempDir dir;
  const std::string path = dir / "curves.png";
  graft::plot::line_chart(path, training_panels());
  BOOST_TEST(has_png_signature(path));
  Image img(path);
  BOOST_TEST(img.width == 1200);
  BOOST_TEST(img.height == 450);
  BOOST_TEST(img.non_white() > 5000u);  // something was drawn
  BOOST_TEST(!fs::exists(path + ".tmp"));

  graft::plot::line_chart(path, training_panels(), 640, 300);  // overwrites
  Image small(path);
  BOOST_TEST(small.width == 640);
  BOOST_TEST(small.height == 300);
  BOOST_TEST(entries(dir) == 1u);
}

BOOST_AUTO_TEST_CASE(line_chart_handles_degenerate_data) {
  TempDir dir;
  const double nan = std::numeric_limits<double>::quiet_NaN(),
               inf = std::numeric_limits<double>::infinity();
  Panel odd{"odd data", "x", "y", {}, false};
  odd.series.push_back({"with nan/inf", {0, 1, 2, 3, nan, 5, 6}, {1, nan, 3, inf, 2, -inf, 4}});
  odd.series.push_back({"empty", {}, {}});
  odd.series.push_back({"single", {2.5}, {2.5}});
  odd.series.push_back({"", {1, 2}, {1e300, -1e300}});  // unnamed, absurd magnitudes
  Panel nothing{"", "", "", {}, false};
  Panel all_nan{"all NaN", "", "", {{"nan", {nan, nan}, {nan, nan}}}, true};
  Panel log_nonpos{"log with zeros", "step", "loss", {{"l", {0, 1, 2, 3}, {0, -1, 5, 0.5}}}, true};
  Panel constant{"constant", "", "", {{"c", {0, 1, 2}, {0, 0, 0}}, {"d", {7, 7}, {7, 7}}}, false};
  Panel narrow_log{"narrow log", "", "", {{"n", {0, 1, 2}, {2.0, 2.1, 2.2}}}, true};
  Panel tiny_values{"tiny", "", "", {{"t", {0, 1e-9, 2e-9}, {1e-7, 3e-7, 2e-7}}}, false};
  Panel utf8{
      "UTF-8 ▁título \xff bad", "schritt ▁", "\x01 ctrl", {{"▁séries", {0, 1}, {0, 1}}}, false};
  const std::vector<Panel> panels{odd,      nothing,    all_nan,     log_nonpos,
                                  constant, narrow_log, tiny_values, utf8};
  const std::string path = dir / "odd.png";
  BOOST_CHECK_NO_THROW(graft::plot::line_chart(path, panels, 2400, 400));
  BOOST_TEST(has_png_signature(path));
  Image img(path);
  BOOST_TEST(img.width == 2400);
  BOOST_TEST(img.height == 400);

  // Sizes too small for the layout must still work.
  BOOST_CHECK_NO_THROW(graft::plot::line_chart(path, panels, 1, 1));
  BOOST_CHECK_NO_THROW(graft::plot::line_chart(path, {odd}, 30, 20));
  Image tiny(path);
  BOOST_TEST(tiny.width == 30);
  BOOST_TEST(tiny.height == 20);
}

BOOST_AUTO_TEST_CASE(heatmap_writes_png) {
  TempDir dir;
  const std::string path = dir / "attn.png";
  const std::vector<std::string> src{"▁Das", "▁ist", "▁ein", "▁Test", "."},
      tgt{"▁This", "▁is", "▁a", "▁test"};
  std::vector<std::vector<double>> m(tgt.size(), std::vector<double>(src.size(), 0.05));
  for (size_t i = 0; i < tgt.size(); ++i) m[i][i] = 0.8;
  graft::plot::heatmap(path, m, tgt, src, "cross-attention, layer 6");
  BOOST_TEST(has_png_signature(path));
  Image img(path);
  BOOST_TEST(img.width > 100);
  BOOST_TEST(img.height > 100);
  BOOST_TEST(!fs::exists(path + ".tmp"));

  // Long sentences, NaN cells, out-of-range values, long and odd labels.
  std::vector<std::string> many;
  for (int i = 0; i < 70; ++i)
    many.push_back(i == 3 ? std::string(200, 'x') : "▁tok" + std::to_string(i));
  std::vector<std::vector<double>> big(70, std::vector<double>(70, 0.1));
  big[0][0] = std::numeric_limits<double>::quiet_NaN();
  big[1][1] = 7;
  big[2][2] = -3;
  BOOST_CHECK_NO_THROW(graft::plot::heatmap(path, big, many, many, ""));
  Image img2(path);
  BOOST_TEST(img2.width < 2000);
  BOOST_TEST(img2.height < 2000);

  std::vector<std::string> huge(500, "t");
  std::vector<std::vector<double>> hm(1, std::vector<double>(500, 0.5));
  BOOST_CHECK_NO_THROW(graft::plot::heatmap(path, hm, {"\xc3"}, huge, "1x500"));
}

BOOST_AUTO_TEST_CASE(heatmap_bright_cell_is_brightest) {
  TempDir dir;
  const size_t rows = 3, cols = 4;
  const std::vector<std::string> rl{"▁a", "▁b", "▁c"}, cl{"▁w", "▁x", "▁y", "▁z"};
  auto draw = [&](const std::vector<std::vector<double>>& m, const std::string& name) {
    const std::string path = dir / name;
    graft::plot::heatmap(path, m, rl, cl, "attention");
    return Image(path);
  };
  // The layout does not depend on the values: the pixels that differ between an
  // all-0 and an all-1 matrix are exactly the cells, which locates the grid.
  const Image zeros =
      draw(std::vector<std::vector<double>>(rows, std::vector<double>(cols, 0.0)), "zeros.png");
  const Image ones =
      draw(std::vector<std::vector<double>>(rows, std::vector<double>(cols, 1.0)), "ones.png");
  BOOST_REQUIRE(zeros.width == ones.width && zeros.height == ones.height);
  int x0 = zeros.width, y0 = zeros.height, x1 = -1, y1 = -1;
  for (int y = 0; y < zeros.height; ++y)
    for (int x = 0; x < zeros.width; ++x)
      if (zeros.pixel(x, y) != ones.pixel(x, y)) {
        x0 = std::min(x0, x), y0 = std::min(y0, y), x1 = std::max(x1, x), y1 = std::max(y1, y);
        BOOST_TEST_REQUIRE(ones.luminance(x, y) > zeros.luminance(x, y));
      }
  BOOST_REQUIRE(x1 > x0 && y1 > y0);
  const double cw = (x1 - x0 + 1) / static_cast<double>(cols),
               ch = (y1 - y0 + 1) / static_cast<double>(rows);
  BOOST_TEST(std::abs(cw - ch) < 1.0);  // square cells
  auto centre = [&](size_t r, size_t c) {
    return std::pair<int, int>{x0 + static_cast<int>((static_cast<double>(c) + 0.5) * cw),
                               y0 + static_cast<int>((static_cast<double>(r) + 0.5) * ch)};
  };

  std::vector<std::vector<double>> m(rows, std::vector<double>(cols, 0.2));
  m[1][2] = 0.95;
  m[0][0] = 0.5;
  const Image img = draw(m, "bright.png");
  BOOST_REQUIRE(img.width == zeros.width && img.height == zeros.height);
  const auto [bx, by] = centre(1, 2);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) {
      if (r == 1 && c == 2) continue;
      const auto [x, y] = centre(r, c);
      BOOST_TEST_CONTEXT("cell " << r << "," << c) {
        BOOST_TEST(img.luminance(bx, by) > img.luminance(x, y));
      }
    }
  // Brightness grows with the value: 0.95 > 0.5 > 0.2.
  const auto [mx, my] = centre(0, 0);
  const auto [lx, ly] = centre(2, 3);
  BOOST_TEST(img.luminance(mx, my) > img.luminance(lx, ly));
}

BOOST_AUTO_TEST_CASE(heatmap_errors_leave_no_file) {
  TempDir dir;
  const std::string path = dir / "bad.png";
  const std::vector<std::vector<double>> m(3, std::vector<double>(4, 0.5));
  const std::vector<std::string> r3{"a", "b", "c"}, c4{"w", "x", "y", "z"};
  require_error(
      [&] {
        graft::plot::heatmap(path, m, {"a", "b"}, c4, "t");
      },
      "heatmap: matrix is 3x4 but 2 row labels");
  require_error(
      [&] {
        graft::plot::heatmap(path, m, r3, {"w", "x", "y", "z", "v"}, "t");
      },
      "heatmap: matrix is 3x4 but 5 column labels");
  require_error([&] { graft::plot::heatmap(path, {}, {}, {}, "t"); }, "heatmap: matrix is empty");
  require_error(
      [&] {
        graft::plot::heatmap(path, {{}, {}}, {"a", "b"}, {}, "t");
      },
      "heatmap: matrix is empty");
  require_error(
      [&] {
        graft::plot::heatmap(path, {{1, 2}, {3}}, {"a", "b"}, {"x", "y"}, "t");
      },
      "heatmap: row 1 has 1 values but row 0 has 2");
  const std::string missing = dir / "no/such/dir/attn.png";
  require_error([&] { graft::plot::heatmap(missing, m, r3, c4, "t"); },
                "heatmap: cannot write '" + missing + "': ");
  BOOST_TEST(entries(dir) == 0u);

  // A failed call must not clobber an existing plot.
  graft::plot::heatmap(path, m, r3, c4, "good");
  const auto size = fs::file_size(path);
  require_error([&] { graft::plot::heatmap(path, m, r3, {"w"}, "t"); },
                "heatmap: matrix is 3x4 but 1 column labels");
  BOOST_TEST(fs::file_size(path) == size);
  BOOST_TEST(has_png_signature(path));
  BOOST_TEST(entries(dir) == 1u);
}

BOOST_AUTO_TEST_CASE(line_chart_errors_leave_no_file) {
  TempDir dir;
  const std::string path = dir / "bad.png";
  require_error([&] { graft::plot::line_chart(path, {}); }, "line_chart: no panels");
  require_error([&] { graft::plot::line_chart(path, training_panels(), 0, 450); },
                "line_chart: invalid size 0x450");
  require_error([&] { graft::plot::line_chart(path, training_panels(), 1200, -5); },
                "line_chart: invalid size 1200x-5");
  require_error([&] { graft::plot::line_chart(path, training_panels(), 40000, 10); },
                "line_chart: invalid size 40000x10");
  Panel bad{"loss", "", "", {{"train", {1, 2, 3}, {1, 2}}}, false};
  require_error([&] { graft::plot::line_chart(path, {bad}); },
                "line_chart: series 'train' in panel 'loss' has 3 x values but 2 y values");
  const std::string missing = dir / "no/such/dir/curves.png";
  require_error([&] { graft::plot::line_chart(missing, training_panels()); },
                "line_chart: cannot write '" + missing + "': ");
  BOOST_TEST(entries(dir) == 0u);

  // The target is a directory: the temporary file is written, the rename
  // fails, and the temporary file must be cleaned up.
  const std::string is_dir = dir / "taken.png";
  fs::create_directory(is_dir);
  require_error([&] { graft::plot::line_chart(is_dir, training_panels()); },
                "line_chart: cannot write '" + is_dir + "': ");
  BOOST_TEST(!fs::exists(is_dir + ".tmp"));
  BOOST_TEST(fs::is_directory(is_dir));
  BOOST_TEST(entries(dir) == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
