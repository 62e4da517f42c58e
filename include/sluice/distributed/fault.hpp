#pragma once
/// \file
/// The test-only fault hook of a distributed load. In a process that has the
/// hook (a test executable linking tests/support/fault_hook.cpp, or a tool or
/// Python interpreter started with libsluice_test_faults.so in LD_PRELOAD), a
/// rank whose environment has `SLUICE_TEST_FAULT=PHASE:RANK:SIGNAL` (e.g.
/// `exchange:0:KILL`, `tables:2:STOP`, a signal by name or number) raises
/// that signal on itself when the load enters PHASE, the first time
/// (`PAUSE200` instead: the entering thread sleeps 200 ms). Phases, in load
/// order: `open`, `plan`, `tables` (shared table reads), `reads` (the first
/// window's reads), `node copies` (the first copies out of the node window),
/// `exchange` (the first window's messages, once posted), `delivery` (the
/// first window handed to the sink). Elsewhere the
/// hook does nothing and reads no environment: a fault is placed by the
/// test, not by the clock (a timed kill of a one-second load on two busy
/// cores lands anywhere).

#include <cstddef>
#include <string_view>

namespace sluice::inline v0::detail {

/// Calls the test hook, where a test has linked or preloaded it; a no-op
/// otherwise (the library holds only a weak reference to it: nothing
/// installed reads SLUICE_TEST_FAULT). Compiled once, in src/core.
void fault_point(std::string_view phase, std::size_t rank) noexcept;

}  // namespace sluice::inline v0::detail
