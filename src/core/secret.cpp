// comm::load_secret (comm/secret.hpp): OpenSSL's CSPRNG and HMAC-SHA256.

#include <sluice/comm/secret.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include <sluice/comm/concepts.hpp>
#include <sluice/error.hpp>

namespace sluice::inline v0::comm {

namespace {
void random_bytes(std::span<std::byte> out) {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1)
    throw resource_error("the system's random generator (OpenSSL RAND_bytes) failed: no secret for the load");
}
}  // namespace

load_secret load_secret::draw() {
  load_secret s;
  random_bytes(s.key_);
  return s;
}

load_secret load_secret::from(std::span<const std::byte> bytes) {
  if (bytes.size() != size)
    throw comm_error(fmt::format("the load's secret in the store is {} bytes, not {}: the store was written by "
                                 "something other than this load's rank 0",
                                 bytes.size(), size));
  load_secret s;
  std::copy(bytes.begin(), bytes.end(), s.key_.begin());
  return s;
}

load_secret::nonce_t load_secret::nonce() {
  nonce_t n;
  random_bytes(n);
  return n;
}

load_secret::proof_t load_secret::prove(std::string_view label, std::uint64_t from, std::uint64_t to,
                                        const nonce_t& from_nonce, const nonce_t& to_nonce) const {
  // label, then fixed-size fields: no two (label, ...) tuples of one label share an encoding.
  std::vector<unsigned char> msg(label.begin(), label.end());
  msg.push_back(0);
  for (auto v : {from, to})
    for (int i = 0; i < 8; ++i) msg.push_back(static_cast<unsigned char>(v >> (8 * i)));
  for (const auto* n : {&from_nonce, &to_nonce})
    for (auto b : *n) msg.push_back(static_cast<unsigned char>(b));
  proof_t out;
  unsigned len = 0;
  if (!HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()), msg.data(), msg.size(),
            reinterpret_cast<unsigned char*>(out.data()), &len) ||
      len != out.size())
    throw resource_error("HMAC-SHA256 (OpenSSL) failed");
  return out;
}

bool load_secret::check(const proof_t& proof, std::string_view label, std::uint64_t from, std::uint64_t to,
                        const nonce_t& from_nonce, const nonce_t& to_nonce) const {
  const auto want = prove(label, from, to, from_nonce, to_nonce);
  return CRYPTO_memcmp(want.data(), proof.data(), want.size()) == 0;
}

load_secret::~load_secret() { OPENSSL_cleanse(key_.data(), key_.size()); }

}  // namespace sluice::inline v0::comm
