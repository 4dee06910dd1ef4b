#include "graft/nn/train/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <streambuf>

#include "graft/autograd/text.h"
#include "graft/nn/train/checkpoint_dir.h"

namespace graft::train {

// Tensor bytes go to and from disk with a plain memcpy, which is only the little-endian layout
// the format demands on a little-endian host.
static_assert(std::endian::native == std::endian::little,
              "checkpoint.cpp assumes a little-endian host");

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// Same bound as the reference implementation: a header this large is corruption or an attack,
// and refusing it up front keeps a bogus length from driving a huge allocation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Far more tensors than any model has; the bound keeps a header of tiny entries from costing
// more than a bounded amount of work and memory.
constexpr size_t kMaxHeaderEntries = 1'000'000;
// config.json and other JSON side files are small; anything larger is not ours.
constexpr uint64_t kMaxJsonFileBytes = 16u << 20;
constexpr const char* kMetadataKey = "__metadata__";

// The safetensors dtype names graft reads and writes, one per DType; a tensor keeps the dtype
// it was stored in (a BF16 tensor loads as bf16, never widened).
constexpr std::pair<DType, const char*> kStDtypes[] = {{DType::f32, "F32"}, {DType::f64, "F64"},
                                                       {DType::i64, "I64"}, {DType::bf16, "BF16"},
                                                       {DType::f16, "F16"}, {DType::i8, "I8"}};

const char* st_dtype(DType dt) {
  for (const auto& [d, name] : kStDtypes)
    if (d == dt) return name;
  fail(std::string("save_safetensors: no safetensors name for dtype ") + dtype_name(dt));
}

bool parse_st_dtype(const std::string& s, DType& out) {
  for (const auto& [d, name] : kStDtypes)
    if (s == name) return out = d, true;
  return false;
}

// "F32, F64, I64, BF16, F16, I8", for the message refusing another dtype.
std::string st_dtype_list() {
  std::string r;
  for (const auto& [d, name] : kStDtypes) r += (r.empty() ? "" : ", ") + std::string(name);
  return r;
}

// Names and paths from a file may hold any bytes: quoted, they print escaped.
std::string squote(const std::string& s) {
  std::string q = "'";  // appended rather than `"'" + x + "'"`, which trips g++ 12's -Wrestrict
  q += text::printable(s);
  q += '\'';
  return q;
}

// ---------------------------------------------------------------------------------------------
// Loading

[[noreturn]] void load_fail(const std::string& path, const std::string& msg) {
  fail("load_safetensors: " + squote(path) + ": " + msg);
}

struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

// A non-negative JSON integer that fits int64 (nlohmann stores those as number_unsigned;
// negatives are number_integer and 2.0 is number_float, both rejected).
bool as_index(const nlohmann::json& v, uint64_t& out) {
  if (!v.is_number_unsigned()) return false;
  out = v.get<uint64_t>();
  return out <= uint64_t(std::numeric_limits<int64_t>::max());
}

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& v,
                  uint64_t data_size) {
  auto bad = [&](const std::string& msg) -> void {
    load_fail(path, "tensor " + squote(name) + ": " + msg);
  };
  Entry e;
  e.name = name;
  if (!v.is_object()) bad("entry is not a JSON object (got " + std::string(v.type_name()) + ")");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) bad(std::string("missing '") + key + "'");
  for (const auto& [key, _] : v.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      bad("unexpected key " + squote(key));

  const nlohmann::json& dt = v["dtype"];
  if (!dt.is_string()) bad("dtype is not a string (got " + json_excerpt(dt) + ")");
  if (!parse_st_dtype(dt.get<std::string>(), e.dtype))
    bad("unsupported dtype " + squote(dt.get<std::string>()) + " (supported: " + st_dtype_list() +
        ")");

  const nlohmann::json& sh = v["shape"];
  if (!sh.is_array()) bad("shape is not a list (got " + json_excerpt(sh) + ")");
  // Every stride must fit int64 too, so the bound uses max(d, 1): a zero dimension must not
  // hide an overflowing product of the others.
  uint64_t extent = 1, numel = 1;
  for (size_t i = 0; i < sh.size(); ++i) {
    uint64_t d = 0;
    if (!as_index(sh[i], d))
      bad("shape entry " + std::to_string(i) + " is " + json_excerpt(sh[i]) +
          ", expected a non-negative integer");
    if (__builtin_mul_overflow(extent, std::max<uint64_t>(d, 1), &extent) ||
        extent > uint64_t(std::numeric_limits<int64_t>::max()))
      bad("shape " + json_excerpt(sh) + " is too large (element count overflows int64)");
    numel *= d;  // <= extent, cannot overflow
    e.shape.push_back(int64_t(d));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &nbytes))
    bad("shape " + shape_str(e.shape) + " of " + st_dtype(e.dtype) +
        " is too large (byte count overflows)");

  const nlohmann::json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    bad("data_offsets must be a list of two integers [begin, end] (got " + json_excerpt(off) + ")");
  if (!as_index(off[0], e.begin) || !as_index(off[1], e.end))
    bad("data_offsets " + json_excerpt(off) + " are not non-negative integers");
  if (e.begin > e.end)
    bad("data_offsets begin " + std::to_string(e.begin) + " is after end " + std::to_string(e.end));
  if (e.end > data_size)
    bad("data_offsets end " + std::to_string(e.end) + " is past the end of the " +
        std::to_string(data_size) + "-byte data section");
  if (e.end - e.begin != nbytes)
    load_fail(path, "tensor " + squote(name) + " declares " + std::to_string(e.end - e.begin) +
                        " bytes but shape " + shape_str(e.shape) + " of " + st_dtype(e.dtype) +
                        " needs " + std::to_string(nbytes));
  return e;
}

// A SAX handler that records the keys of the outermost object in order and the first key
// that appears twice; parse errors throw (nlohmann's parse_error).
struct TopLevelKeys : nlohmann::json_sax<nlohmann::json> {
  std::vector<std::string> keys;
  std::set<std::string> seen;
  std::string duplicate;
  int depth = 0;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return ++depth, true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return ++depth, true; }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override {
    if (depth == 1) {
      keys.push_back(k);
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw e;  // caught as nlohmann::json::exception, like a DOM parse error
  }
};

// ---------------------------------------------------------------------------------------------
// Writing

// Unbuffered streambuf over a FILE*: stdio does the buffering, and keeping the FILE* lets
// atomic_write fflush + fsync exactly what the writer produced. Remembers the first errno so
// the failure message says why (disk full, quota, ...).
class FileOutBuf : public std::streambuf {
 public:
  explicit FileOutBuf(FILE* f) : f_(f) {}
  int error() const { return err_; }

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    const char ch = traits_type::to_char_type(c);
    return xsputn(&ch, 1) == 1 ? c : traits_type::eof();
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    const size_t w = std::fwrite(s, 1, size_t(n), f_);
    if (w != size_t(n) && !err_) err_ = errno ? errno : EIO;
    return std::streamsize(w);
  }
  int sync() override {
    if (std::fflush(f_) == 0) return 0;
    if (!err_) err_ = errno ? errno : EIO;
    return -1;
  }

 private:
  FILE* f_;
  int err_ = 0;
};

int fsync_retry(int fd) {
  int r;
  do r = ::fsync(fd);
  while (r != 0 && errno == EINTR);
  return r;
}

[[noreturn]] void io_fail(const std::string& path, const std::string& what, int err) {
  fail("atomic_write: " + squote(path) + ": " + what + ": " + std::strerror(err ? err : EIO));
}

std::string read_whole_file(const char* op, const std::string& path, uint64_t max_bytes) {
  auto bad = [&](const std::string& msg) -> void {
    fail(std::string(op) + ": " + squote(path) + ": " + msg);
  };
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    bad("cannot open: " + (ec ? ec.message() : std::string("no such file")));
  if (!fs::is_regular_file(st)) bad("not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(std::string("cannot open: ") + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0 || !in) bad("cannot determine the file size");
  if (uint64_t(size) > max_bytes)
    bad("file is " + std::to_string(size) + " bytes, more than the " + std::to_string(max_bytes) +
        " this kind of file may have");
  std::string s(size_t(size), '\0');
  in.read(s.data(), size);
  if (in.gcount() != size) bad("file shrank while being read");
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string json_message(const nlohmann::json::exception& e) {
  std::string m = e.what();
  if (!m.empty() && m[0] == '[') {
    const size_t close = m.find("] ");
    if (close != std::string::npos) m.erase(0, close + 2);
  }
  return m;
}

std::string json_excerpt(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  fail("SafetensorsFile: no tensor " + squote(name) + " in " + squote(path) + " (it holds " +
       std::to_string(tensors.size()) + " tensors)");
}

bool SafetensorsFile::contains(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return true;
  return false;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  auto bad = [&](const std::string& msg) -> void {
    fail("save_safetensors: " + squote(path) + ": " + msg);
  };
  std::set<std::string> seen;
  ojson header = ojson::object();
  // Metadata first, as the reference writer does, so a human skimming the header sees it.
  if (!metadata.empty()) {
    ojson m = ojson::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[kMetadataKey] = std::move(m);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == kMetadataKey) bad("tensor name '__metadata__' is reserved for the metadata");
    if (!seen.insert(name).second) bad("duplicate tensor name " + squote(name));
    if (!t.defined()) bad("tensor " + squote(name) + " is undefined");
    const uint64_t nbytes = uint64_t(t.numel()) * dtype_size(t.dtype());
    header[name] = {{"dtype", st_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    bad("cannot encode the header (names and metadata must be UTF-8): " + json_message(e));
  }
  // Padding with spaces (valid JSON whitespace) puts the data at an 8-byte aligned offset, so
  // readers that map the file can use the tensors in place.
  text.append((8 - text.size() % 8) % 8, ' ');

  atomic_write(path, [&](std::ostream& os) {
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = char((uint64_t(text.size()) >> (8 * i)) & 0xff);
    os.write(len, 8);
    os.write(text.data(), std::streamsize(text.size()));
    for (const auto& [name, t] : tensors) {
      const Tensor c = t.is_contiguous() ? t : contiguous_copy(t);
      const auto nbytes = std::streamsize(c.numel() * int64_t(dtype_size(c.dtype())));
      if (nbytes > 0) os.write(static_cast<const char*>(c.raw()), nbytes);
      if (!os) return;  // atomic_write reports the I/O error
    }
  });
}

namespace {

// Opens the file and returns its size; errors for a missing file or a non-file.
uint64_t open_checked(const std::string& path, std::ifstream& in) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    load_fail(path, "cannot open: " + (ec ? ec.message() : std::string("no such file")));
  if (!fs::is_regular_file(st)) load_fail(path, "not a regular file");
  in.open(path, std::ios::binary);
  if (!in) load_fail(path, std::string("cannot open: ") + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff fsize = in.tellg();
  in.seekg(0, std::ios::beg);
  if (fsize < 0 || !in) load_fail(path, "cannot determine the file size");
  return uint64_t(fsize);
}

// The 8-byte little-endian header length and the header text, both checked against the limits
// and the file size before anything is allocated.
std::string read_header_text(const std::string& path, std::ifstream& in, uint64_t file_size) {
  if (file_size < 8)
    load_fail(path, "file is " + std::to_string(file_size) +
                        " bytes, too short for the 8-byte header length");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  if (in.gcount() != 8) load_fail(path, "file shrank while being read");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
  if (n > kMaxHeaderBytes)
    load_fail(path, "header length " + std::to_string(n) + " exceeds the limit of " +
                        std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > file_size - 8)
    load_fail(path, "header length " + std::to_string(n) + " is larger than the " +
                        std::to_string(file_size - 8) + " bytes after the length field");
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  if (uint64_t(in.gcount()) != n) load_fail(path, "file shrank while being read");
  return text;
}

// The header's entries in header order, its metadata into out.metadata.
std::vector<Entry> parse_header(const std::string& path, const std::string& text,
                                uint64_t data_size, SafetensorsFile& out) {
  // Structure first: a legal header nests three levels ({ "name": { "shape": [ ] } }), and
  // checking that before nlohmann builds anything keeps a deeply nested header from exhausting
  // the stack.
  check_json_text(text, 3, kMaxHeaderEntries, "load_safetensors: " + squote(path) + ": header");
  // The DOM silently keeps the last of two equal keys, which would drop a tensor, and its map
  // sorts them: a SAX pass records the top-level keys in header order and finds duplicates
  // (nlohmann's callback parser would do it in quadratic time), then the DOM is built.
  TopLevelKeys top;
  nlohmann::json header;
  try {
    nlohmann::json::sax_parse(text, &top);
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    load_fail(path, "header is not valid JSON: " + json_message(e));
  }
  if (!header.is_object())
    load_fail(path, "header is not a JSON object (got " + std::string(header.type_name()) + ")");
  if (!top.duplicate.empty())
    load_fail(path, "tensor " + squote(top.duplicate) + " appears twice in the header");
  std::vector<Entry> entries;
  for (const std::string& key : top.keys) {
    const nlohmann::json& v = header[key];
    if (key != kMetadataKey) {
      entries.push_back(parse_entry(path, key, v, data_size));
      continue;
    }
    if (!v.is_object())
      load_fail(path, "__metadata__ is not a JSON object (got " + std::string(v.type_name()) + ")");
    for (const auto& [mk, mv] : v.items()) {
      if (!mv.is_string())
        load_fail(path, "__metadata__ value for " + squote(mk) + " is not a string (got " +
                            json_excerpt(mv) + ")");
      out.metadata[mk] = mv.get<std::string>();
    }
  }
  return entries;
}

// The regions must tile [0, data_size) exactly, as the reference implementation requires: a gap
// or an overlap means the header and the data disagree. Sorts the entries into file order
// (stable, so equal empty regions keep their header order, the save order of files written here).
void check_regions_tile(const std::string& path, std::vector<Entry>& entries, uint64_t data_size) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin != cursor) {
      const std::string after = prev ? "the previous tensor " + squote(prev->name) +
                                           " ends at byte " + std::to_string(cursor)
                                     : std::string("the data section starts at byte 0");
      load_fail(path, "tensor " + squote(e.name) + " starts at byte " + std::to_string(e.begin) +
                          " but " + after + " (" + (e.begin < cursor ? "overlap" : "gap") +
                          "; data regions must be contiguous)");
    }
    cursor = e.end;
    prev = &e;
  }
  if (cursor != data_size)
    load_fail(path, "trailing data: the tensors cover " + std::to_string(cursor) +
                        " bytes of the " + std::to_string(data_size) + "-byte data section");
}

}  // namespace

namespace {

// The file's validated entries in file order, its metadata into out; `in` left at the data.
std::vector<Entry> read_checked_header(const std::string& path, std::ifstream& in,
                                       SafetensorsFile& out) {
  const uint64_t file_size = open_checked(path, in);
  const std::string text = read_header_text(path, in, file_size);
  const uint64_t data_size = file_size - 8 - text.size();
  out.path = path;
  std::vector<Entry> entries = parse_header(path, text, data_size, out);
  check_regions_tile(path, entries, data_size);
  return entries;
}

}  // namespace

SafetensorsFile load_safetensors(const std::string& path,
                                 const std::function<bool(const std::string&)>& keep) {
  std::ifstream in;
  SafetensorsFile out;
  const std::vector<Entry> entries = read_checked_header(path, in, out);
  // Everything is validated, so the reads below are exactly the data section, in file order.
  // Reading straight into each tensor's storage avoids holding the file twice in memory.
  out.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    const uint64_t nbytes = e.end - e.begin;
    if (keep && !keep(e.name)) {
      in.seekg(std::streamoff(nbytes), std::ios::cur);
      continue;
    }
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (nbytes > 0) {
      in.read(static_cast<char*>(t.raw()), std::streamsize(nbytes));
      if (uint64_t(in.gcount()) != nbytes)
        load_fail(path, "file shrank while reading tensor " + squote(e.name));
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

SafetensorsFile load_safetensors(const std::string& path) { return load_safetensors(path, {}); }

SafetensorsHeader inspect_safetensors(const std::string& path) {
  std::ifstream in;
  SafetensorsFile meta;
  SafetensorsHeader out;
  for (const Entry& e : read_checked_header(path, in, meta))
    out.tensors.push_back({e.name, e.dtype, e.shape, e.end - e.begin});
  out.metadata = std::move(meta.metadata);
  out.path = path;
  return out;
}

int create_temp_file(const std::string& path, std::string& tmp, const std::string& who) {
  // Names no other process can guess in advance are not what makes this safe (O_EXCL and
  // O_NOFOLLOW are: a planted file or link makes open fail instead of being written through);
  // they keep a planted name from blocking the write, and two writers of one path apart.
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  constexpr const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  int err = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string suffix(6, 'x');
    {
      std::lock_guard<std::mutex> lock(mu);
      for (char& c : suffix) c = kChars[gen() % (sizeof kChars - 1)];
    }
    tmp = path + ".tmp." + std::to_string(::getpid()) + "." + suffix;
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) return fd;
    err = errno;
    if (err != EEXIST) break;
  }
  fail(who + ": " + squote(path) + ": cannot create the temporary file " + squote(tmp) + ": " +
       std::strerror(err));
}

void atomic_write(const std::string& path, const std::function<void(std::ostream&)>& writer) {
  std::string tmp;
  const int fd = create_temp_file(path, tmp, "atomic_write");
  FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    io_fail(path, "cannot open the temporary file " + squote(tmp), err);
  }
  try {
    FileOutBuf buf(f);
    std::ostream os(&buf);
    writer(os);
    os.flush();
    if (!os || buf.error()) io_fail(path, "writing " + squote(tmp) + " failed", buf.error());
    if (std::fflush(f) != 0) io_fail(path, "flushing " + squote(tmp) + " failed", errno);
    if (fsync_retry(::fileno(f)) != 0) io_fail(path, "fsync of " + squote(tmp) + " failed", errno);
    FILE* g = f;
    f = nullptr;  // fclose releases the FILE even when it fails: never close it twice
    if (std::fclose(g) != 0) io_fail(path, "closing " + squote(tmp) + " failed", errno);
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      io_fail(path, "cannot rename " + squote(tmp) + " over it", errno);
  } catch (...) {
    if (f) std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  // Without this the rename itself may not survive a power loss, leaving the old file back.
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) io_fail(path, "written, but cannot open its directory to fsync it", errno);
  const int r = fsync_retry(dfd);
  const int err = errno;
  ::close(dfd);
  // Some filesystems cannot fsync a directory and say EINVAL; the data itself is durable.
  if (r != 0 && err != EINVAL) io_fail(path, "written, but fsync of its directory failed", err);
}

void atomic_copy(const std::string& src, const std::string& dst) {
  std::ifstream in(src, std::ios::binary);
  if (!in) fail("atomic_copy: " + squote(src) + ": cannot open: " + std::strerror(errno));
  atomic_write(dst, [&](std::ostream& os) {
    char buf[1 << 16];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) os.write(buf, in.gcount());
    if (in.bad()) fail("atomic_copy: " + squote(src) + ": reading failed");
  });
}

// The pid in a temp file name create_temp_file (or graph_file.cpp, "<name>.tmp.<pid>.dot") made,
// or in the "<name>.tmp.<pid>" of graft 0.6 and earlier; 0 for any other name.
static int temp_file_owner(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at == 0) return 0;
  const std::string rest = name.substr(at + 5);
  const size_t dot = rest.find('.');
  const std::string pid = rest.substr(0, dot);
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos)
    return 0;
  if (dot != std::string::npos) {  // create_temp_file's random suffix, or graph_file's ".dot"
    const std::string suffix = rest.substr(dot + 1);
    if (suffix.empty() || suffix.size() > 16 ||
        std::any_of(suffix.begin(), suffix.end(),
                    [](char c) { return !std::isalnum((unsigned char)c); }))
      return 0;
  }
  return std::stoi(pid);
}

int remove_stale_temp_files(const std::string& dir) {
  int removed = 0;
  std::error_code ec;
  for (const fs::path e : directory_entries(dir, ec)) {
    const int pid = temp_file_owner(e.filename().string());
    if (pid <= 0) continue;
    if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // still running
    if (fs::remove(e, ec)) ++removed;
  }
  return removed;
}

namespace {

// What kind of file st is, for a message, or "" for a regular file.
const char* special_kind(const struct stat& st) {
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return "a device";
  if (S_ISFIFO(st.st_mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "";
}

// Whether b names the file a names: the same inode where both exist (a_st: a's stat, null when
// a does not exist), else the same canonical path (a file about to be made, spelt two ways).
bool same_file(const std::string& a, const struct stat* a_st, const std::string& b) {
  struct stat b_st;
  if (a_st && ::stat(b.c_str(), &b_st) == 0)
    return a_st->st_dev == b_st.st_dev && a_st->st_ino == b_st.st_ino;
  std::error_code ec1, ec2;
  const fs::path ca = fs::weakly_canonical(a, ec1), cb = fs::weakly_canonical(b, ec2);
  return !ec1 && !ec2 && ca == cb;
}

}  // namespace

void check_output_path(const std::string& who, const std::string& path,
                       const std::vector<NamedInput>& inputs) {
  const std::string prefix = who.empty() ? "" : who + ": ";
  if (path.empty()) fail(prefix + "the output path is empty");
  const std::string where = prefix + squote(text::printable(path));
  struct stat st;
  const bool exists = ::stat(path.c_str(), &st) == 0;  // follows a link to what it names
  if (!exists && errno != ENOENT) fail(where + ": cannot check it: " + std::strerror(errno));
  if (exists) {
    struct stat lst;
    const bool link = ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode);
    if (const char* kind = special_kind(st); *kind)
      fail(where + " is " + std::string(link ? "a symbolic link to " : "") + kind +
           ", not a file to write");
  }
  for (const NamedInput& in : inputs)
    if (!in.path.empty() && same_file(path, exists ? &st : nullptr, in.path))
      fail(where + " is the same file as " + (in.what.empty() ? "the input" : in.what) + " (" +
           squote(text::printable(in.path)) +
           "), which this command reads: writing it would destroy it");
}

void save_json(const std::string& path, const nlohmann::json& j) {
  std::string text;
  try {
    text = j.dump(2);
  } catch (const nlohmann::json::exception& e) {
    fail("save_json: " + squote(path) + ": cannot encode: " + json_message(e));
  }
  text += '\n';
  atomic_write(path,
               [&](std::ostream& os) { os.write(text.data(), std::streamsize(text.size())); });
}

nlohmann::json load_resume_config(const std::string& run_dir) {
  const std::string path = run_dir + "/config.json";
  std::error_code ec;
  if (!fs::exists(path, ec))
    fail("resume: '" + path + "' is missing (nothing to resume; start a fresh run instead)");
  return load_json(path);
}

nlohmann::json load_json(const std::string& path) {
  return parse_json(read_whole_file("load_json", path, kMaxJsonFileBytes),
                    "load_json: " + squote(path), 32);
}

nlohmann::json parse_json(const std::string& text, const std::string& where, int max_depth) {
  check_json_text(text, max_depth, std::numeric_limits<size_t>::max(), where);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann's message carries "at line L, column C", which is what a person needs to fix it.
    fail(where + ": " + json_message(e));
  }
}

void check_json_text(const std::string& text, int max_depth, size_t max_top_level_values,
                     const std::string& where) {
  int depth = 0;
  size_t top = 0;  // values directly inside the outermost container (counted by their commas)
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > max_depth)
        fail(where + ": JSON nested more than " + std::to_string(max_depth) +
             " levels deep; not a file of this kind");
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == ',' && depth == 1 && ++top >= max_top_level_values) {
      fail(where + ": more than " + std::to_string(max_top_level_values) + " entries");
    }
  }
}

namespace {

// Side files are small (a config, a tokenizer model); the bound keeps a wrong path from being
// read whole.
constexpr uint64_t kMaxTiedFileBytes = 256u << 20;

std::string fingerprint_key(const std::string& file) {
  return "fingerprint:" + fs::path(file).filename().string();
}

}  // namespace

std::string file_fingerprint(const std::string& file, const char* who) {
  return text_checksum(read_whole_file(who, file, kMaxTiedFileBytes));
}

void save_weights(const std::vector<std::pair<std::string, Tensor>>& sd, const std::string& path,
                  int64_t step, const std::string& format,
                  const std::vector<std::string>& tied_files,
                  const std::map<std::string, std::string>& more_metadata) {
  std::map<std::string, std::string> meta = more_metadata;
  for (auto& [k, v] : checksum_metadata(sd)) meta[k] = v;
  meta["format"] = format;
  meta["step"] = std::to_string(step);
  for (auto& f : tied_files) meta[fingerprint_key(f)] = file_fingerprint(f, "save_weights");
  save_safetensors(path, sd, meta);
}

std::vector<std::pair<std::string, Tensor>> load_weights(
    const std::string& path, const char* who, const std::vector<std::string>& tied_files) {
  return std::move(load_weights_file(path, who, tied_files).tensors);
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  std::ifstream in;
  const uint64_t file_size = open_checked(path, in);
  const std::string text = read_header_text(path, in, file_size);
  SafetensorsFile out;
  out.path = path;
  parse_header(path, text, file_size - 8 - text.size(), out);
  return out.metadata;
}

SafetensorsFile load_weights_file(const std::string& path, const char* who,
                                  const std::vector<std::string>& tied_files) {
  SafetensorsFile f = load_safetensors(path);
  check_weights_checksum(f, who);
  for (auto& file : tied_files) {
    auto fp = f.metadata.find(fingerprint_key(file));
    if (fp == f.metadata.end())
      fail(std::string(who) + ": '" + f.path + "' carries no fingerprint of '" + file +
           "' (written before run fingerprints existed, or not by this program): retrain or "
           "re-save it");
    if (fp->second != file_fingerprint(file, who))
      fail(std::string(who) + ": '" + file + "' does not match the weights in '" + f.path +
           "': it was edited or comes from another run");
  }
  return f;
}

namespace {

// FNV-style mixing of 64-bit words; not cryptographic, but any flipped bit changes it.
struct Hash64 {
  uint64_t h = 0xcbf29ce484222325ull;
  void mix(uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0x100000001b3ull;
  }
  void bytes(const unsigned char* p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix(w);
    }
    for (; i < n; ++i) mix(p[i]);
  }
  std::string hex() const {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
    return buf;
  }
};

// The checksum of `tensors`; with_dtype: weights_checksum's, else that of files written before
// graft 0.6 (checksum_version absent).
std::string checksum_of(const std::vector<std::pair<std::string, Tensor>>& tensors,
                        bool with_dtype) {
  Hash64 h;
  for (auto& [name, t0] : tensors) {
    for (char c : name) h.mix((unsigned char)c);
    if (with_dtype)
      for (const char* c = dtype_name(t0.dtype()); *c; ++c) h.mix((unsigned char)*c);
    for (auto d : t0.shape()) h.mix((uint64_t)d);
    const Tensor t = t0.is_contiguous() ? t0 : contiguous_copy(t0);
    h.bytes(static_cast<const unsigned char*>(t.raw()), (size_t)t.numel() * dtype_size(t.dtype()));
  }
  return h.hex();
}

}  // namespace

std::string weights_checksum(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  return checksum_of(tensors, true);
}

std::map<std::string, std::string> checksum_metadata(
    const std::vector<std::pair<std::string, Tensor>>& tensors) {
  return {{"checksum", weights_checksum(tensors)}, {"checksum_version", "2"}};
}

void check_weights_checksum(const SafetensorsFile& f, const std::string& who) {
  const auto it = f.metadata.find("checksum");
  if (it == f.metadata.end())
    fail(who + ": '" + f.path + "': no checksum in the metadata; not a graft checkpoint");
  const auto version = f.metadata.find("checksum_version");
  const bool v2 = version != f.metadata.end();
  if (v2 && version->second != "2")
    fail(who + ": '" + f.path + "': unknown checksum_version '" + text::printable(version->second) +
         "' (this graft writes and reads 2)");
  const std::string sum = checksum_of(f.tensors, v2);
  if (it->second != sum)
    fail(who + ": '" + f.path + "': checksum mismatch (stored " + text::printable(it->second) +
         ", computed " + sum + "): the checkpoint is corrupted");
}

std::string text_checksum(const std::string& text) {
  Hash64 h;
  h.mix(text.size());
  h.bytes(reinterpret_cast<const unsigned char*>(text.data()), text.size());
  return h.hex();
}

}  // namespace graft::train
