#pragma once
/// \file
/// `comm::gloo`: host-memory collectives over Gloo's TCP transport (the
/// sluice::gloo component; Gloo's headers stay in src/gloo). Rendezvous
/// through a Gloo FileStore directory that every rank reaches (it must exist
/// and be empty for each run), or Gloo's RedisStore for several nodes (a
/// per-run key prefix; see comm/store.hpp). Every call and the rendezvous are
/// bounded by `timeout`: a dead or stalled peer gives comm_error, not a hang.
/// Once every rank has met (a barrier ends the constructor), each removes
/// the keys it set in the store, as it does after a failed rendezvous: a store
/// keeps nothing of a world, and its directory or prefix can serve the next.

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <sluice/comm/any_communicator.hpp>
#include <sluice/comm/concepts.hpp>
#include <sluice/comm/secret.hpp>
#include <sluice/comm/store.hpp>

namespace sluice::inline v0::comm {

/// Settings of a Gloo communicator.
struct gloo_options {
  store_address store;                        ///< a Redis store, or a FileStore directory (exists, empty per run)
  std::string hostname = "127.0.0.1";         ///< address this rank listens on
  std::chrono::milliseconds timeout{60000};   ///< rendezvous and every collective
  /// Where a refused connection is reported (a stranger on the peer watch's
  /// port); default: a line on stderr. Never given the load's secret.
  std::function<void(const std::string&)> warn;

  /// From rank_info: its rendezvous, listening address and timeout. Throws
  /// config_error for a world across nodes whose address is loopback
  /// (rank_info::check_reachable).
  [[nodiscard]] static gloo_options from(const rank_info& who) {
    who.check_reachable();
    return {who.rendezvous(), who.address(), who.timeout, {}};
  }
};

/// A Gloo full-mesh context among `size` ranks. Move-only.
///
/// Dead peers: beside Gloo's pairs each rank keeps one more TCP connection to
/// every peer and one thread watching them (met through the same store, its
/// keys removed with Gloo's). A peer whose process ends (killed, crashed)
/// makes the call in progress, or the next one, throw comm::peer_lost naming
/// it within moments, on every rank; a peer that hangs without dying
/// (stopped) is left to `timeout`: comm::comm_timeout, naming the ranks that
/// had not started the call. See docs/design.md, "Failure protocol".
///
/// SIGPIPE: Gloo writes to its peers with plain writev, so a dead peer would
/// kill this process with SIGPIPE instead of failing the collective. Each
/// communicator made sets SIGPIPE to ignored for the process while its
/// disposition is the default; a process's own handler is kept.
class gloo {
 public:
  /// Connects to the other ranks (blocks until all arrive or `timeout`).
  gloo(std::size_t rank, std::size_t size, const gloo_options& opt);
  /// From rank_info (RANK, WORLD_SIZE, SLUICE_STORE_DIR or SLUICE_STORE, SLUICE_GLOO_HOST, SLUICE_COMM_TIMEOUT_MS).
  explicit gloo(const rank_info& who);

  /// A communicator among `members` (global ranks, any order and spacing, e.g.
  /// {0, 2, 5}): a member gets one whose rank is its index in `members`; a rank
  /// outside gets nullopt and touches nothing (no store key, no socket). Every
  /// member must pass the same `members` and `name`; groups meet under their
  /// own name in the world's rendezvous, so several can coexist. Throws
  /// config_error for a duplicate or out-of-range member or an empty name.
  [[nodiscard]] static std::optional<gloo> group(const rank_info& who, std::span<const std::size_t> members,
                                                 std::string_view name);
  gloo(gloo&&) noexcept;
  gloo& operator=(gloo&&) noexcept;
  ~gloo();

  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  void broadcast(std::span<std::byte> buf, std::size_t root);
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out);
  void all_gather_v(std::span<std::byte> buf, std::span<const std::size_t> counts);
  /// Point-to-point over Gloo's unbound buffers (one per message; every
  /// receive is posted before any send, all are waited for with the timeout).
  void exchange(std::span<const send_message> sends, std::span<const recv_message> recvs);
  void barrier();

  /// The peer watch's word, for another communicator among the same ranks
  /// (nccl_options::liveness): throws comm::peer_lost once a peer is known
  /// dead, else does nothing; also after this communicator is gone. Cheap
  /// (a lock), callable from any thread.
  [[nodiscard]] std::function<void()> liveness() const;

 private:
  void prove_pairs(const load_secret& secret);
  struct impl;
  std::unique_ptr<impl> impl_;
  std::size_t rank_ = 0;
  std::size_t size_ = 1;
};

static_assert(communicator<gloo>);

}  // namespace sluice::inline v0::comm
