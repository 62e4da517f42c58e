#pragma once
/// \file
/// `memory::node_window`: the memory a node's ranks share bytes through
/// where the page cache cannot carry them (S3, O_DIRECT reads, a caller's
/// source: policy::node_copy::window). One sealed memfd (memory::shared_host,
/// made by local rank 0 and attached by the others, as the shared segment)
/// holding `parities` parities of `parity_bytes` each: window w lands in
/// parity w % parities (its readers read into it, its relays receive into
/// it), and every local rank that keeps those bytes copies them out after the
/// window's status exchange. A parity is written again only `parities`
/// windows later, after every local rank copied from it: two parities where
/// windows run one at a time, three where they overlap (the parity_gate of
/// distributed/window.hpp keeps the order).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include <sluice/memory/shared_host.hpp>

namespace sluice::inline v0::memory {

class node_window {
 public:
  node_window() = default;
  /// Over `mem` (parities * parity_bytes long, mapped by every local rank).
  node_window(shared_host mem, std::size_t parity_bytes, std::uint32_t parities = 2)
      : mem_(std::move(mem)), parity_(parity_bytes), parities_(parities ? parities : 1) {}

  /// Window `w`'s parity (empty without a node window).
  [[nodiscard]] std::span<std::byte> parity(std::uint32_t w) const noexcept {
    return parity_ ? mem_.bytes().subspan(static_cast<std::size_t>(w % parities_) * parity_, parity_) : std::span<std::byte>{};
  }
  [[nodiscard]] std::size_t parity_bytes() const noexcept { return parity_; }
  /// Every parity (what a device lane pins once per load).
  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return mem_.bytes(); }
  /// Keeps the mapping alive (shared_host::keep).
  [[nodiscard]] std::shared_ptr<void> keep() const { return mem_.keep(); }
  [[nodiscard]] std::size_t size() const noexcept { return std::size_t{parities_} * parity_; }
  [[nodiscard]] explicit operator bool() const noexcept { return parity_ != 0; }

 private:
  shared_host mem_;
  std::size_t parity_ = 0;
  std::uint32_t parities_ = 2;
};

}  // namespace sluice::inline v0::memory
