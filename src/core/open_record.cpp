// The collective open's record (open_record.hpp): CBOR (nlohmann::json's), a
// map with a format tag, rank 0's failure, where it opened, the calls
// [op, name, offset, length, failed, message, answer] and the facts of every
// opened shard [name, size, etag or null].

#include "open_record.hpp"

#include <algorithm>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include <sluice/error.hpp>

#include "bounded_json.hpp"

namespace sluice::inline v0::detail::open_record {

namespace {

constexpr std::string_view record_format = "sluice-open/2";

// A record's number or array, or invalid_argument.
std::uint64_t u64(const nlohmann::json& j) {
  if (!j.is_number_unsigned()) throw std::invalid_argument(fmt::format("a {} where a count or offset belongs", j.type_name()));
  return j.get<std::uint64_t>();
}
const nlohmann::json& array(const nlohmann::json& j) {
  if (!j.is_array()) throw std::invalid_argument(fmt::format("a {} where a list belongs", j.type_name()));
  return j;
}

// Checks, when the record is read, that an answer has its call's type, so
// that the replay's conversions cannot fail halfway through an open.
void check_answer(op what, const nlohmann::json& v) {
  bool ok = false;
  switch (what) {
    case op::list:
      ok = v.is_array() && std::all_of(v.begin(), v.end(), [](const nlohmann::json& n) { return n.is_string(); });
      break;
    case op::exists: ok = v.is_boolean(); break;
    case op::size: ok = v.is_number_unsigned(); break;
    case op::etag: ok = v.is_null() || v.is_string(); break;
    case op::read:
    case op::read_prefix: ok = v.is_binary(); break;
  }
  if (!ok) throw std::invalid_argument(fmt::format("the answer to call {} is a {}", static_cast<int>(what), v.type_name()));
}

[[noreturn]] void damaged(std::size_t leader, std::string_view why) {
  throw comm::comm_error(fmt::format("rank {}'s checkpoint opening record is damaged: {}", leader, why));
}

}  // namespace

nlohmann::json bytes_json(const std::vector<std::byte>& b) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(b.data());
  return nlohmann::json::binary(std::vector<std::uint8_t>(p, p + b.size()));
}
std::vector<std::byte> json_bytes(const nlohmann::json& j) {
  const auto& b = j.get_binary();  // throws type_error unless binary
  const auto* p = reinterpret_cast<const std::byte*>(b.data());
  return {p, p + b.size()};
}
nlohmann::json etag_json(const std::optional<std::string>& e) { return e ? nlohmann::json(*e) : nlohmann::json(); }
std::optional<std::string> json_etag(const nlohmann::json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<std::string>();
}

std::vector<std::byte> encode(const record& r) {
  nlohmann::json calls = nlohmann::json::array();
  for (const auto& [k, a] : r.calls)
    calls.push_back({static_cast<std::uint8_t>(k.what), k.name, k.offset, k.length, a.failed, a.message, a.value});
  nlohmann::json shards = nlohmann::json::array();
  for (const auto& f : r.shards) shards.push_back({f.name, f.size, etag_json(f.etag)});
  const nlohmann::json j = {{"format", std::string(record_format)},
                            {"failure", r.failure ? nlohmann::json(*r.failure) : nlohmann::json()},
                            {"at", r.at},
                            {"calls", std::move(calls)},
                            {"shards", std::move(shards)}};
  const auto cbor = nlohmann::json::to_cbor(j);
  const auto* p = reinterpret_cast<const std::byte*>(cbor.data());
  return {p, p + cbor.size()};
}

record decode(std::span<const std::byte> bytes, std::size_t leader) {
  record out;
  // Strict and bounded: a record that ends early, has trailing bytes or nests
  // deeper than a record can is damaged (nlohmann's CBOR reader recurses per
  // level: the bound stops it before the stack does).
  const auto parsed = detail::parse_bounded(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                                            max_depth, {}, true);
  if (parsed.too_deep) damaged(leader, fmt::format("nested more than {} levels deep", max_depth));
  if (parsed.syntax_error) damaged(leader, printable(*parsed.syntax_error, 512));
  const auto& j = parsed.value;
  try {
    if (!j.is_object() || !j.contains("format") || !j.at("format").is_string() ||
        j.at("format").get<std::string>() != record_format)
      throw comm::comm_error(fmt::format("rank {} sent no checkpoint opening record", leader));
    if (const auto& f = j.at("failure"); !f.is_null()) out.failure = f.get<std::string>();
    out.at = j.at("at").get<std::string>();
    for (const auto& c : array(j.at("calls"))) {
      if (!c.is_array() || c.size() != 7) throw std::invalid_argument("a call is not [op, name, offset, length, failed, message, answer]");
      call_key k;
      const auto what = u64(c[0]);
      if (what > static_cast<std::uint8_t>(op::read_prefix)) throw std::invalid_argument(fmt::format("unknown call {}", what));
      k.what = static_cast<op>(what);
      k.name = c[1].get<std::string>();
      k.offset = u64(c[2]);
      k.length = u64(c[3]);
      answer a{c[4].get<bool>(), c[5].get<std::string>(), c[6]};
      if (!a.failed) check_answer(k.what, a.value);
      out.calls.insert_or_assign(std::move(k), std::move(a));
    }
    for (const auto& f : array(j.at("shards"))) {
      if (!f.is_array() || f.size() != 3) throw std::invalid_argument("a shard is not [name, size, etag]");
      out.shards.push_back({f[0].get<std::string>(), u64(f[1]), json_etag(f[2])});
    }
  } catch (const nlohmann::json::exception& e) {
    damaged(leader, e.what());
  } catch (const std::invalid_argument& e) {
    damaged(leader, e.what());
  }
  return out;
}

}  // namespace sluice::inline v0::detail::open_record
