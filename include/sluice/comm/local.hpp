#pragma once
/// \file
/// `comm::local`: the communicator of a one-process world (every collective
/// is a copy or nothing). Lets the distributed driver run without a transport.

#include <cstring>
#include <span>

#include <sluice/comm/concepts.hpp>

namespace sluice::inline v0::comm {

/// A world of one rank.
class local {
 public:
  /// Its world is one rank, whatever the run (comm::static_size_v).
  static constexpr std::size_t static_size = 1;
  [[nodiscard]] std::size_t rank() const noexcept { return 0; }
  [[nodiscard]] std::size_t size() const noexcept { return 1; }
  void broadcast(std::span<std::byte>, std::size_t root) const {
    if (root != 0) throw comm_error("local communicator: broadcast root must be 0");
  }
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) const {
    if (out.size() != in.size()) throw comm_error("local communicator: all_gather output must equal the input size");
    if (!in.empty() && in.data() != out.data()) std::memmove(out.data(), in.data(), in.size());
  }
  void all_gather_v(std::span<std::byte>, std::span<const std::size_t>) const noexcept {}
  void exchange(std::span<const send_message> sends, std::span<const recv_message> recvs) const {
    if (!sends.empty() || !recvs.empty()) throw comm_error("local communicator: no peer to exchange messages with");
  }
  void barrier() const noexcept {}
};

static_assert(communicator<local>);

}  // namespace sluice::inline v0::comm
