/// @file
/// Checkpoint files: tensors in the safetensors format, JSON side files, and the atomic write
/// that every checkpoint file goes through so a crash mid-save never destroys the last good one.
///
/// safetensors layout: an 8-byte little-endian header length N, N bytes of JSON header
/// @code
///   {"__metadata__": {str: str}, "name": {"dtype": "F32"|"F64"|"I64"|"BF16"|"F16"|"I8",
///    "shape": [...], "data_offsets": [begin, end]}, ...}
/// @endcode
/// then the raw little-endian tensor bytes; offsets are relative to the first byte after the
/// header. The data regions tile the data section exactly: no gaps, no overlap, no trailing bytes.
/// Each dtype maps to one DType (F32 f32, F64 f64, I64 i64, BF16 bf16, F16 f16, I8 i8) both ways:
/// a tensor is written and loaded in the dtype it has, never widened or narrowed
/// (docs/mixed-precision.md, "Files and modules in 16-bit dtypes"). Other safetensors dtypes
/// (BOOL, U8, I16, F8_*, ...) are refused.
#pragma once

#include <functional>
#include <limits>
#include <map>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "graft/autograd/tensor.h"

namespace graft::train {

/// Writes the tensors in the order given (names must be unique and not `__metadata__`);
/// non-contiguous tensors are written as their contiguous copy. Each is stored in its own dtype
/// (a bf16 tensor as BF16: half the bytes of its float32 form). Bit-exact: loading the file
/// gives back the same bytes and dtypes. Goes through atomic_write.
/// @throws graft::Error "save_safetensors: '<path>': ..." for a reserved, repeated or non-UTF-8
///         name, an undefined tensor, or (from atomic_write) an I/O failure.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// A loaded safetensors file (load_safetensors()).
struct SafetensorsFile {
  /// In data-offset order, which is the order they were saved in for files written here.
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;  ///< the header's `__metadata__` (empty when absent)
  std::string path;                             ///< where it was loaded from, for error messages

  /// The tensor named `name`.
  /// @throws graft::Error naming the missing tensor and the file.
  const Tensor& at(const std::string& name) const;
  /// Whether a tensor named `name` is in the file.
  bool contains(const std::string& name) const;
};

/// Reads a safetensors file (F32, F64, I64, BF16, F16 and I8 tensors, each loaded in its own
/// dtype: a BF16 tensor is a bf16 Tensor holding the file's bits).
/// Validates the whole file before trusting any of it; every problem is a graft::Error whose
/// message starts with "load_safetensors: '<path>': " and names the tensor involved.
/// @throws graft::Error for a missing or unreadable file, a header that is too long, not JSON
///         or malformed, an unknown dtype, a shape whose element count times the dtype's size
///         is not its byte range (naming the tensor, the dtype and both counts), or data
///         regions that do not tile the data section.
SafetensorsFile load_safetensors(const std::string& path);

/// One tensor of a safetensors header: what load_safetensors() would allocate for it.
struct SafetensorsEntry {
  std::string name;          ///< the tensor's name in the file
  DType dtype = DType::f32;  ///< its dtype as stored
  Shape shape;               ///< its shape as stored
  uint64_t bytes = 0;        ///< its byte count (the element count times the dtype's size)
};

/// A safetensors file's header, validated as load_safetensors() validates it, no tensor read.
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;        ///< in data-offset order
  std::map<std::string, std::string> metadata;  ///< the header's `__metadata__`
  std::string path;                             ///< where it was read from
};

/// Reads and validates a safetensors file's header only (the same checks and errors as
/// load_safetensors(), which it shares), so a loader can check every name, dtype and shape
/// against what it needs before any tensor is allocated.
/// @throws graft::Error as load_safetensors() for the header and the file's size.
SafetensorsHeader inspect_safetensors(const std::string& path);

/// load_safetensors() of the tensors `keep` accepts only: the others are validated in the
/// header and skipped in the file, never allocated.
/// @throws graft::Error as load_safetensors().
SafetensorsFile load_safetensors(const std::string& path,
                                 const std::function<bool(const std::string&)>& keep);

/// Writes a file atomically: `writer` fills the stream, and `path` then holds either all of it
/// or what it held before.
///
/// Writes a fresh temp file beside path (create_temp_file()), flushes and fsyncs it, renames it
/// over path, then fsyncs the directory. If the writer throws or any step fails, the temp file
/// is removed and whatever was at path before is untouched; the writer's own exception is
/// rethrown unchanged, I/O failures are graft::Errors naming path. A symbolic link at path is
/// replaced, never written through. Threads may write one path at once (the last rename wins).
/// @throws graft::Error "atomic_write: '<path>': ..." when creating, writing, syncing or
///         renaming fails (and whatever `writer` throws).
void atomic_write(const std::string& path, const std::function<void(std::ostream&)>& writer);

/// Copies the file src to dst through atomic_write(): dst then holds all of src or what it held
/// before, and a link planted at dst is replaced, never written through (a plain copy follows it).
/// @throws graft::Error "atomic_copy: '<src>': ..." when src cannot be read (and what
///         atomic_write() throws).
void atomic_copy(const std::string& src, const std::string& dst);

/// Creates the temp file for a write of path in path's directory, as
/// "<path>.tmp.<pid>.<6 random letters or digits>", exclusively and without following links
/// (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0666 less the umask): a file or symbolic link planted
/// under a temp name is never written through. Sets tmp to its name; returns its descriptor
/// (close-on-exec), which the caller closes and whose file it renames or removes.
/// @throws graft::Error "<who>: '<path>': cannot create the temporary file '<tmp>': ..." when
///         the directory refuses it (missing, not writable, full) or 100 names were taken.
int create_temp_file(const std::string& path, std::string& tmp, const std::string& who);

/// Removes the temp files create_temp_file() left in dir when its process was killed
/// mid-save ("<name>.tmp.<pid>.<suffix>", or "<name>.tmp.<pid>" of graft 0.6 and earlier, of a pid
/// no longer running); returns how many. A directory that cannot be read counts as none.
int remove_stale_temp_files(const std::string& dir);

/// An input file of a command, and what to call it in a message ("--collection", "the run's
/// weights"); see check_output_path().
struct NamedInput {
  std::string path;  ///< the file; an empty path is skipped
  std::string what;  ///< how a message names it; empty: "the input"
};

/// Refuses an output path a command would write, before any work: one naming a directory, a
/// device, a FIFO or a socket (or a symbolic link to one of them: writing "/dev/full" as root
/// once replaced the device with a regular file, since every save renames a temp file over its
/// path), or the same file as any of the command's inputs (the same device and inode, or the
/// same canonical path), which the write would destroy while reading it. A missing path, a
/// regular file and a dangling link pass (an atomic_write() replaces the link itself).
/// @throws graft::Error "<who>: '<path>' is a directory, not a file to write" (a device, a FIFO
///         (named pipe), a socket, a symbolic link to ...), "<who>: '<path>' is the same file as
///         <what> ('<input>'), which this command reads: writing it would destroy it", or for an
///         empty path.
void check_output_path(const std::string& who, const std::string& path,
                       const std::vector<NamedInput>& inputs = {});

/// A hash over every tensor's name, dtype, shape and bytes, as 16 hex digits: safetensors carries
/// no checksum of its own, so flipped bits in the data section (or a dtype changed in the
/// header) would otherwise load silently. Checkpoints store it in their metadata
/// (checksum_metadata()) and verify it on load (check_weights_checksum()). Not cryptographic.
std::string weights_checksum(const std::vector<std::pair<std::string, Tensor>>& tensors);
/// The metadata entries that carry weights_checksum(tensors): "checksum", and
/// "checksum_version" "2" (a file without it was written before graft 0.6, by a checksum that
/// did not cover the dtype).
std::map<std::string, std::string> checksum_metadata(
    const std::vector<std::pair<std::string, Tensor>>& tensors);
/// Verifies the checksum f's metadata stores against its tensors (a file written before graft
/// 0.6 by the checksum of its day, without the dtype).
/// @throws graft::Error "<who>: '<path>': ..." when the metadata has no checksum, names an
///         unknown checksum_version, or the checksum differs (the file is corrupted).
void check_weights_checksum(const SafetensorsFile& f, const std::string& who);
/// The same over text (metadata, side files), so they can be tied to the weights.
std::string text_checksum(const std::string& text);
/// text_checksum of a side file's bytes (at most 256 MiB); errors start with who.
/// @throws graft::Error "<who>: '<file>': ..." when the file is missing, not a regular file,
///         unreadable or larger than 256 MiB.
std::string file_fingerprint(const std::string& file, const char* who);

/// A module's weights for inference: its state_dict with the step, weights_checksum and the
/// fingerprint (text_checksum of the bytes) of each tied side file in the metadata, written
/// atomically. Tied files are a run directory's config.json and tokenizer: a weights file must
/// never load beside a config or tokenizer of another run, or one edited since. `format` is
/// stored as the metadata "format"; `more_metadata` is stored too (the entries above win).
/// @throws graft::Error when a tied file cannot be read, or as save_safetensors().
void save_weights(const std::vector<std::pair<std::string, Tensor>>& state_dict,
                  const std::string& path, int64_t step, const std::string& format,
                  const std::vector<std::string>& tied_files = {},
                  const std::map<std::string, std::string>& more_metadata = {});
/// Reads weights written by save_weights(): the checksum and every tied file's fingerprint
/// verified (errors "<who>: '<file>': ..." name the file that does not match), the tensors
/// returned for load_state_dict.
/// @throws graft::Error when the file does not load (see load_safetensors()), has no checksum
///         or a wrong one, or lacks or mismatches the fingerprint of a tied file.
std::vector<std::pair<std::string, Tensor>> load_weights(
    const std::string& path, const char* who, const std::vector<std::string>& tied_files = {});

/// load_weights() returning the whole file: the tensors and the metadata, checked the same way.
/// @throws graft::Error as load_weights().
SafetensorsFile load_weights_file(const std::string& path, const char* who,
                                  const std::vector<std::string>& tied_files = {});
/// The `__metadata__` of a safetensors file, reading its header only (the tensors' bytes are not
/// read: a weights file's checksum entry costs no pass over the weights).
/// @throws graft::Error as load_safetensors() for a missing file or a bad header.
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);
/// nlohmann's message without its "[json.exception.parse_error.101] " tag, which means nothing
/// to a user; the rest ("parse error at line L, column C: ...") is what they need.
std::string json_message(const nlohmann::json::exception& e);

/// A JSON value for an error message: compact, invalid UTF-8 replaced, cut after 80 characters.
std::string json_excerpt(const nlohmann::json& v);

/// Reading JSON from outside (files, checkpoint metadata) as exactly the C++ type it must be:
/// json_complaint<T>(v) is "" when v fits T, else what is wrong ("must be an integer, got 2.5").
/// An integer type needs a JSON integer in its range (nlohmann would convert 2.5 to 2, and a
/// float beyond the range with undefined behaviour), an unsigned one a non-negative integer, a
/// double any number, bool a boolean, std::string a string, std::vector<T> an array of such.
template <class T>
std::string json_complaint(const nlohmann::json& v) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return "must be true or false, got " + json_excerpt(v);
  } else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t(std::numeric_limits<T>::max()))
      return "must be a non-negative integer, got " + json_excerpt(v);
  } else if constexpr (std::is_integral_v<T>) {
    const bool fits = v.is_number_unsigned()
                          ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
                          : v.is_number_integer() &&
                                v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min()) &&
                                v.get<int64_t>() <= int64_t(std::numeric_limits<T>::max());
    if (!fits) return "must be an integer, got " + json_excerpt(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) return "must be a number, got " + json_excerpt(v);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return "must be a string, got " + json_excerpt(v);
  } else {  // std::vector<E>
    if (!v.is_array()) return "must be a list, got " + json_excerpt(v);
    for (size_t i = 0; i < v.size(); ++i)
      if (std::string c = json_complaint<typename T::value_type>(v[i]); !c.empty())
        return "entry " + std::to_string(i) + " " + c;
  }
  return {};
}

/// obj[key] as T, else an Error "<where>: '<key>' is missing" / "<where>: '<key>' <complaint>".
/// @throws graft::Error when obj is not an object, key is missing, or its value does not fit T
///         (json_complaint()).
template <class T>
T json_field(const nlohmann::json& obj, const char* key, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key)) fail(where + ": '" + key + "' is missing");
  const nlohmann::json& v = obj[key];
  if (std::string c = json_complaint<T>(v); !c.empty()) fail(where + ": '" + key + "' " + c);
  return v.get<T>();
}

/// Writes j to path, pretty-printed (2-space indent) with a final newline, through atomic_write.
/// @throws graft::Error "save_json: '<path>': ..." when j cannot be encoded (invalid UTF-8) or
///         the write fails.
void save_json(const std::string& path, const nlohmann::json& j);
/// The config.json a run directory was started with, read for --resume.
/// @throws graft::Error "resume: '<run_dir>/config.json' is missing (nothing to resume; drop
///         --resume to start fresh)", or as load_json().
nlohmann::json load_resume_config(const std::string& run_dir);
/// Reads and parses a JSON file.
/// Throws a graft::Error naming the path and, for malformed JSON, the parse error position.
/// Files over 16 MiB or nested over 32 levels are refused before parsing.
/// @throws graft::Error "load_json: '<path>': ..." for a missing, unreadable, too large, too
///         deeply nested or malformed file.
nlohmann::json load_json(const std::string& path);
/// Parses JSON from outside (a file, checkpoint metadata) after check_json_text; errors start
/// with where.
/// @throws graft::Error for nesting deeper than max_depth or malformed JSON.
nlohmann::json parse_json(const std::string& text, const std::string& where, int max_depth);
/// The structure check run before any outside JSON is parsed, in one linear pass that builds
/// nothing: no more than max_depth levels of nesting, no more than max_top_level_values values
/// in the outermost container. Errors start with where.
/// @throws graft::Error when either limit is exceeded.
void check_json_text(const std::string& text, int max_depth, size_t max_top_level_values,
                     const std::string& where);

}  // namespace graft::train
