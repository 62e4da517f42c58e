#pragma once
// Scratch files of known bytes, and their pages in or out of the page cache:
// what the reading tests (file_source, slice_reader) start from.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include <catch2/catch.hpp>

namespace sluice_test {

/// `n` bytes of a fixed pattern (byte i: i * 131 + 7).
inline std::vector<std::byte> pattern(std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  return v;
}

inline void write_file(const std::filesystem::path& p, const std::vector<std::byte>& v) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size()));
}

/// Drops the file's pages from the page cache (clean pages only: written
/// back first; the whole file, as the kernel keeps a large folio when only
/// part of it is advised).
inline void drop_pages(const std::filesystem::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::fdatasync(fd) == 0);
  REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  ::close(fd);
}

/// Reads the whole file, so its pages are in the page cache.
inline void warm_pages(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> b(1 << 20);
  while (f.read(b.data(), static_cast<std::streamsize>(b.size())) || f.gcount() > 0) {
  }
}

/// Reads [offset, offset + length) of the file, so those pages are in the
/// page cache (readahead may bring in more after them).
inline void warm_range(const std::filesystem::path& p, std::uint64_t offset, std::uint64_t length) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM) == 0);  // no readahead past the range
  std::vector<char> b(1 << 20);
  for (std::uint64_t at = offset; at < offset + length;) {
    const auto n = ::pread(fd, b.data(), std::min<std::uint64_t>(b.size(), offset + length - at), static_cast<off_t>(at));
    REQUIRE(n > 0);
    at += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
}

}  // namespace sluice_test
