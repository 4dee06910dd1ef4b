// graph_dot: the tape entries behind a tensor as Graphviz DOT, read from this thread's tape.
#include "graft/autograd/graph.h"

#include <algorithm>
#include <deque>
#include <map>

#include "autograd/internal/tape_state.h"

namespace graft::autograd {

KeepModulePaths::KeepModulePaths() { ++detail::keep_paths_count(); }
KeepModulePaths::~KeepModulePaths() { --detail::keep_paths_count(); }

namespace {

using detail::Entry;
using detail::Route;

const std::deque<Entry>& entries() { return detail::this_tape().entries; }

std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// "e12" (entry 12), "l3" (leaf 3). Built by appending: g++ 12 warns falsely (-Wrestrict, GCC
// bug 105329) on "e" + std::to_string(i).
std::string node_id(char kind, int64_t i) {
  std::string s(1, kind);
  return s += std::to_string(i);
}

// The entries `root` depends on, in tape order.
std::vector<int64_t> entries_behind(int64_t root) {
  std::vector<bool> seen(entries().size(), false);
  std::vector<int64_t> stack{root}, out;
  seen[root] = true;
  while (!stack.empty()) {
    const int64_t i = stack.back();
    stack.pop_back();
    out.push_back(i);
    for (const Route& r : entries()[i].inputs)
      if (r.index >= 0 && !seen[r.index]) seen[r.index] = true, stack.push_back(r.index);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Module paths as nested clusters: each node of the tree holds its entries and its children.
struct Cluster {
  std::vector<int64_t> entries;
  std::map<std::string, Cluster> children;
};

void write_cluster(std::string& dot, const std::string& label, const Cluster& c, int& next_id,
                   int depth) {
  const std::string pad(2 * depth, ' ');
  if (depth > 0)
    dot += pad + "subgraph cluster_" + std::to_string(next_id++) + " {\n" + pad + "  label=\"" +
           dot_escape(label) + "\";\n";
  for (int64_t i : c.entries) {
    const Entry& e = entries()[i];
    std::string text = dot_escape(e.op);
    for (size_t k = 0; k < e.out_shapes.size(); ++k)
      text += "\\n" + describe(e.out_dtypes[k], e.out_shapes[k]);
    dot += pad + "  " + node_id('e', i) + " [label=\"" + text + "\"];\n";
  }
  for (const auto& [name, child] : c.children) write_cluster(dot, name, child, next_id, depth + 1);
  if (depth > 0) dot += pad + "}\n";
}

// The entries grouped by module path into nested clusters.
Cluster clusters_of(const std::vector<int64_t>& behind) {
  Cluster top;
  for (int64_t i : behind) {
    Cluster* c = &top;
    const std::string& path = entries()[i].path;
    for (size_t start = 0; !path.empty() && start <= path.size();) {
      const size_t dot_at = std::min(path.find('.', start), path.size());
      c = &c->children[path.substr(start, dot_at - start)];
      start = dot_at + 1;
    }
    c->entries.push_back(i);
  }
  return top;
}

}  // namespace

std::string graph_dot(const Tensor& t,
                      const std::vector<std::pair<std::string, Tensor>>& leaf_names) {
  if (!t.defined()) fail("graph_dot: the tensor is undefined");
  const TensorImpl* ti = t.impl();
  detail::check_this_thread(ti, "graph_dot: the tensor");
  if (detail::from_old_epoch(ti))
    fail("graph_dot: the tensor's graph was freed (the tape was cleared since it was made)");
  std::map<const TensorImpl*, std::string> names;
  for (const auto& [name, leaf] : leaf_names)
    if (leaf.defined()) names.emplace(leaf.impl(), name);
  auto leaf_label = [&](const TensorImpl* leaf, DType dt, const Shape& shape) {
    auto it = names.find(leaf);
    return dot_escape((it == names.end() ? std::string("leaf") : it->second)) + "\\n" +
           describe(dt, shape);
  };
  std::string dot = "digraph graft {\n  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n";
  if (!ti->recorded()) {  // nothing recorded behind it
    dot += "  l0 [shape=ellipse, label=\"" + leaf_label(ti, t.dtype(), t.shape()) + "\"];\n}\n";
    return dot;
  }
  const std::vector<int64_t> behind = entries_behind(TapeAccess::link(ti).index);
  int next_cluster = 0;
  write_cluster(dot, "", clusters_of(behind), next_cluster, 0);
  std::map<const TensorImpl*, int> leaves;
  std::string edges;
  for (int64_t i : behind) {
    for (const Route& r : entries()[i].inputs) {
      std::string from;
      if (r.index >= 0) {
        from = node_id('e', r.index);
      } else if (r.leaf) {
        auto [it, added] = leaves.emplace(r.leaf.get(), (int)leaves.size());
        from = node_id('l', it->second);
        if (added)
          dot += "  " + from + " [shape=ellipse, style=filled, fillcolor=\"#dde8f5\", label=\"" +
                 leaf_label(r.leaf.get(), r.dtype, r.shape) + "\"];\n";
      } else {
        continue;  // an input that needs no gradient (data, ids)
      }
      edges += "  " + from + " -> " + node_id('e', i) + ";\n";
    }
  }
  return dot + edges + "}\n";
}

}  // namespace graft::autograd
