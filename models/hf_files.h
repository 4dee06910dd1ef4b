/// @file
/// The files of a Hugging Face checkpoint directory, shared by graft's importers (internal to
/// models/): model.safetensors or the shards model.safetensors.index.json lists, read header
/// first so every name, dtype and shape is checked against the config before any tensor is
/// allocated, then only the tensors a model needs, mapped onto graft's parameter names.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "graft/nn/module.h"
#include "graft/nn/train/checkpoint.h"

namespace graft::models::hf {

/// A checkpoint tensor: its header entry (under the name it has in the file) and its file.
struct FileTensor {
  train::SafetensorsEntry entry;  ///< name as stored, dtype, shape, bytes
  std::string file;               ///< the safetensors file holding it
};

/// The checkpoint's tensors by name with the model prefix stripped.
using FileTensors = std::map<std::string, FileTensor>;

/// How one importer reads a directory.
struct Reading {
  std::string who;                    ///< the importer, first in every message
  std::vector<std::string> prefixes;  ///< stripped from a name that starts with one ("model.")
  std::function<bool(const std::string&)> ignorable;  ///< stripped names skipped (buffers)
};

/// The headers of model.safetensors, or of every shard model.safetensors.index.json names.
/// @throws graft::Error naming the file and tensor for a non-float tensor that is not
///         ignorable, a name held twice (with and without the prefix, or in two shards), an
///         index whose shard names are not plain files in dir or are missing, or neither file.
FileTensors inspect_hf_tensors(const std::string& dir, const Reading& r);

/// One graft parameter built from checkpoint tensors.
struct Param {
  std::vector<std::string> hf;  ///< sources (stripped names), concatenated along dim 0
  std::vector<Shape> shapes;    ///< each source's stored shape; with no sources, the zero fill's
  std::string graft;            ///< the parameter's name in graft's model
  bool transpose = false;       ///< each source stored (in, out) (GPT-2's Conv1D): transposed
};

/// Every source of every parameter is in the file with its shape, and nothing else is.
/// @throws graft::Error "<who>: '<file>': tensor '<name>' is missing | has shape [..], the
///         config needs [..] | unexpected tensor '<name>'".
void check_params(const FileTensors& file, const std::vector<Param>& params, const Reading& r,
                  const std::string& dir);

/// The one dtype every tensor has, else float32 (each converted exactly or rounded once).
DType common_dtype(const FileTensors& file);

/// Loads the sources (each file once, only the tensors params name) and builds every parameter
/// in dtype: converted, transposed where asked, concatenated, or zero-filled.
nn::NamedTensors load_params(const FileTensors& file, const std::vector<Param>& params,
                             DType dtype);

/// load_params() one parameter at a time: each is built (its sources read from their files,
/// converted, transposed, concatenated) and handed to `take` (graft name, tensor) before the next
/// is read, so at most one parameter's tensors are held besides what `take` keeps. Each call
/// reads the files' headers again: for loaders that must not hold the whole model (int8).
void for_each_param(const FileTensors& file, const std::vector<Param>& params, DType dtype,
                    const std::function<void(const std::string&, Tensor)>& take);

}  // namespace graft::models::hf
