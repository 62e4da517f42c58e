#pragma once
/// \file
/// The test-only fault hook of a distributed load. In a build with
/// `SLUICE_TEST_FAULTS` on (the default where sluice's tests are built), a
/// rank whose environment has `SLUICE_TEST_FAULT=PHASE:RANK:SIGNAL` (e.g.
/// `exchange:0:KILL`, `tables:2:STOP`, a signal by name or number) raises
/// that signal on itself when the load enters PHASE, the first time. Phases,
/// in load order: `open`, `plan`, `tables` (shared table reads), `reads`
/// (the first window's reads), `exchange` (the first window's messages, once
/// posted), `delivery` (the first window handed to the sink). Elsewhere the
/// hook does nothing and reads no environment: a fault is placed by the
/// test, not by the clock (a timed kill of a one-second load on two busy
/// cores lands anywhere).

#include <cstddef>
#include <string_view>

namespace sluice::inline v0::detail {

/// Raises the signal SLUICE_TEST_FAULT names when `phase` and `rank` match it
/// (test builds only; a no-op otherwise). Compiled once, in src/core.
void fault_point(std::string_view phase, std::size_t rank) noexcept;

}  // namespace sluice::inline v0::detail
