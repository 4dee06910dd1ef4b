// Small helpers shared by the test files.
#pragma once

#include <boost/test/unit_test.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "graft/autograd/tensor.h"

namespace graft::testing {

// Elementwise |got - want| <= tol * (1 + |want|).
inline void check_close(const Tensor& t, const std::vector<double>& want, double tol = 1e-5) {
  auto got = t.to_vector<double>();
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    BOOST_CHECK_MESSAGE(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])),
                        "element " << i << ": got " << got[i] << ", want " << want[i]);
}

// Same shape and max |a - b| <= tol.
inline void check_same(const Tensor& a, const Tensor& b, double tol) {
  BOOST_REQUIRE(a.shape() == b.shape());
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < va.size(); ++i) worst = std::max(worst, std::fabs(va[i] - vb[i]));
  BOOST_CHECK_MESSAGE(worst <= tol, "max |diff| " << worst << " > " << tol);
}

// For BOOST_CHECK_EXCEPTION: the error message contains `part`.
inline bool names(const Error& e, const std::string& part) {
  const std::string m = e.what();
  BOOST_TEST_MESSAGE(m);
  return m.find(part) != std::string::npos;
}

// For BOOST_CHECK_EXCEPTION: the error message contains every one of `parts`.
inline bool names_all(const Error& e, std::initializer_list<const char*> parts) {
  const std::string m = e.what();
  BOOST_TEST_MESSAGE(m);
  for (const char* p : parts)
    if (m.find(p) == std::string::npos) return false;
  return true;
}

// Token ids as an int64 (rows, n / rows) tensor.
inline Tensor ids(const std::vector<int64_t>& v, int64_t rows) {
  return from_vector(v, {rows, (int64_t)v.size() / rows}, DType::i64);
}

// The last two dims of t swapped, as a view (no copy).
inline Tensor tview(const Tensor& t) {
  Shape s = t.shape(), st = t.strides();
  std::swap(s[s.size() - 1], s[s.size() - 2]);
  std::swap(st[st.size() - 1], st[st.size() - 2]);
  return Tensor::view_of(t, s, st, t.offset());
}

// A fresh, empty directory of one test's own, made by mkdtemp under $TMPDIR (else /tmp) and
// removed with everything in it at destruction (a failing test's too), so that two runs of the
// suite on one machine never share a path.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag = "test") {
    const char* tmp = std::getenv("TMPDIR");
    std::string name = std::string(tmp && *tmp ? tmp : "/tmp") + "/graft_" + tag + "_XXXXXX";
    if (!mkdtemp(name.data())) fail("TempDir: cannot make " + name + ": " + std::strerror(errno));
    path = name;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // The path of `name` in the directory.
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

}  // namespace graft::testing
