#pragma once
/// \file
/// `window_buffers`: the host memory a distributed load's windows lie in (its
/// reads land there, its messages leave from and arrive there, its sink gets
/// views of it), lent by the reuse rule of memory/recycler.hpp: a window's
/// buffer goes back when the window and every view of it are gone, and the
/// next window of the same size takes it again (a read_window asks for each
/// region at the largest size it has in any window, so every window fits
/// every buffer), instead of paying first touch again (slow on hosts that
/// reclaim freed pages, and paid inside the exchange for bytes that arrive;
/// see bench/README.md). A sink that keeps views keeps their buffers out:
/// the next window gets others.
///
/// Kept between loads: give the same object to successive loads
/// (`distributed_options::buffers`, e.g. weight reloads) and they reuse the
/// memory already faulted in. The load reserves room for its windows' own
/// buffers (both parities); what a sink releases beyond that is freed.
///
/// Not pre-faulted: populating a window's buffers up front
/// (MADV_POPULATE_WRITE) takes first touch out of the exchange but makes the
/// whole load slower, because faults taken while a rank waits on its peers
/// cost less than faults taken by every rank at once before reading
/// (figures: bench/README.md).

#include <cstddef>

#include <sluice/memory/lease.hpp>
#include <sluice/memory/recycler.hpp>

namespace sluice::inline v0 {

class window_buffers {
 public:
  /// A buffer of `n` bytes (empty for 0).
  [[nodiscard]] lease get(std::size_t n) { return r_.get(n); }
  /// Keeps at least `bytes` of idle buffers between windows and loads
  /// (capacities, as memory::anonymous_memory rounds them: capacity_for()).
  void reserve(std::size_t bytes) { r_.reserve(bytes); }
  [[nodiscard]] std::size_t capacity_for(std::size_t n) const { return n ? memory::anonymous_memory{}.capacity_for(n) : 0; }
  /// Frees the idle buffers (those a sink holds go when it lets go).
  void release() { r_.release(); }
  [[nodiscard]] memory::recycler_stats stats() const { return r_.stats(); }

 private:
  memory::recycler<memory::anonymous_memory> r_;
};

}  // namespace sluice::inline v0
