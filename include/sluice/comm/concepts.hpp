#pragma once
/// \file
/// The `communicator` concept: the few blocking collectives the distributed
/// loader needs, over host memory. Blocking is deliberate (Gloo's and NCCL's
/// host APIs are): the driver calls them between pipeline windows, never from
/// a coroutine running on the io_context that does the I/O.
///
/// Every rank must issue the same collectives in the same order (the plan
/// fixes it). A peer that dies or stalls makes the call throw `comm_error`
/// within the communicator's timeout; it never hangs.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <sluice/error.hpp>

namespace sluice::inline v0::comm {

/// One point-to-point message of an `exchange`: `bytes` sent to, or received
/// from, `peer`. The sender and the receiver give the same `tag` (unique
/// within the exchange) and the same size.
template <class Bytes>
struct message {
  std::size_t peer = 0;
  std::uint32_t tag = 0;
  Bytes bytes;
};
using send_message = message<std::span<const std::byte>>;
using recv_message = message<std::span<std::byte>>;

/// Blocking host-memory collectives among `size()` ranks.
/// - `broadcast(buf, root)`: root's `buf` is copied into every rank's `buf` (equal sizes);
/// - `all_gather(in, out)`: `out` (size() x in.size() bytes) gets every rank's `in`, in rank order;
/// - `all_gather_v(buf, counts)`: in place; rank r's `counts[r]` bytes sit at offset
///   sum(counts[0..r)) of `buf` on entry (its own part) and everyone's on return;
/// - `exchange(sends, recvs)`: targeted point-to-point: posts every message,
///   returns when all arrived. Every rank calls it (with nothing, when it has
///   nothing to send or receive), so that calls pair up across ranks;
/// - `barrier()`.
template <class C>
concept communicator = requires(C& c, std::span<std::byte> buf, std::span<const std::byte> in, std::size_t root,
                                std::span<const std::size_t> counts, std::span<const send_message> sends,
                                std::span<const recv_message> recvs) {
  { c.rank() } -> std::convertible_to<std::size_t>;
  { c.size() } -> std::convertible_to<std::size_t>;
  c.broadcast(buf, root);
  c.all_gather(in, buf);
  c.all_gather_v(buf, counts);
  c.exchange(sends, recvs);
  c.barrier();
};

/// The size of a communicator's world where its type fixes it (a
/// `static constexpr std::size_t static_size` member: comm::local's is 1),
/// else std::dynamic_extent. A static topology is checked against it at
/// compile time (load_distributed over a policy::plan).
template <class C>
inline constexpr std::size_t static_size_v = [] {
  if constexpr (requires { { C::static_size } -> std::convertible_to<std::size_t>; })
    return std::size_t{C::static_size};
  else
    return std::dynamic_extent;
}();

}  // namespace sluice::inline v0::comm
