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

#include <sluice/format/index.hpp>
#include <sluice/format/limits.hpp>
#include <sluice/format/safetensors.hpp>

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
  std::vector<std::byte> parsed;        ///< encode_parsed's bytes, or none
};

/// What rank 0 parsed while it opened (after a successful open only): every
/// opened shard's header and the index it read through its catalog, with the
/// limits it parsed them within. Another rank whose limits are the same takes
/// them instead of parsing the same JSON again (collective_open.cpp), and
/// checks them by the rules the parse enforces (format::check_header,
/// format::check_index); the header and index bytes then stay out of the
/// record.
struct parsed {
  format::limits limits;
  std::vector<std::pair<std::string, format::header>> headers;  ///< by shard name
  std::optional<format::index> index;
};

/// The parses in a flat binary form: lengths and integers, no DOM to build
/// on the way in. nlohmann's CBOR reader makes a node per value, which for a
/// 91,000-tensor checkpoint costs about what parsing its JSON again does.
[[nodiscard]] std::vector<std::byte> encode_parsed(const format::limits& limits,
                                                   const std::vector<std::pair<std::string, const format::header*>>& headers,
                                                   const format::index* index);
/// Decodes encode_parsed's bytes as they came from rank `leader`: a blob that
/// ends early, has trailing bytes, names an unknown dtype or lists an index
/// entry out of order is a comm_error naming `leader`. Only the encoding is
/// checked here; the format's rules are the caller's (see parsed).
[[nodiscard]] parsed decode_parsed(std::span<const std::byte> bytes, std::size_t leader);

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

namespace sluice::inline v0::detail {

/// The parses one collective open shares (checkpoint.cpp reads and fills
/// it). Recording, rank 0's open leaves its index here for the record (its
/// headers stay in the checkpoint). Replaying, a rank finds rank 0's headers
/// and index here and takes them, checked by the format's rules, instead of
/// parsing the same JSON again; what it does not find it parses itself.
struct parse_memo {
  bool replaying = false;
  std::size_t leader = 0;
  std::map<std::string, format::header> headers;  ///< replaying: by shard name
  std::optional<format::index> index;
};

}  // namespace sluice::inline v0::detail
