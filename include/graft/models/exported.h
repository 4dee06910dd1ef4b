/// @file
/// Exports: a run's weights saved in the form inference at bf16 or int8 runs on, and loaded in it
/// without a float32 copy of a quantized weight ever being made (docs/mixed-precision.md, "int8 and
/// bf16 exports"). A bf16 export holds every parameter in bf16; an int8 export holds each weight
/// that keep_for_inference(model, Precision::int8) makes int8 (int8_linear_weights()) as its int8
/// values (I8, under the weight's name) and its scales (F32, under the name + "_scale"), and
/// every other parameter as the model has it. Loaded (models/run.h, load_run_model with a
/// precision), a model is then exactly the model keep_for_inference() makes of the float32 one:
/// the same bits, the same outputs.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graft/nn/module.h"
#include "graft/nn/train/checkpoint.h"
#include "graft/ops/precision.h"

namespace graft::models {

/// The file an export of precision `p` takes in a run directory: "model.int8.safetensors" or
/// "model.bf16.safetensors".
/// @throws graft::Error for fp32 (model.safetensors is the float32 form).
std::string export_file_name(Precision p);

/// The tensors of an export of `model` at `p` (see the file's description), in the model's order.
/// @throws graft::Error for fp32, and (int8) as int8_weight_parts() for a weight that is not
///         float32 or holds a NaN or inf, naming it.
nn::NamedTensors export_state_dict(const nn::Module& model, Precision p);

/// Writes export_state_dict(model, p) to `path` through train::save_weights (atomic, with a
/// checksum), tied to `tied_files` (the run's config.json, its tokenizer), with the metadata
/// "format" "graft-export", "precision", "source_checksum" and the step: the checksum and step
/// of `source_metadata`, the metadata of the weights file `source_weights` (model.safetensors)
/// as the model was loaded from it (LoadedModel::metadata; never re-read, so a checkpoint
/// written since cannot lend its checksum to older weights), so an export of weights retrained
/// since is refused on load.
/// @throws graft::Error as export_state_dict() or train::save_weights(), or naming
///         source_weights when its metadata lacks a checksum or has a step that is no count.
void save_export(const nn::Module& model, Precision p, const std::string& path,
                 const std::string& source_weights,
                 const std::map<std::string, std::string>& source_metadata,
                 const std::vector<std::string>& tied_files);

/// Reads an export of precision `p` written by save_export(): its "format" and "precision"
/// checked from the header alone, then its size (plus `buffers` float64 elements the model
/// builds) against memory (check_file_memory()), then the whole file: its checksum and the
/// fingerprints of `tied_files` (train::load_weights_file) and, when `source_weights` exists,
/// its "source_checksum" against that file's checksum.
/// @throws graft::Error "load_run: '<path>': ..." naming what does not match.
train::SafetensorsFile load_export(const std::string& path, Precision p,
                                   const std::string& source_weights,
                                   const std::vector<std::string>& tied_files, int64_t buffers = 0);

/// Gives `model` (built under nn::SkipInit(nn::SkipInit::Memory::none), or any model of the
/// export's shapes) the export's tensors: int8 weights through set_weight_int8() (each file
/// tensor dropped once installed, so the file is not held twice), the others through
/// adopt_state_dict() (their memory taken, no copy); an int8 export's embedding tables (float32
/// in the file) are then quantized as keep_for_inference(int8) does (embedding_tables()). The
/// dtypes are checked before anything is installed; a failure after that leaves the model half
/// loaded (drop it).
/// @throws graft::Error "load_run: '<file>': ..." naming the tensor: a tensor of the wrong dtype
///         (not bf16 in a bf16 export; an int8 tensor for a weight the model reads in float32, a
///         linear weight not in int8, or another tensor not of its parameter's dtype, in an int8
///         export), a missing or misshapen scale, values of
///         the wrong shape, a missing, unexpected or misshapen tensor.
void adopt_export(nn::Module& model, train::SafetensorsFile f, Precision p);

}  // namespace graft::models
