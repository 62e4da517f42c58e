#pragma once
/// \file
/// A streaming safetensors writer: tensors are declared first, then their
/// bytes are produced chunk by chunk, so files of any size are written with a
/// bounded buffer.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <sluice/error.hpp>
#include <sluice/format/dtype.hpp>

namespace sluice::inline v0::format {

/// Fills `chunk` with the tensor's bytes starting at `offset` within the tensor.
using fill_function = std::function<void(std::uint64_t offset, std::span<std::byte> chunk)>;

class writer {
 public:
  /// `alignment`: the data section starts at a multiple of it (the header is
  /// right-padded with spaces). 8 by default, as the reference writes.
  explicit writer(std::uint64_t alignment = 8) : alignment_(alignment ? alignment : 1) {}

  /// Declares a tensor whose bytes `fill` produces. Tensors are laid out in the
  /// order they are added. Throws config_error for a duplicate name or a size
  /// that is not a whole number of bytes.
  writer& add(std::string name, dtype type, std::vector<std::uint64_t> shape, fill_function fill) {
    if (names_.contains(name)) throw config_error(fmt::format("writer: tensor '{}' added twice", name));
    if (name == "__metadata__") throw config_error("writer: '__metadata__' is not a tensor name");
    std::uint64_t count = 1;
    std::uint64_t nbits = 0;
    for (auto d : shape)
      if (__builtin_mul_overflow(count, d, &count))
        throw config_error(fmt::format("writer: tensor '{}' has more than 2^64 elements", name));
    if (__builtin_mul_overflow(count, std::uint64_t{bits(type)}, &nbits) || offset_ + nbits / 8 < offset_)
      throw config_error(fmt::format("writer: tensor '{}' overflows 64-bit offsets", name));
    if (nbits % 8) throw config_error(fmt::format("writer: tensor '{}' is not a whole number of bytes", name));
    names_.emplace(name);
    entries_.push_back({std::move(name), type, std::move(shape), offset_, offset_ + nbits / 8, std::move(fill)});
    offset_ += nbits / 8;
    return *this;
  }

  /// Declares a tensor with the given bytes (copied).
  writer& add(std::string name, dtype type, std::vector<std::uint64_t> shape, std::span<const std::byte> bytes) {
    auto data = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
    add(std::move(name), type, std::move(shape), [data](std::uint64_t off, std::span<std::byte> out) {
      std::memcpy(out.data(), data->data() + off, out.size());
    });
    return *this;
  }

  writer& metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
    return *this;
  }

  /// Tensor bytes declared so far.
  [[nodiscard]] std::uint64_t data_size() const noexcept { return offset_; }

  /// The header JSON, padded so that the data section is aligned.
  [[nodiscard]] std::string header_json() const;

  /// Writes the file (replacing it). `chunk` bounds the buffer used for data.
  /// Throws io_error on failure.
  void write(const std::filesystem::path& path, std::size_t chunk = 8u << 20) const;

 private:
  static void write_all(int fd, std::span<const std::byte> data, const std::filesystem::path& path);
  struct entry {
    std::string name;
    dtype type;
    std::vector<std::uint64_t> shape;
    std::uint64_t begin, end;
    fill_function fill;
  };
  std::uint64_t alignment_;
  std::uint64_t offset_ = 0;
  std::vector<entry> entries_;
  std::set<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace sluice::inline v0::format
