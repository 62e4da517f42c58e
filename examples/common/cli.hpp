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

#include <sluice/core/size.hpp>
#include <sluice/error.hpp>

namespace sluice_cli {

/// "64MiB", "4GiB", "1G", "1.5GB": the library's one size grammar (sluice/core/size.hpp).
/// Throws sluice::config_error.
inline std::uint64_t parse_size(std::string_view s) { return sluice::parse_size(s); }

/// The value of an auto|on|off option as `Mode`, an enum with the members
/// automatic, on and off (distributed_options::overlap_mode, populate_mode).
/// Throws sluice::config_error naming the option for any other value.
template <class Mode>
Mode auto_on_off(std::string_view option, std::string_view value) {
  if (value == "auto") return Mode::automatic;
  if (value == "on") return Mode::on;
  if (value == "off") return Mode::off;
  throw sluice::config_error(fmt::format("{} '{}': expected auto, on or off", option, value));
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
