#pragma once
/// \file
/// The failure protocol of a distributed load: after each phase the ranks
/// exchange a status record, and a rank that failed makes every rank throw
/// distributed_error naming it; the plan digest they compare first.

#include <utility>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include <sluice/comm/concepts.hpp>
#include <sluice/error.hpp>
#include <sluice/policy/plan.hpp>

namespace sluice::inline v0 {

namespace detail {

inline constexpr std::size_t status_bytes = 1024;

/// Runs `f` (calls on the communicator) in `phase` of the load: a lost peer
/// or a timeout it throws names the phase.
template <class F>
decltype(auto) in_phase(std::string_view phase, F&& f) {
  try {
    return f();
  } catch (const comm::peer_lost& e) {
    throw e.in_phase(std::string(phase));
  } catch (const comm::comm_timeout& e) {
    throw e.in_phase(std::string(phase));
  }
}

/// The status exchange that ends a phase: every rank says whether it failed
/// (`failure`, with its message); if any did, every rank throws
/// distributed_error naming the lowest failed rank. `payload`: bytes of this
/// rank's that travel in the same all-gather (what the next phase needs from
/// every rank, so that one meeting of the ranks serves both), every rank's
/// landing in `payloads` (rank r's at r * payload.size()) when none failed.
template <comm::communicator Comm>
void check_peers(Comm& c, std::exception_ptr& failure, std::string_view phase, std::span<const std::byte> payload = {},
                 std::span<std::byte> payloads = {}) {
  const std::size_t record = status_bytes + payload.size();
  std::vector<std::byte> mine(record), all(record * c.size());
  struct wiped {  // payloads may be secret (the node memory's tickets): zeroed however this returns
    std::vector<std::byte>& a;
    std::vector<std::byte>& b;
    ~wiped() { std::fill(a.begin(), a.end(), std::byte{0}), std::fill(b.begin(), b.end(), std::byte{0}); }
  } wipe{mine, all};
  if (failure) {
    std::string msg;
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
      msg = "unknown error";
    }
    mine[0] = std::byte{1};
    std::memcpy(mine.data() + 1, msg.data(), std::min(msg.size(), status_bytes - 2));
  }
  if (!payload.empty()) std::memcpy(mine.data() + status_bytes, payload.data(), payload.size());
  in_phase(phase, [&] { c.all_gather(mine, all); });
  for (std::size_t r = 0; r < c.size(); ++r) {
    if (all[r * record] == std::byte{0}) continue;
    const char* m = reinterpret_cast<const char*>(all.data() + r * record + 1);
    throw distributed_error(fmt::format("rank {} failed while {}: {}", r, phase, std::string(m, strnlen(m, status_bytes - 1))), r);
  }
  if (!payload.empty())
    for (std::size_t r = 0; r < c.size() && (r + 1) * payload.size() <= payloads.size(); ++r)
      std::memcpy(payloads.data() + r * payload.size(), all.data() + r * record + status_bytes, payload.size());
}

/// One phase of the failure protocol: runs this rank's part (`f`), catches
/// what it throws, then agrees with the peers on the outcome (check_peers).
/// `f` calls the communicator only in collectives that every rank completes
/// whether or not it fails (the collective open's broadcasts): a rank that
/// threw before one would leave its peers waiting in it. `payload`,
/// `payloads`: as check_peers', the payload filled by `f` (what it found,
/// for every rank).
template <comm::communicator Comm, class F>
void run_phase(Comm& c, std::string_view phase, F&& f, std::span<const std::byte> payload = {},
               std::span<std::byte> payloads = {}) {
  std::exception_ptr failure;
  try {
    f();
  } catch (...) {
    failure = std::current_exception();
  }
  check_peers(c, failure, phase, payload, payloads);
}

}  // namespace detail

}  // namespace sluice::inline v0
