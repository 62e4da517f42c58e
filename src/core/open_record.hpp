// The record of a collective open (collective_open.cpp): what rank 0's
// catalog answered while it opened a checkpoint, as it travels to the other
// ranks. Encoding and decoding only, private to the compiled core, and free
// of Asio, so that the fuzz target over decode() builds without it.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sluice::inline v0::detail::open_record {

// What a catalog was asked while a checkpoint was opened. A call is keyed by
// what was asked, so a replay answers exactly the same question with exactly
// the same answer (a short read stays short).
enum class op : std::uint8_t { list, exists, size, etag, read, read_prefix };

struct call_key {
  op what = op::list;
  std::string name;
  std::uint64_t offset = 0, length = 0;
  auto operator<=>(const call_key&) const = default;
};

struct answer {
  bool failed = false;       // the storage threw (message: its what())
  std::string message;
  nlohmann::json value;      // the answer: the catalog's value as JSON (bytes: a CBOR byte string)
};

// The opened files' sizes and version tags, for catalog::adopt.
struct file_facts {
  std::string name;
  std::uint64_t size = 0;
  std::optional<std::string> etag;
};

/// Everything a record says.
struct record {
  std::optional<std::string> failure;   ///< rank 0's error, if it failed
  std::string at;                       ///< where rank 0 opened
  std::map<call_key, answer> calls;
  std::vector<file_facts> shards;
};

/// Deepest nesting a record has (map, calls, call, answer list: 4).
inline constexpr std::uint32_t max_depth = 8;

[[nodiscard]] std::vector<std::byte> encode(const record& r);

/// Decodes a record that came over the communicator from rank `leader`.
/// A record that ends early, has trailing bytes, nests deeper than
/// max_depth or holds a field of the wrong type is a comm_error naming
/// `leader` (it must have been damaged on the way).
[[nodiscard]] record decode(std::span<const std::byte> bytes, std::size_t leader);

// Conversions between the catalog's values and the record's JSON.
[[nodiscard]] nlohmann::json bytes_json(const std::vector<std::byte>& b);
[[nodiscard]] std::vector<std::byte> json_bytes(const nlohmann::json& j);
[[nodiscard]] nlohmann::json etag_json(const std::optional<std::string>& e);
[[nodiscard]] std::optional<std::string> json_etag(const nlohmann::json& j);

}  // namespace sluice::inline v0::detail::open_record
