// prefaulter (memory/prefaulter.hpp): MADV_POPULATE_WRITE from the last
// destination backwards, in 2 MiB pieces, until it meets the load.

#include <sluice/memory/prefaulter.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <system_error>

#include "../core/thread_name.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack the name
#endif

namespace sluice::inline v0 {

prefaulter::prefaulter(std::vector<std::span<std::byte>> destinations, std::uint64_t min_bytes)
    : dst_(std::move(destinations)) {
  std::uint64_t total = 0;
  for (auto d : dst_) total += d.size();
  if (total == 0 || total < min_bytes) return;
  try {
    thread_ = detail::named_thread("sluice-prefault", [this] { populate_backwards(dst_, reached_, stop_, bytes_); });
    started_ = true;
  } catch (const std::system_error&) {
    // No thread: the reads fault their destinations in themselves, as without one.
  }
}

void prefaulter::stop() noexcept {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

void prefaulter::populate_backwards(std::span<const std::span<std::byte>> dst, const std::atomic<std::size_t>& reached,
                                    const std::atomic<bool>& stop, std::atomic<std::uint64_t>& bytes) noexcept {
  constexpr std::uintptr_t piece = std::uintptr_t{2} << 20;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (std::size_t i = dst.size(); i-- > 0;) {
    const auto d = dst[i];
    if (d.empty()) continue;
    // Whole pages around the destination: a page it shares with a neighbour
    // is mapped, and populating it writes nothing.
    const auto lo = reinterpret_cast<std::uintptr_t>(d.data()) / page * page;
    auto hi = (reinterpret_cast<std::uintptr_t>(d.data()) + d.size() + page - 1) / page * page;
    while (hi > lo) {
      if (stop.load(std::memory_order_relaxed) || i < reached.load(std::memory_order_relaxed)) return;  // met the load
      const auto from = hi - std::min(piece, hi - lo);
      // Advisory: where the kernel declines (no MADV_POPULATE_WRITE before
      // Linux 5.14, memory that is not ordinary RAM, no memory left), stop.
      if (::madvise(reinterpret_cast<void*>(from), hi - from, MADV_POPULATE_WRITE) != 0) return;
      bytes.fetch_add(hi - from, std::memory_order_relaxed);
      hi = from;
    }
  }
}

}  // namespace sluice::inline v0
