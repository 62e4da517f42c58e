#pragma once
/// \file
/// `testing::emulated_device_lane`: a `device_lane` in host memory over any
/// host communicator, so that the device path of a distributed load (upload,
/// exchange between lane buffers, `view_kind::device` delivery) runs and is
/// tested where there is no GPU. It behaves like the NCCL lane where it
/// matters for correctness: lane memory is separate from the host buffers the
/// reads land in (and poisoned when handed out, so a byte neither uploaded nor
/// received shows up as a wrong digest), and uploads are deferred to the
/// next `exchange`, as copies enqueued on a stream are (so a host buffer
/// changed after `upload` and before `exchange` shows up too). The views it
/// yields are host memory: a test sink may read them; a real device lane's
/// must not be read on the host.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <sluice/comm/concepts.hpp>
#include <sluice/core/lease.hpp>
#include <sluice/error.hpp>
#include <sluice/stages/broadcast.hpp>

namespace sluice::inline v0::testing {

template <comm::communicator Comm>
class emulated_device_lane {
 public:
  /// The byte lane memory is filled with when handed out.
  static constexpr std::byte poison{0xa5};

  explicit emulated_device_lane(Comm& c) : c_(&c) {}

  lease host_buffer(unsigned slot, std::size_t n) { return host_.at(slot).get(n); }
  lease device_buffer(unsigned slot, std::size_t n) {
    auto l = device_.at(slot).get(n);
    if (n) std::memset(l.bytes().data(), static_cast<int>(poison), n);
    return l;
  }
  void upload(std::span<std::byte> dst, std::span<const std::byte> src) {
    if (dst.size() != src.size()) throw config_error(fmt::format("emulated lane upload: {} bytes into {}", src.size(), dst.size()));
    if (!src.empty()) pending_.emplace_back(dst, src);
  }
  void exchange(std::span<const comm::send_message> sends, std::span<const comm::recv_message> recvs) {
    for (const auto& [dst, src] : pending_) std::memcpy(dst.data(), src.data(), src.size()), uploaded_ += src.size();
    uploads_ += pending_.size();
    pending_.clear();
    c_->exchange(sends, recvs);
    exchanges_ += 1;
  }

  [[nodiscard]] std::uint64_t uploads() const noexcept { return uploads_; }
  [[nodiscard]] std::uint64_t uploaded_bytes() const noexcept { return uploaded_; }
  [[nodiscard]] std::uint64_t exchanges() const noexcept { return exchanges_; }

 private:
  Comm* c_;
  std::array<detail::window_buffer, 4> host_, device_;
  std::vector<std::pair<std::span<std::byte>, std::span<const std::byte>>> pending_;
  std::uint64_t uploads_ = 0, uploaded_ = 0, exchanges_ = 0;
};

}  // namespace sluice::inline v0::testing
