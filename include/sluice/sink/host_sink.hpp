#pragma once
/// \file
/// A sink that places tensors in host memory: into destinations the caller
/// provides, or into buffers it allocates. Tensors of at least
/// `direct_min_bytes` are read straight into their destination (no staging
/// copy; O_DIRECT when the destination, offset and size are aligned).

#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>

#include <fmt/format.h>

#include <sluice/memory/lease.hpp>
#include <sluice/error.hpp>
#include <sluice/sink/concepts.hpp>

namespace sluice::inline v0 {

struct host_sink_options {
  bool allocate = true;                               ///< allocate tensors without a caller destination
  std::uint64_t direct_min_bytes = std::uint64_t{1} << 20;  ///< read straight into destinations this large
};

class host_sink {
 public:
  explicit host_sink(host_sink_options opt = {}) : opt_(opt) {}

  /// Places tensor `name` at `dst` (dst.size() must equal the tensor's size).
  void set_destination(const std::string& name, std::span<std::byte> dst) { caller_[name] = dst; }

  /// Where `t` goes (allocating it if allowed) when it is worth a direct read.
  std::span<std::byte> direct_destination(const tensor_ref& t) {
    if (t.size < opt_.direct_min_bytes) return {};
    return destination(t);
  }

  bool accept(tensor_view v) {
    require_host_view(v, "host_sink");
    if (!v.carries_data()) return true;
    if (v.kind == view_kind::bytes) {
      auto dst = destination(*v.tensor);
      if (!dst.data() && v.tensor->size) return false;  // neither given nor allocated: declined
      if (!v.bytes.empty()) std::memcpy(dst.data() + v.offset, v.bytes.data(), v.bytes.size());
    }
    bytes_ += v.bytes.size();
    return true;
  }

  /// The bytes of a placed tensor (empty span if unknown).
  [[nodiscard]] std::span<const std::byte> get(const std::string& name) const {
    if (auto it = caller_.find(name); it != caller_.end()) return it->second;
    if (auto it = owned_.find(name); it != owned_.end()) return it->second.bytes();
    return {};
  }
  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  std::span<std::byte> destination(const tensor_ref& t) {
    if (auto it = caller_.find(t.name); it != caller_.end()) {
      if (it->second.size() != t.size)
        throw config_error(fmt::format("destination holds {} bytes, the tensor {}", it->second.size(), t.size), {"", t.name});
      return it->second;
    }
    if (!opt_.allocate) return {};
    auto [it, fresh] = owned_.try_emplace(t.name);
    if (fresh) it->second = lease::allocate(t.size, t.size >= (1u << 20) ? 4096 : 64);
    return it->second.bytes();
  }

  host_sink_options opt_;
  std::map<std::string, std::span<std::byte>> caller_;
  std::map<std::string, lease> owned_;
  std::uint64_t bytes_ = 0;
};

static_assert(direct_sink<host_sink>);

}  // namespace sluice::inline v0
