#pragma once
// Pages of a range this process has mapped in: page table entries present,
// from /proc/self/pagemap (bit 63, readable without privileges). What a view
// of the page cache holds before anyone touches it tells whether its pages
// were mapped in ahead (file_source::map) or are left to its consumer.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include <catch2/catch.hpp>

namespace sluice_test {

inline std::size_t present_pages(std::span<const std::byte> b) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY);
  REQUIRE(fd >= 0);
  const auto first = reinterpret_cast<std::uintptr_t>(b.data()) / 4096,
             last = (reinterpret_cast<std::uintptr_t>(b.data()) + b.size() - 1) / 4096;
  std::size_t n = 0;
  for (auto p = first; p <= last; ++p) {
    std::uint64_t e = 0;
    REQUIRE(::pread(fd, &e, 8, static_cast<off_t>(p * 8)) == 8);
    n += (e >> 63) & 1;
  }
  ::close(fd);
  return n;
}

/// Pages [b.data(), b.data() + b.size()) spans.
inline std::size_t spanned_pages(std::span<const std::byte> b) {
  const auto at = reinterpret_cast<std::uintptr_t>(b.data());
  return (at + b.size() + 4095) / 4096 - at / 4096;
}

}  // namespace sluice_test
