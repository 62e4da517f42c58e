#pragma once
/// \file
/// safetensors element types, with their sizes in bits.

#include <cstdint>
#include <optional>
#include <iterator>
#include <string_view>

namespace sluice::inline v0::format {

/// Every dtype the safetensors reference lists.
enum class dtype : std::uint8_t {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
};

namespace detail {
struct dtype_entry {
  dtype type;
  std::string_view name;
  std::uint32_t bits;
};
inline constexpr dtype_entry dtype_table[] = {
    {dtype::BOOL, "BOOL", 8},        {dtype::F4, "F4", 4},
    {dtype::F6_E2M3, "F6_E2M3", 6},  {dtype::F6_E3M2, "F6_E3M2", 6},
    {dtype::U8, "U8", 8},            {dtype::I8, "I8", 8},
    {dtype::F8_E5M2, "F8_E5M2", 8},  {dtype::F8_E4M3, "F8_E4M3", 8},
    {dtype::F8_E8M0, "F8_E8M0", 8},  {dtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {dtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {dtype::I16, "I16", 16},         {dtype::U16, "U16", 16},
    {dtype::F16, "F16", 16},         {dtype::BF16, "BF16", 16},
    {dtype::I32, "I32", 32},         {dtype::U32, "U32", 32},
    {dtype::F32, "F32", 32},         {dtype::C64, "C64", 64},
    {dtype::F64, "F64", 64},         {dtype::I64, "I64", 64},
    {dtype::U64, "U64", 64},
};
}  // namespace detail

/// Number of dtypes (for per-dtype tables).
inline constexpr std::size_t dtype_count = std::size(detail::dtype_table);

/// The dtype's name as written in a safetensors header, e.g. "BF16".
[[nodiscard]] constexpr std::string_view name(dtype t) noexcept {
  return detail::dtype_table[static_cast<std::size_t>(t)].name;
}

/// Size of one element in bits (4 for F4, 6 for F6_*, 8 for BOOL).
[[nodiscard]] constexpr std::uint32_t bits(dtype t) noexcept {
  return detail::dtype_table[static_cast<std::size_t>(t)].bits;
}

/// Parses a header's dtype string; nullopt for an unknown one.
[[nodiscard]] constexpr std::optional<dtype> parse_dtype(std::string_view s) noexcept {
  for (const auto& e : detail::dtype_table)
    if (e.name == s) return e.type;
  return std::nullopt;
}

}  // namespace sluice::inline v0::format
