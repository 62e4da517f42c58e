#pragma once
/// \file
/// The node's memory handoff: how the local rank that made a node's shared
/// memory (memory::shared_host: the shared segment, the node window) gives it
/// to the node's other ranks. Not a path a peer could choose: the memfd itself,
/// passed over a Unix socket (SCM_RIGHTS) in the abstract namespace under a
/// random name, to a connection that
/// - comes from a process of this user (SO_PEERCRED, both ways), and
/// - proves the handoff's token (an HMAC over both sides' fresh nonces, as
///   comm::load_secret proves; the server proves it first, so a rank never
///   takes memory from a stranger who took the name).
/// The token and the name travel in a `ticket` over the load's own
/// communicator (whose pairs proved the load's secret). A connection that
/// proves nothing (a co-tenant on the socket) is refused, closed and reported
/// once through `warn`, and the handoff goes on. What the receiver maps is
/// checked as shared_host::adopt checks it (sealed, this user's, the size
/// expected).

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <sluice/comm/secret.hpp>
#include <sluice/memory/shared_host.hpp>

namespace sluice::inline v0::memory {

class handoff_server {
 public:
  /// Listens for `mem`'s receivers; refusals are reported through `warn`
  /// (default: a line on stderr). Throws io_error if it cannot.
  explicit handoff_server(shared_host mem, std::function<void(const std::string&)> warn = {});
  handoff_server(const handoff_server&) = delete;
  handoff_server& operator=(const handoff_server&) = delete;
  ~handoff_server();

  /// What a receiver needs (the socket's name and the token): for the
  /// load's communicator only, never for a log.
  [[nodiscard]] std::vector<std::byte> ticket() const;
  /// Hands the memory to `receivers` connections that prove the token,
  /// refusing any other. `alive` is called between waits (a peer's death
  /// throws from it); throws comm_error after `timeout`.
  void serve(std::size_t receivers, std::chrono::milliseconds timeout, const std::function<void()>& alive = {});
  /// Connections refused.
  [[nodiscard]] std::size_t refused() const noexcept { return refused_; }

 private:
  shared_host mem_;
  std::function<void(const std::string&)> warn_;
  std::string name_;
  std::optional<comm::load_secret> token_;
  int listen_ = -1;
  std::size_t refused_ = 0;
};

/// The most pieces one handoff carries (one message's descriptors).
inline constexpr std::size_t max_pieces = 64;

/// A receiver's side: connects to the server of `ticket`, checks it, and
/// maps the memory it hands over (`size` bytes, in the `pieces` the plan
/// says: shared_host::create's; empty: one). Throws io_error naming what
/// failed. The pieces' descriptors stay open in what it returns (for
/// shared_host::write) until its close_handle().
[[nodiscard]] shared_host receive_handoff(std::span<const std::byte> ticket, std::size_t size,
                                          std::span<const std::uint64_t> pieces, std::chrono::milliseconds timeout);

}  // namespace sluice::inline v0::memory
