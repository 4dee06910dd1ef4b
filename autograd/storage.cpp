// The allocator behind Storage (autograd/tensor.h): glibc's heap behind a per-thread cache for
// small blocks, and for blocks of 128 KiB and more a cache of mapped memory; the live and peak byte
// counters.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include <sys/mman.h>

#include "graft/autograd/tensor.h"

namespace graft {

namespace {
std::atomic<size_t> g_live_bytes{0};
std::atomic<size_t> g_peak_bytes{0};

void add_live(size_t n) {
  const size_t now = g_live_bytes += n;
  size_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !g_peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
}  // namespace

// Blocks of 128 KiB and more are mapped straight from the OS and, when freed, kept (up to
// kBigCacheCap bytes) for a later request of the same size class. Without the cache each
// training step paid page faults and zeroing for every activation (14% of a small-Transformer
// step in a profile). The cache's footprint (in use + cached) is bounded by the most ever in
// use, so resident memory follows the live peak rather than live + cache (a training step's
// forward frees activation sizes, its backward asks for gradient sizes); see Storage::Storage
// for how a miss at that bound reuses cached memory of another size.
namespace {
// Blocks from 128 KiB on (glibc's default mmap threshold) are big: glibc raises that threshold
// to the size of each mapped block freed (up to 32 MiB), so blocks it would have mapped come from
// its heap, which fragments and is never given back. With 1 MiB here, 20 steps of base training
// left glibc's heap 32-38 MiB larger, bf16 (512 KiB gradients) and float32 alike
// (docs/mixed-precision.md).
// Sanitizer builds keep 1 MiB: the big-block cache recycles its blocks unseen by AddressSanitizer,
// so only blocks under the limit have their use after free caught.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kBigBlock = size_t(1) << 20;  // smaller blocks: glibc
#else
constexpr size_t kBigBlock = size_t(128) << 10;  // smaller blocks: glibc and a per-thread cache
#endif
constexpr size_t kBigCacheCap = size_t(4) << 30;

// Free ranges are kept by size (best fit) and by address: a freed range merges with free
// neighbours, so memory split off for small requests joins up again and can serve large ones.
// Without the merging, splits fragmented the cache step after step and the large requests
// grew blocks with fresh pages (35 mremaps and 88 munmaps in a bf16 base step).
struct BigBlockCache {
  std::mutex m;
  std::multimap<size_t, char*> by_size;
  std::map<char*, size_t> by_addr;
  size_t cached = 0;
  size_t in_use = 0;      // bytes of big blocks held by storages
  size_t high_water = 0;  // the most in use so far: the bound on in_use + cached

  // Removes the free range at p of n bytes from both indexes.
  void unlink(char* p, size_t n) {
    by_addr.erase(p);
    for (auto [it, end] = by_size.equal_range(n); it != end; ++it)
      if (it->second == p) {
        by_size.erase(it);
        return;
      }
  }
  // Takes the free range `it` (by size) out of the cache.
  char* take(std::multimap<size_t, char*>::iterator it) {
    char* p = it->second;
    cached -= it->first;
    by_addr.erase(p);
    by_size.erase(it);
    return p;
  }
  // Adds the free range [p, p + n), merged with the free ranges that touch it.
  void put(char* p, size_t n) {
    cached += n;
    auto next = by_addr.find(p + n);
    if (next != by_addr.end()) {
      const size_t more = next->second;
      unlink(next->first, more);
      n += more;
    }
    auto prev = by_addr.lower_bound(p);
    if (prev != by_addr.begin() && std::prev(prev)->first + std::prev(prev)->second == p) {
      --prev;
      p = prev->first;
      const size_t before = prev->second;
      unlink(p, before);
      n += before;
    }
    by_addr[p] = n;
    by_size.emplace(n, p);
  }
};
BigBlockCache& big_cache() {
  // Never destroyed: tensors held by other static objects may be freed after it would be.
  static BigBlockCache* c = new BigBlockCache;
  return *c;
}

constexpr size_t kSmallStep = 4096;  // small blocks up to this size come in steps of 64 bytes

size_t alloc_size(size_t n) {
  if (n > kSmallStep) {
    // Size classes 1/8 of a power of two apart: few distinct sizes, at most 25% waste.
    const size_t granule = std::bit_ceil(n) / 8;
    return (n + granule - 1) / granule * granule;
  }
  // Rounded up so aligned_alloc's size rule holds; never zero so data is a valid pointer.
  return n == 0 ? 64 : (n + 63) / 64 * 64;
}

// Freed small blocks are kept per thread by size class (up to kSmallCacheCap bytes a thread) for
// that thread's next request of the class. glibc 2.36 serves every aligned_alloc on its slow path
// (its thread cache does not take aligned requests): 12% of a one-sentence decoding step of the
// tiny Transformer went to aligned_alloc and free. Sanitizer builds skip the cache, so
// AddressSanitizer still sees each block's use after free.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCacheSmall = false;
#else
constexpr bool kCacheSmall = true;
#endif
constexpr size_t kSmallCacheCap = size_t(16) << 20;
constexpr size_t kStepClasses = kSmallStep / 64;  // 64, 128, ..., 4096 bytes
// Above kSmallStep, alloc_size's classes: 4 per power of two up to kBigBlock.
constexpr size_t kSmallClasses = kStepClasses + 4 * (std::bit_width(kBigBlock) - 13);

// The class of a small block of alloc_size() bytes.
size_t small_class(size_t capacity) {
  if (capacity <= kSmallStep) return capacity / 64 - 1;
  const size_t p = std::bit_width(capacity - 1);  // capacity in (2^(p-1), 2^p]
  const size_t k = capacity >> (p - 3);           // in 5..8 granules of 2^(p-3)
  return kStepClasses + 4 * (p - 13) + (k - 5);
}

struct SmallBlockCache {
  std::array<std::vector<void*>, kSmallClasses> free_blocks;
  size_t cached = 0;
  ~SmallBlockCache();
};
// The thread's cache: made on first use, gone (and never made again) once the thread's
// thread_local objects are destroyed; blocks freed after that go back to glibc.
thread_local bool t_small_cache_gone = false;
thread_local SmallBlockCache t_small_cache;
SmallBlockCache::~SmallBlockCache() {
  t_small_cache_gone = true;
  for (auto& blocks : free_blocks)
    for (void* p : blocks) std::free(p);
}

void* small_alloc(size_t capacity) {
  if (kCacheSmall && !t_small_cache_gone) {
    auto& c = t_small_cache;
    auto& blocks = c.free_blocks[small_class(capacity)];
    if (!blocks.empty()) {
      void* p = blocks.back();
      blocks.pop_back();
      c.cached -= capacity;
      return p;
    }
  }
  return std::aligned_alloc(64, capacity);
}

void small_free(void* p, size_t capacity) {
  if (kCacheSmall && !t_small_cache_gone) {
    auto& c = t_small_cache;
    if (c.cached + capacity <= kSmallCacheCap) {
      c.free_blocks[small_class(capacity)].push_back(p);
      c.cached += capacity;
      return;
    }
  }
  std::free(p);
}

void* map_block(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (bytes >= (size_t(2) << 20)) madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}
}  // namespace

Storage::Storage(size_t n, bool count) : nbytes(n), counted(count) {
  capacity = alloc_size(n);
  if (capacity >= kBigBlock) {
    auto& c = big_cache();
    std::vector<std::pair<void*, size_t>> unmap;
    {
      std::lock_guard<std::mutex> lk(c.m);
      // Best fit within 25%: batches of varying length ask for slightly different sizes.
      auto it = c.by_size.lower_bound(capacity);
      const bool fits = it != c.by_size.end() && it->first <= capacity + capacity / 4;
      // A miss splits a larger cached range (its tail stays cached); without one, the
      // footprint (blocks in use + cached) may grow up to the most ever in use, and at that
      // bound the largest cached range is grown instead (mremap keeps its pages and adds only
      // the difference), so memory moves between size classes (activations in the forward,
      // gradients in the backward) without the page faults and zeroing of fresh mappings;
      // smallest ranges are given back if the footprint is still over the bound. Ranges are
      // page ranges of anonymous mappings: any range can be split off or unmapped on its own
      // (a range merged across two mappings cannot be grown: then a fresh one is mapped).
      void* resize = nullptr;
      size_t resize_from = 0;
      if (fits) {
        capacity = it->first;
        data = c.take(it);
      } else if (it != c.by_size.end()) {
        const size_t whole = it->first;
        char* p = c.take(it);
        c.put(p + capacity, whole - capacity);
        data = p;
      } else if (c.in_use + c.cached + capacity > c.high_water && !c.by_size.empty()) {
        resize_from = std::prev(c.by_size.end())->first;  // the largest smaller range, grown
        resize = c.take(std::prev(c.by_size.end()));
        while (!c.by_size.empty() && c.in_use + c.cached + capacity > c.high_water) {
          const size_t bytes = c.by_size.begin()->first;
          unmap.emplace_back(c.take(c.by_size.begin()), bytes);
        }
      }
      if (resize) {
        data = mremap(resize, resize_from, capacity, MREMAP_MAYMOVE);
        if (data == MAP_FAILED) {
          data = nullptr;
          unmap.emplace_back(resize, resize_from);
        } else if (capacity >= (size_t(2) << 20)) {
          madvise(data, capacity, MADV_HUGEPAGE);
        }
      }
      c.in_use += capacity;
      c.high_water = std::max(c.high_water, c.in_use);
    }
    for (auto& [p, bytes] : unmap) munmap(p, bytes);
    if (!data) data = map_block(capacity);
  } else {
    data = small_alloc(capacity);
  }
  if (!data) throw std::bad_alloc();
  if (counted) add_live(n);
}

namespace {
// Returns a storage's bytes: with `keep`, big blocks to the cache (or the OS when it is full) and
// small ones to the thread's cache; without, straight to the OS and glibc.
void free_block(void* data, size_t capacity, bool keep) {
  if (capacity >= kBigBlock) {
    auto& c = big_cache();
    {
      std::lock_guard<std::mutex> lk(c.m);
      c.in_use -= capacity;
      // Bytes given up for good (a weight replaced by its int8 form) leave the bound too: else
      // the cache could grow into the room the float32 weights held.
      if (!keep) c.high_water -= std::min(c.high_water, capacity);
      if (keep && c.cached + capacity <= kBigCacheCap) {
        c.put(static_cast<char*>(data), capacity);
        return;
      }
    }
    munmap(data, capacity);
    return;
  }
  if (keep) small_free(data, capacity);
  else std::free(data);
}
}  // namespace

Storage::~Storage() {
  if (!data) return;  // released
  if (counted) g_live_bytes -= nbytes;
  if (!host) free_block(data, capacity, true);  // else the host's bytes, which go with it
}

std::shared_ptr<Storage> Storage::host_block(size_t n) {
  return std::make_shared<Storage>(n, false);
}

void Storage::move_into(const std::shared_ptr<Storage>& into, size_t offset) {
  if (!data) fail("Storage::move_into: " + released);
  if (host) fail("Storage::move_into: the storage was moved already");
  if (!counted) fail("Storage::move_into: a host_block stays where it is");
  if (!into || !into->data || into.get() == this || offset % 64 != 0 || offset > into->nbytes ||
      nbytes > into->nbytes - offset)
    fail("Storage::move_into: " + std::to_string(nbytes) + " bytes do not fit at offset " +
         std::to_string(offset) + " (64-byte aligned) of a storage of " +
         std::to_string(into ? into->nbytes : 0) + " bytes");
  void* to = static_cast<char*>(into->data) + offset;
  std::memcpy(to, data, nbytes);
  free_block(data, capacity, false);  // not coming back: not to a cache (nbytes stay live)
  data = to;
  capacity = 0;
  host = into;
  ++version;  // copies derived from the bytes at their old address are dropped
}

void Storage::release(const std::string& why) {
  if (!data) return;
  released = why.empty() ? std::string("Storage: its bytes were released") : why;
  if (counted) g_live_bytes -= nbytes;
  if (host) host.reset();                  // the host's bytes: they go with the host
  else free_block(data, capacity, false);  // the bytes are not coming back: not to a cache
  data = nullptr;
  capacity = 0;  // nbytes stays: views of the storage are still checked against it
}

size_t Storage::live_bytes() { return g_live_bytes.load(); }
size_t Storage::peak_live_bytes() { return g_peak_bytes.load(); }
void Storage::reset_peak_live_bytes() { g_peak_bytes = g_live_bytes.load(); }
size_t Storage::release_cached() {
  auto& c = big_cache();
  std::vector<std::pair<char*, size_t>> ranges;
  {
    std::lock_guard<std::mutex> lk(c.m);
    ranges.assign(c.by_addr.begin(), c.by_addr.end());
    c.by_addr.clear();
    c.by_size.clear();
    c.high_water -= std::min(c.high_water, c.cached);
    c.cached = 0;
  }
  size_t bytes = 0;
  for (auto& [p, n] : ranges) munmap(p, n), bytes += n;
  return bytes;
}

size_t Storage::cached_bytes() {
  auto& c = big_cache();
  std::lock_guard<std::mutex> lk(c.m);
  return c.cached;
}

}  // namespace graft
