#pragma once
/// \file
/// A sink that computes the SHA-256 of every tensor's bytes (pieces are hashed
/// in order as they arrive), for `sluice-load --digest` and tests.

#include <openssl/evp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sluice/error.hpp>
#include <sluice/sink/concepts.hpp>

namespace sluice::inline v0 {

/// One tensor's digest.
struct tensor_digest {
  std::string name;
  format::dtype type = format::dtype::U8;
  std::vector<std::uint64_t> shape;  ///< of the part, for a TP part
  std::string sha256;  ///< lowercase hex
  tensor_part part;    ///< the TP part digested (count 1: the whole tensor)

  /// `name<TAB>dtype<TAB>[d0,d1,...]<TAB>sha256`, then `<TAB>part=K/N,dim=D` for a TP part.
  /// The name is escaped (sluice::printable: `\t`, `\n`, `\\`, `\xHH`), so a
  /// name holding a tab or a newline cannot forge a field or a line.
  [[nodiscard]] std::string line() const {
    auto l = fmt::format("{}\t{}\t[{}]\t{}", printable(name), format::name(type), fmt::join(shape, ","), sha256);
    if (part.count > 1) l += fmt::format("\tpart={}/{},dim={}", part.index, part.count, part.dim);
    if (part.groups > 1) l += fmt::format(",groups={}", part.groups);
    return l;
  }
};

class digest_sink {
 public:
  bool accept(tensor_view v) {
    require_host_view(v, "digest_sink");
    auto& ctx = open_[v.tensor];
    if (!ctx) {
      ctx.reset(EVP_MD_CTX_new());
      if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) throw resource_error("EVP_DigestInit_ex failed");
    }
    if (!v.bytes.empty() && EVP_DigestUpdate(ctx.get(), v.bytes.data(), v.bytes.size()) != 1)
      throw resource_error("EVP_DigestUpdate failed", {"", v.name()});
    bytes_ += v.bytes.size();
    if (v.last()) {
      unsigned char md[EVP_MAX_MD_SIZE];
      unsigned len = 0;
      EVP_DigestFinal_ex(ctx.get(), md, &len);
      std::string hex;
      for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
      done_[v.name()] = {v.name(), v.dtype(), v.part_shape(), std::move(hex), v.part};
      open_.erase(v.tensor);
    }
    return true;
  }
  /// Digests by tensor name (sorted).
  [[nodiscard]] const std::map<std::string, tensor_digest>& digests() const noexcept { return done_; }
  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  struct ctx_free {
    void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
  };
  std::map<const tensor_ref*, std::unique_ptr<EVP_MD_CTX, ctx_free>> open_;
  std::map<std::string, tensor_digest> done_;
  std::uint64_t bytes_ = 0;
};

static_assert(sink<digest_sink>);

}  // namespace sluice::inline v0
