#pragma once
/// \file
/// `comm::load_secret`: the secret of one distributed load, drawn by its rank 0
/// and carried to the others by the store they meet through, so that every
/// connection between ranks can prove it belongs to the load: Gloo's pairs
/// (a mutual proof before any byte of the load, comm::gloo), the peer watch's
/// connections, the node's memory handoff. A proof is an HMAC-SHA256 under the
/// secret over both sides' fresh nonces and who each side is, so a proof seen
/// on one connection proves nothing on another, and a side cannot answer with
/// the other's own proof.
///
/// The secret is never printed, logged or serialised beyond the store: the
/// type has no formatter and no string conversion; `bytes()` is for the store.
/// It is only as private as that store (docs/design.md, "Ranks trust only
/// their own").

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace sluice::inline v0::comm {

class load_secret {
 public:
  static constexpr std::size_t size = 32;
  using nonce_t = std::array<std::byte, 16>;
  using proof_t = std::array<std::byte, 32>;

  /// 32 bytes from OpenSSL's CSPRNG. Throws resource_error if it has none.
  [[nodiscard]] static load_secret draw();
  /// A secret the store carried; throws comm_error unless it is `size` bytes.
  [[nodiscard]] static load_secret from(std::span<const std::byte> bytes);
  /// A fresh nonce (OpenSSL's CSPRNG).
  [[nodiscard]] static nonce_t nonce();

  /// HMAC-SHA256 under the secret of `label`, the two ranks (or ids) and
  /// the two nonces, in that order.
  [[nodiscard]] proof_t prove(std::string_view label, std::uint64_t from, std::uint64_t to, const nonce_t& from_nonce,
                              const nonce_t& to_nonce) const;
  /// Whether `proof` is prove(label, from, to, from_nonce, to_nonce) (a
  /// constant-time comparison).
  [[nodiscard]] bool check(const proof_t& proof, std::string_view label, std::uint64_t from, std::uint64_t to,
                           const nonce_t& from_nonce, const nonce_t& to_nonce) const;

  /// The secret's bytes: for the store only.
  [[nodiscard]] std::span<const std::byte, size> bytes() const noexcept { return key_; }

  ~load_secret();  // wiped
  load_secret(const load_secret&) = default;
  load_secret& operator=(const load_secret&) = default;

 private:
  load_secret() = default;
  std::array<std::byte, size> key_{};
};

}  // namespace sluice::inline v0::comm
