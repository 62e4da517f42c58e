#pragma once
/// \file
/// The hardware threads this process may run on, and whether each of a
/// node's local ranks has cores to spare: the rule by which automatic modes
/// choose work that trades CPU time for latency (reading the next window
/// while this one's collective runs, mapping a view's pages in ahead of its
/// consumer). On a machine whose cores the ranks already fill, such work
/// only adds CPU time that the ranks' own work waits for.

#include <sched.h>

#include <algorithm>
#include <cstddef>
#include <thread>

namespace sluice::inline v0 {

/// The hardware threads this process may run on: its CPU affinity (taskset,
/// a container's cpuset), else what the machine reports; at least 1.
[[nodiscard]] inline std::size_t hardware_threads() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return static_cast<std::size_t>(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());  // more CPUs than a cpu_set_t holds
}

/// Each of `local_ranks` ranks' share of this process's hardware threads
/// (hardware_threads()), at least 1.
[[nodiscard]] inline std::size_t threads_per_rank(std::size_t local_ranks) noexcept {
  return std::max<std::size_t>(1, hardware_threads() / std::max<std::size_t>(1, local_ranks));
}

/// Whether each of `local_ranks` ranks on this node has at least two
/// hardware threads (hardware_threads()).
[[nodiscard]] inline bool cores_to_spare(std::size_t local_ranks) noexcept {
  return hardware_threads() >= 2 * std::max<std::size_t>(1, local_ranks);
}

}  // namespace sluice::inline v0
