// ASCII character classes for the object-store rooms (HTTP endpoints, S3's SigV4 and configuration): the
// <cctype> functions answer by the process's locale, where a Latin-1 locale
// calls 0xE9 a letter, so a signature or an encoded key would depend on how
// the embedding program set its locale. HTTP's and AWS's rules are ASCII's.
#pragma once

namespace sluice::inline v0::http::ascii {

[[nodiscard]] constexpr bool is_digit(unsigned char c) noexcept { return c >= '0' && c <= '9'; }
[[nodiscard]] constexpr bool is_lower(unsigned char c) noexcept { return c >= 'a' && c <= 'z'; }
[[nodiscard]] constexpr bool is_upper(unsigned char c) noexcept { return c >= 'A' && c <= 'Z'; }
[[nodiscard]] constexpr bool is_alnum(unsigned char c) noexcept { return is_digit(c) || is_lower(c) || is_upper(c); }
[[nodiscard]] constexpr char to_lower(char c) noexcept {
  return is_upper(static_cast<unsigned char>(c)) ? static_cast<char>(c - 'A' + 'a') : c;
}

}  // namespace sluice::inline v0::http::ascii
