// Writing a recorded graph (autograd::graph_dot) to a file a person can open: FILE.dot as DOT
// text, anything else (FILE.svg, FILE.png, FILE.pdf) rendered by Graphviz's `dot` in that format.
#pragma once

#include <string>
#include <vector>

#include "graft/nn/train/checkpoint.h"

namespace graft::plot {

// Writes through train::atomic_write (the file holds the whole graph or what it held before; a
// planted link is replaced, never followed). Throws graft::Error naming the file when it cannot
// be written, and saying how to install Graphviz when `dot` is missing.
void write_graph(const std::string& dot_text, const std::string& path);
// The file name's checks alone, for a program to run before any work: its extension, and
// train::check_output_path (not a directory, device, FIFO or socket, nor one of `inputs`).
void check_graph_file_name(const std::string& path,
                           const std::vector<train::NamedInput>& inputs = {});

}  // namespace graft::plot
