#pragma once
// Small helpers shared by the example tools: size parsing, byte formatting,
// peak RSS, the one-line error convention.

#include <sys/resource.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace sluice_cli {

/// "64MiB", "4GiB", "1G", "512k", "1048576" → bytes. Throws std::invalid_argument.
inline std::uint64_t parse_size(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0) throw std::invalid_argument(fmt::format("'{}' is not a size", s));
  std::uint64_t n = std::stoull(std::string(s.substr(0, i)));
  std::string unit(s.substr(i));
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (unit.ends_with("ib")) unit.resize(unit.size() - 2);
  else if (unit.ends_with("b")) unit.resize(unit.size() - 1);
  int shift = 0;
  if (unit.empty()) shift = 0;
  else if (unit == "k") shift = 10;
  else if (unit == "m") shift = 20;
  else if (unit == "g") shift = 30;
  else if (unit == "t") shift = 40;
  else throw std::invalid_argument(fmt::format("'{}' has an unknown size unit", s));
  return n << shift;
}

inline std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.{}f} {}", b, u ? 2 : 0, units[u]);
}

/// Peak resident set size of this process, bytes.
inline std::uint64_t peak_rss() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
}

/// CPU time (user + system) of this process, seconds.
inline double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/// The error convention of every sluice tool: one line on stderr.
inline int fail(std::string_view what) {
  std::fprintf(stderr, "sluice: error: %.*s\n", static_cast<int>(what.size()), what.data());
  return 1;
}

}  // namespace sluice_cli
