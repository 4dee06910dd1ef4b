// autograd::graph_dot: the recorded graph as Graphviz DOT. Graphviz's dot parses it, every
// tape entry is one node, leaves carry the names given, and module paths become clusters.
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "graft/autograd/graph.h"
#include "graft/autograd/tape.h"
#include "graft/models/transformer.h"
#include "graft/ops/ops.h"
#include "tests/test_util.h"

using namespace graft;
using graft::testing::ids;
namespace fs = std::filesystem;

namespace {

// The DOT's lines, leading spaces dropped.
std::vector<std::string> lines_of(const std::string& dot) {
  std::vector<std::string> out;
  std::istringstream in(dot);
  for (std::string l; std::getline(in, l);)
    out.push_back(l.substr(std::min(l.find_first_not_of(' '), l.size())));
  return out;
}
// Op nodes: lines "e<digits> [label=...".
size_t op_nodes(const std::string& dot) {
  size_t n = 0;
  for (const std::string& l : lines_of(dot)) {
    const size_t digits = l.size() > 1 && l[0] == 'e' ? l.find_first_not_of("0123456789", 1) : 1;
    n += digits > 1 && l.compare(digits, 8, " [label=") == 0;
  }
  return n;
}
// Edges into an op: lines "<node> -> e<digits>;".
size_t edges_into_ops(const std::string& dot) {
  size_t n = 0;
  for (const std::string& l : lines_of(dot)) n += l.find(" -> e") != std::string::npos;
  return n;
}

// Graphviz's own parser accepts the text (dot is installed with the build's dependencies).
void check_dot_parses(const std::string& dot) {
  const graft::testing::TempDir dir("graph");
  const std::string p = dir / "graph.dot";
  std::ofstream(p) << dot;
  const int rc = std::system(("dot -Tcanon '" + p + "' > /dev/null").c_str());
  BOOST_TEST(rc == 0, "dot rejected the graph (exit status " << rc << "; is Graphviz installed?):\n"
                                                             << dot);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(graph)

BOOST_AUTO_TEST_CASE(one_node_per_entry_and_named_leaves) {
  autograd::clear_tape();
  Generator g(1);
  Tensor x = randn({4, 3}, DType::f32, g), w = randn({3, 2}, DType::f32, g).requires_grad_();
  Tensor b = randn({2}, DType::f32, g).requires_grad_();
  Tensor loss = sum(relu(add(matmul(x, w), b)));
  const std::string dot = autograd::graph_dot(loss, {{"weight", w}, {"bias", b}});
  BOOST_TEST(op_nodes(dot) == autograd::tape_size());
  BOOST_TEST(autograd::tape_size() == 4u);
  BOOST_TEST(dot.find("label=\"weight\\nf32 (3, 2)\"") != std::string::npos, dot);
  BOOST_TEST(dot.find("label=\"bias\\nf32 (2)\"") != std::string::npos, dot);
  BOOST_TEST(dot.find("relu\\nf32 (4, 2)") != std::string::npos, dot);
  BOOST_TEST(edges_into_ops(dot) == 5u);                 // w, b, matmul, add, relu each feed one op
  BOOST_TEST(dot.find("cluster") == std::string::npos);  // no module paths kept
  check_dot_parses(dot);
  // An unnamed leaf is "leaf"; a tensor nothing recorded is its own graph.
  BOOST_TEST(autograd::graph_dot(loss).find("label=\"leaf\\nf32 (3, 2)\"") != std::string::npos);
  BOOST_TEST(op_nodes(autograd::graph_dot(w)) == 0u);
  check_dot_parses(autograd::graph_dot(w));
  autograd::clear_tape();
}

BOOST_AUTO_TEST_CASE(a_transformer_step_clusters_by_module) {
  autograd::clear_tape();
  models::TransformerConfig c;
  c.vocab = 20, c.d_model = 8, c.heads = 2, c.d_ff = 16, c.enc_layers = c.dec_layers = 1,
  c.max_len = 16;
  models::Transformer m(c);
  Tensor src = ids({5, 6, 7, 3}, 1), tin = ids({2, 8, 9}, 1), tout = ids({8, 9, 3}, 1);
  std::string dot;
  {
    autograd::KeepModulePaths keep;
    Tensor loss = m.loss(src, tin, tout, 0.1);
    dot = autograd::graph_dot(loss, m.named_parameters());
  }
  BOOST_TEST(op_nodes(dot) == autograd::tape_size());
  BOOST_TEST(op_nodes(dot) > 20u);
  BOOST_TEST(dot.find("label=\"encoder\"") != std::string::npos);
  BOOST_TEST(dot.find("label=\"decoder\"") != std::string::npos);
  for (const auto& [name, p] : m.named_parameters())
    BOOST_TEST(dot.find("label=\"" + name + "\\n") != std::string::npos, name);
  check_dot_parses(dot);
  autograd::clear_tape();
}

BOOST_AUTO_TEST_CASE(a_freed_graph_is_an_error) {
  autograd::clear_tape();
  Tensor w = from_vector(std::vector<float>{1, 2}, {2}).requires_grad_();
  Tensor y = mul(w, w);
  autograd::clear_tape();
  BOOST_CHECK_EXCEPTION(autograd::graph_dot(y), Error, [](const Error& e) {
    return std::string(e.what()).find("graph_dot: the tensor's graph was freed") == 0;
  });
  BOOST_CHECK_EXCEPTION(autograd::graph_dot(Tensor()), Error, [](const Error& e) {
    return std::string(e.what()).find("graph_dot: the tensor is undefined") == 0;
  });
}

BOOST_AUTO_TEST_SUITE_END()
