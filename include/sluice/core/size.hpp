#pragma once
// The one size grammar of every front end: sluice-load, sluice-launch, the
// benches, gen-checkpoint and the Python package (sluice.parse_size).

#include <sluice/error.hpp>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::inline v0 {

/// Bytes from a size such as "4GiB", "256MiB", "1.5GiB", "512k" or "1048576".
///
/// The units are GNU coreutils' (dd, numfmt): K, M, G, T and KiB, MiB, GiB,
/// TiB are powers of 1024; KB, MB, GB, TB are powers of 1000; B or no unit is
/// bytes. Case-insensitive ("4gib" = "4GiB"; "4g" = 4 GiB). A fraction is
/// allowed ("1.5GiB"), rounded down to a whole byte. Throws config_error naming
/// the text for anything else, including a result of zero bytes or one past 2^64.
inline std::uint64_t parse_size(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return config_error("size '" + std::string(text) + "': " + std::string(why) +
                        " (expected a number with an optional unit: B, K/KiB, M/MiB, G/GiB, T/TiB for "
                        "powers of 1024, KB, MB, GB, TB for powers of 1000)");
  };
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  std::size_t i = 0;
  std::uint64_t whole = 0;
  bool digits = false;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, digits = true) {
    const auto d = static_cast<std::uint64_t>(s[i] - '0');
    if (whole > (UINT64_MAX - d) / 10) throw bad("too large");
    whole = whole * 10 + d;
  }
  double frac = 0;
  if (i < s.size() && s[i] == '.') {
    double scale = 0.1;
    for (++i; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, scale /= 10, digits = true)
      frac += (s[i] - '0') * scale;
  }
  if (!digits) throw bad("no number");
  std::string unit(s.substr(i));
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::uint64_t mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = 1ull << 10;
  else if (unit == "m" || unit == "mib") mult = 1ull << 20;
  else if (unit == "g" || unit == "gib") mult = 1ull << 30;
  else if (unit == "t" || unit == "tib") mult = 1ull << 40;
  else if (unit == "kb") mult = 1000ull;
  else if (unit == "mb") mult = 1000ull * 1000;
  else if (unit == "gb") mult = 1000ull * 1000 * 1000;
  else if (unit == "tb") mult = 1000ull * 1000 * 1000 * 1000;
  else throw bad("unknown unit '" + std::string(s.substr(i)) + "'");
  if (whole > UINT64_MAX / mult) throw bad("too large");
  const auto n = whole * mult + static_cast<std::uint64_t>(std::floor(frac * static_cast<double>(mult)));
  if (n == 0) throw bad("must be at least one byte");
  return n;
}

}  // namespace sluice::inline v0
