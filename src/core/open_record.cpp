// The collective open's record (open_record.hpp): the length of its CBOR part
// (8 bytes, little-endian), the CBOR part, then rank 0's parses in
// encode_parsed's form (none after a failed open). The CBOR (nlohmann::json's)
// is a map with a format tag, rank 0's failure, where it opened, the calls
// [op, name, offset, length, failed, message, answer], the facts of every
// opened shard [name, size, etag or null] and the parses' length, so that a
// record cut where its parses begin is damaged too. The parses stay outside the CBOR:
// nlohmann reads a byte string a byte at a time, about 120 ms for the 17 MB
// of a 91,000-tensor checkpoint's parses, against a copy.

#include "open_record.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include <sluice/error.hpp>

#include "bounded_json.hpp"

namespace sluice::inline v0::detail::open_record {

namespace {

constexpr std::string_view record_format = "sluice-open/3";

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

// encode_parsed's form: little-endian u64s, u8s and strings as a u64 length
// and their bytes.
class flat_writer {
 public:
  void reserve(std::size_t n) { out_.reserve(n); }
  void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u64(std::uint64_t v) {
    std::array<std::byte, 8> le{};
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(le.data(), &v, 8);
    } else {
      for (std::size_t i = 0; i < 8; ++i) le[i] = static_cast<std::byte>(v >> (8 * i));
    }
    out_.insert(out_.end(), le.begin(), le.end());
  }
  void str(std::string_view s) {
    u64(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

// Reads flat_writer's form; running past the end is invalid_argument.
class flat_reader {
 public:
  explicit flat_reader(std::span<const std::byte> b) : b_(b) {}
  std::uint8_t u8() {
    need(1);
    return static_cast<std::uint8_t>(b_[at_++]);
  }
  std::uint64_t u64() {
    need(8);
    std::uint64_t v = 0;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(&v, b_.data() + at_, 8);
    } else {
      for (std::size_t i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(b_[at_ + i]) << (8 * i);
    }
    at_ += 8;
    return v;
  }
  std::string str() {
    const auto n = u64();
    need(n);
    std::string s(reinterpret_cast<const char*>(b_.data()) + at_, n);
    at_ += n;
    return s;
  }
  // A count of entries each at least `least` bytes long: no more than the
  // bytes left can hold, so a forged count cannot make a huge allocation.
  std::uint64_t count(std::uint64_t least) {
    const auto n = u64();
    if (n > (b_.size() - at_) / least) throw std::invalid_argument(fmt::format("a count of {} with {} bytes left", n, b_.size() - at_));
    return n;
  }
  [[nodiscard]] bool done() const noexcept { return at_ == b_.size(); }

 private:
  void need(std::uint64_t n) const {
    if (n > b_.size() - at_) throw std::invalid_argument(fmt::format("it ends {} bytes early", n - (b_.size() - at_)));
  }
  std::span<const std::byte> b_;
  std::size_t at_ = 0;
};

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
                            {"shards", std::move(shards)},
                            {"parsed", r.parsed.size()}};
  const auto cbor = nlohmann::json::to_cbor(j);
  flat_writer w;
  w.u64(cbor.size());
  auto out = w.take();
  out.reserve(8 + cbor.size() + r.parsed.size());
  const auto* p = reinterpret_cast<const std::byte*>(cbor.data());
  out.insert(out.end(), p, p + cbor.size());
  out.insert(out.end(), r.parsed.begin(), r.parsed.end());
  return out;
}

record decode(std::span<const std::byte> framed, std::size_t leader) {
  record out;
  std::uint64_t cbor_size = 0;
  try {
    cbor_size = flat_reader(framed).u64();
  } catch (const std::invalid_argument& e) {
    damaged(leader, fmt::format("no length of its CBOR part: {}", e.what()));
  }
  if (cbor_size > framed.size() - 8)
    damaged(leader, fmt::format("its CBOR part of {} bytes runs past its {} bytes", cbor_size, framed.size()));
  const auto bytes = framed.subspan(8, cbor_size);
  const auto rest = framed.subspan(8 + cbor_size);
  out.parsed.assign(rest.begin(), rest.end());
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
    if (const auto n = u64(j.at("parsed")); n != out.parsed.size())
      throw std::invalid_argument(fmt::format("it holds {} bytes of parses, not the {} it says", out.parsed.size(), n));
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

namespace {

// Counts what flat_writer would write: the parses' exact length, from what
// is in memory (never from a field such as json_size, which a forged parse
// sets at will), so that the writer reserves once.
struct flat_counter {
  std::size_t n = 0;
  void u8(std::uint8_t) { n += 1; }
  void u64(std::uint64_t) { n += 8; }
  void str(std::string_view s) { n += 8 + s.size(); }
};

// limits, the headers [shard name, json size, file size, metadata [key,
// value]..., tensors [name, dtype, rank, dims..., begin, end]...], then 0 or
// 1 and the index [file, total size (0 or 1 and the value), weight_map
// [tensor, shard]... in name order, shard records [name, size?, etag?]...].
template <class Writer>
void write_parsed(Writer& w, const format::limits& limits,
                  const std::vector<std::pair<std::string, const format::header*>>& headers, const format::index* index) {
  for (auto v : {limits.max_header_bytes, limits.max_index_bytes, limits.max_tensors, std::uint64_t{limits.max_depth},
                 std::uint64_t{limits.max_name_bytes}})
    w.u64(v);
  w.u64(headers.size());
  for (const auto& [name, h] : headers) {
    w.str(name);
    w.u64(h->json_size);
    w.u64(h->file_size);
    w.u64(h->metadata.size());
    for (const auto& [k, v] : h->metadata) {
      w.str(k);
      w.str(v);
    }
    w.u64(h->tensors.size());
    for (const auto& t : h->tensors) {
      w.str(t.name);
      w.u8(static_cast<std::uint8_t>(t.type));
      w.u64(t.shape.size());
      for (auto d : t.shape) w.u64(d);
      w.u64(t.begin);
      w.u64(t.end);
    }
  }
  w.u8(index ? 1 : 0);
  if (index) {
    w.str(index->file);
    w.u8(index->total_size ? 1 : 0);
    if (index->total_size) w.u64(*index->total_size);
    w.u64(index->weight_map.size());
    for (const auto& [tensor, shard] : index->weight_map) {
      w.str(tensor);
      w.str(shard);
    }
    w.u64(index->shard_records.size());
    for (const auto& [name, rec] : index->shard_records) {
      w.str(name);
      w.u8(rec.size ? 1 : 0);
      if (rec.size) w.u64(*rec.size);
      w.u8(rec.etag ? 1 : 0);
      if (rec.etag) w.str(*rec.etag);
    }
  }
}

}  // namespace

std::vector<std::byte> encode_parsed(const format::limits& limits,
                                     const std::vector<std::pair<std::string, const format::header*>>& headers,
                                     const format::index* index) {
  flat_counter count;
  write_parsed(count, limits, headers, index);
  flat_writer w;
  w.reserve(count.n);
  write_parsed(w, limits, headers, index);
  return w.take();
}

parsed decode_parsed(std::span<const std::byte> bytes, std::size_t leader) {
  parsed out;
  try {
    flat_reader r(bytes);
    auto& l = out.limits;
    l.max_header_bytes = r.u64();
    l.max_index_bytes = r.u64();
    l.max_tensors = r.u64();
    const auto depth = r.u64(), name_bytes = r.u64();
    if (depth > std::numeric_limits<std::uint32_t>::max() || name_bytes > std::numeric_limits<std::uint32_t>::max())
      throw std::invalid_argument("a limit past 32 bits");
    l.max_depth = static_cast<std::uint32_t>(depth);
    l.max_name_bytes = static_cast<std::uint32_t>(name_bytes);
    const auto flag = [&] {
      const auto f = r.u8();
      if (f > 1) throw std::invalid_argument(fmt::format("a flag of {}", f));
      return f == 1;
    };
    // The least bytes an entry takes: a header 8 (name) + 8 + 8 + 8 + 8, a
    // metadata pair 16, a tensor 8 + 1 + 8 + 8 + 8, a dimension 8, an index
    // entry 16, a shard record 8 + 1 + 1.
    const auto shards = r.count(40);
    out.headers.reserve(shards);
    for (std::uint64_t i = 0; i < shards; ++i) {
      auto name = r.str();
      format::header h;
      h.json_size = r.u64();
      h.file_size = r.u64();
      for (auto m = r.count(16); m > 0; --m) {
        auto k = r.str();
        h.metadata.insert_or_assign(std::move(k), r.str());
      }
      const auto n = r.count(33);
      h.tensors.reserve(n);
      for (std::uint64_t t = 0; t < n; ++t) {
        format::tensor_info ti;
        ti.name = r.str();
        const auto type = r.u8();
        if (type >= format::dtype_count) throw std::invalid_argument(fmt::format("unknown dtype {}", type));
        ti.type = static_cast<format::dtype>(type);
        const auto rank = r.count(8);
        ti.shape.reserve(rank);
        for (std::uint64_t d = 0; d < rank; ++d) ti.shape.push_back(r.u64());
        ti.begin = r.u64();
        ti.end = r.u64();
        h.tensors.push_back(std::move(ti));
      }
      out.headers.emplace_back(std::move(name), std::move(h));
    }
    if (flag()) {
      format::index ix;
      ix.file = r.str();
      if (flag()) ix.total_size = r.u64();
      for (auto n = r.count(16); n > 0; --n) {
        auto tensor = r.str();
        if (!ix.weight_map.empty() && !(ix.weight_map.rbegin()->first < tensor))
          throw std::invalid_argument("the index's entries are not in name order");
        ix.weight_map.emplace_hint(ix.weight_map.end(), std::move(tensor), r.str());
      }
      for (auto n = r.count(10); n > 0; --n) {
        auto name = r.str();
        format::shard_record rec;
        if (flag()) rec.size = r.u64();
        if (flag()) rec.etag = r.str();
        ix.shard_records.insert_or_assign(std::move(name), std::move(rec));
      }
      out.index = std::move(ix);
    }
    if (!r.done()) throw std::invalid_argument("trailing bytes after the parses");
  } catch (const std::invalid_argument& e) {
    damaged(leader, fmt::format("its parses: {}", e.what()));
  }
  return out;
}

}  // namespace sluice::inline v0::detail::open_record
