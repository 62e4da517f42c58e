#pragma once
/// \file
/// `prefaulter`: faults in the memory a load reads straight into (a sink's
/// direct destinations: an engine's freshly allocated parameters), on a
/// thread of its own, from the last destination backwards while the load
/// fills them from the first.
///
/// The first write to fresh anonymous memory costs a page fault and a page
/// clear per 4 KiB; on a page-cache-hot load into fresh parameters that is
/// most of the load, for every loader (bench/HISTORY.md, fresh destinations).
/// The reads take those faults on whichever thread copies; the prefaulter
/// takes the other end of the destinations on another core
/// (`MADV_POPULATE_WRITE`: faulted in writable, nothing written), so the
/// two meet in the middle. Where they overlap, a page is faulted once: the
/// kernel serialises the two on the page table, and the data is the reads'.
///
/// A thread rather than madvise on the ring: the populates must go in the
/// opposite order to the reads and stop where they meet them, and populates
/// queued on io-wq can be neither reordered nor withdrawn, while they hold
/// workers the reads need.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

namespace sluice::inline v0 {

class prefaulter {
 public:
  /// Destinations together smaller than this are not worth a thread.
  static constexpr std::uint64_t default_min_bytes = std::uint64_t{64} << 20;

  /// Does nothing.
  prefaulter() = default;
  /// Starts on `destinations`, given in the order the load fills them,
  /// when together they hold at least `min_bytes`.
  explicit prefaulter(std::vector<std::span<std::byte>> destinations, std::uint64_t min_bytes = default_min_bytes);
  prefaulter(const prefaulter&) = delete;
  prefaulter& operator=(const prefaulter&) = delete;
  ~prefaulter() { stop(); }

  /// The load has filled (or is filling) the first `n` destinations: the
  /// prefaulter stops before reaching them. Any thread.
  void reached(std::size_t n) noexcept {
    for (auto seen = reached_.load(std::memory_order_relaxed); seen < n;)
      if (reached_.compare_exchange_weak(seen, n, std::memory_order_relaxed)) break;
  }
  /// Stops the thread (at its next 2 MiB piece) and waits for it.
  void stop() noexcept;
  /// Bytes the prefaulter faulted in (final once stopped).
  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_.load(std::memory_order_relaxed); }
  /// Whether a thread was started.
  [[nodiscard]] bool started() const noexcept { return started_; }

  /// The thread's work, on the calling thread: faults `dst` in from the last
  /// destination backwards, 2 MiB at a time, until a destination below
  /// `reached` is next, `stop` is set, or the kernel declines (the reads then
  /// fault the pages in themselves, or fail with their own error). Adds
  /// the bytes faulted in to `bytes`.
  static void populate_backwards(std::span<const std::span<std::byte>> dst, const std::atomic<std::size_t>& reached,
                                 const std::atomic<bool>& stop, std::atomic<std::uint64_t>& bytes) noexcept;

 private:
  std::vector<std::span<std::byte>> dst_;
  std::atomic<std::size_t> reached_{0};
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> bytes_{0};
  bool started_ = false;
  std::thread thread_;
};

}  // namespace sluice::inline v0
