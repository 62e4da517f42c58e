// The two sides of checkpoint::open(location, communicator) (checkpoint.hpp):
// rank 0 opens through a catalog that records every answer its storage gave;
// the record travels in one broadcast, and the other ranks open by replaying
// it through the same checkpoint::open, so that parsing, validation and their
// typed errors are the very same code on every rank.

#include <sluice/checkpoint.hpp>

#include <algorithm>
#include <compare>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/source/any_source.hpp>
#include <sluice/error.hpp>
#include <sluice/load.hpp>
#include <sluice/sink/any_sink.hpp>

namespace sluice::inline v0 {

namespace {

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

// The record is CBOR (nlohmann::json's): a map with a format tag, rank 0's
// failure, where it opened, the calls and the facts of every opened shard.
constexpr std::string_view record_format = "sluice-open/2";

// What a record says, as the replay reads it; a record that ends early, has
// trailing bytes or holds a field of the wrong type is a comm_error (it came
// over the communicator and must have been damaged there).
[[noreturn]] void damaged(std::size_t leader, const std::exception& e) {
  throw comm::comm_error(fmt::format("rank {}'s checkpoint opening record is damaged: {}", leader, e.what()));
}

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

// Forwards to `inner` (rank 0's own catalog) and records each answer.
class recording_catalog final : public catalog {
 public:
  explicit recording_catalog(catalog& inner) : inner_(inner) {}

  [[nodiscard]] std::string location() const override { return inner_.location(); }
  [[nodiscard]] std::string uri(const std::string& name) const override { return inner_.uri(name); }
  [[nodiscard]] std::vector<std::string> list() override {
    return record({op::list, {}}, [&] { return inner_.list(); }, [](const auto& v) { return nlohmann::json(v); });
  }
  [[nodiscard]] bool exists(const std::string& name) override {
    return record({op::exists, name}, [&] { return inner_.exists(name); }, [](bool b) { return nlohmann::json(b); });
  }
  [[nodiscard]] std::uint64_t size(const std::string& name) override {
    return record({op::size, name}, [&] { return inner_.size(name); }, [](std::uint64_t n) { return nlohmann::json(n); });
  }
  [[nodiscard]] std::optional<std::string> etag(const std::string& name) override {
    return record({op::etag, name}, [&] { return inner_.etag(name); }, etag_json);
  }
  [[nodiscard]] std::vector<std::byte> read(const std::string& name, std::uint64_t offset, std::uint64_t length) override {
    return record({op::read, name, offset, length}, [&] { return inner_.read(name, offset, length); }, bytes_json);
  }
  [[nodiscard]] std::vector<std::byte> read_prefix(const std::string& name, std::uint64_t length) override {
    return record({op::read_prefix, name, 0, length}, [&] { return inner_.read_prefix(name, length); }, bytes_json);
  }
  // The data path is the inner catalog's (the opened checkpoint reads through its own catalog anyway).
  [[nodiscard]] std::unique_ptr<any_source> open_source(const checkpoint& ck, asio::io_context& ioc, const load_options& opt,
                                                        const reader_sizing& sizing) override {
    return inner_.open_source(ck, ioc, opt, sizing);
  }

  [[nodiscard]] const std::map<call_key, answer>& calls() const noexcept { return calls_; }

 private:
  template <class F, class Encode>
  auto record(call_key key, F&& f, Encode&& encode) -> decltype(f()) {
    try {
      auto v = f();
      calls_.insert_or_assign(std::move(key), answer{false, {}, encode(v)});
      return v;
    } catch (const std::exception& e) {
      calls_.insert_or_assign(std::move(key), answer{true, e.what(), {}});
      throw;
    }
  }
  catalog& inner_;
  std::map<call_key, answer> calls_;
};

// Answers from rank 0's record; a question rank 0 was not asked goes to this
// rank's own catalog (its options asked for more), unless rank 0 failed:
// then it is rank 0's failure.
class replaying_catalog final : public catalog {
 public:
  replaying_catalog(catalog& inner, const std::map<call_key, answer>& calls, std::optional<std::string> leader_failure,
                    std::size_t leader)
      : inner_(inner), calls_(calls), leader_failure_(std::move(leader_failure)), leader_(leader) {}

  [[nodiscard]] std::string location() const override { return inner_.location(); }
  [[nodiscard]] std::string uri(const std::string& name) const override { return inner_.uri(name); }
  [[nodiscard]] std::vector<std::string> list() override {
    return replay({op::list, {}}, [&] { return inner_.list(); },
                  [](const nlohmann::json& j) { return j.get<std::vector<std::string>>(); });
  }
  [[nodiscard]] bool exists(const std::string& name) override {
    return replay({op::exists, name}, [&] { return inner_.exists(name); }, [](const nlohmann::json& j) { return j.get<bool>(); });
  }
  [[nodiscard]] std::uint64_t size(const std::string& name) override {
    return replay({op::size, name}, [&] { return inner_.size(name); },
                  [](const nlohmann::json& j) { return j.get<std::uint64_t>(); });
  }
  [[nodiscard]] std::optional<std::string> etag(const std::string& name) override {
    return replay({op::etag, name}, [&] { return inner_.etag(name); }, json_etag);
  }
  [[nodiscard]] std::vector<std::byte> read(const std::string& name, std::uint64_t offset, std::uint64_t length) override {
    return replay({op::read, name, offset, length}, [&] { return inner_.read(name, offset, length); }, json_bytes);
  }
  [[nodiscard]] std::vector<std::byte> read_prefix(const std::string& name, std::uint64_t length) override {
    return replay({op::read_prefix, name, 0, length}, [&] { return inner_.read_prefix(name, length); }, json_bytes);
  }
  // The data path is the inner catalog's (the opened checkpoint reads through its own catalog anyway).
  [[nodiscard]] std::unique_ptr<any_source> open_source(const checkpoint& ck, asio::io_context& ioc, const load_options& opt,
                                                        const reader_sizing& sizing) override {
    return inner_.open_source(ck, ioc, opt, sizing);
  }

  [[noreturn]] void throw_leader_failure(const std::string& what) const {
    throw distributed_error(fmt::format("rank {} failed while opening the checkpoint: {}", leader_, what), leader_);
  }

 private:
  template <class Own, class Decode>
  auto replay(const call_key& key, Own&& own, Decode&& decode) -> decltype(own()) {
    const auto it = calls_.find(key);
    if (it == calls_.end()) {
      if (leader_failure_) throw_leader_failure(*leader_failure_);
      return own();
    }
    if (it->second.failed) throw_leader_failure(it->second.message);
    return decode(it->second.value);
  }
  catalog& inner_;
  const std::map<call_key, answer>& calls_;
  std::optional<std::string> leader_failure_;
  std::size_t leader_;
};

// The opened files' sizes and version tags, for catalog::adopt.
struct file_facts {
  std::string name;
  std::uint64_t size = 0;
  std::optional<std::string> etag;
};

// Where a rank opens: its catalog's location, and the file for a single one.
// Ranks share rank 0's record only where this is the same.
std::string opened_location(const catalog& cat, const std::optional<std::string>& file) {
  return file ? cat.location() + "\n" + *file : cat.location();
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

// The record: rank 0's failure (or null), where it opened, the calls
// [op, name, offset, length, failed, message, answer], the facts of every
// opened shard [name, size, etag or null]; CBOR.
std::vector<std::byte> checkpoint::open_recorded(const sluice::location& where, const open_options& opt,
                                                 std::optional<checkpoint>& out, std::exception_ptr& failure) {
  std::unique_ptr<recording_catalog> rec;
  std::vector<file_facts> facts;
  std::string opened_at = where.uri();
  try {
    auto [cat, file] = resolve(where, opt);
    opened_at = opened_location(*cat, file);
    rec = std::make_unique<recording_catalog>(*cat);
    const auto before = cat->bytes_read();
    // The recording catalog stands in only while opening: not owned by the checkpoint.
    std::shared_ptr<catalog> through(std::shared_ptr<void>(), rec.get());
    auto c = file ? open_file(through, *file, where.path().string(), opt) : open(through, opt);
    c.storage_ = cat;
    c.header_bytes_read_ = cat->bytes_read() - before;
    // Known by now (sizes read, ETags pinned by the header reads): no request.
    for (const auto& s : c.shards_) facts.push_back({s.name, cat->size(s.name), cat->etag(s.name)});
    out.emplace(std::move(c));
  } catch (...) {
    failure = std::current_exception();
    out.reset();
  }
  nlohmann::json calls = nlohmann::json::array();
  if (rec)
    for (const auto& [k, a] : rec->calls())
      calls.push_back({static_cast<std::uint8_t>(k.what), k.name, k.offset, k.length, a.failed, a.message, a.value});
  nlohmann::json shards = nlohmann::json::array();
  for (const auto& f : facts) shards.push_back({f.name, f.size, etag_json(f.etag)});
  const nlohmann::json record = {{"format", std::string(record_format)},
                                 {"failure", failure ? nlohmann::json(what_of(failure)) : nlohmann::json()},
                                 {"at", opened_at},
                                 {"calls", std::move(calls)},
                                 {"shards", std::move(shards)}};
  const auto cbor = nlohmann::json::to_cbor(record);
  const auto* p = reinterpret_cast<const std::byte*>(cbor.data());
  return {p, p + cbor.size()};
}

checkpoint checkpoint::open_replayed(const sluice::location& where, const open_options& opt,
                                     std::span<const std::byte> record, std::size_t leader) {
  std::optional<std::string> leader_failure;
  std::string leader_location;
  std::map<call_key, answer> calls;
  std::vector<file_facts> facts;
  try {
    // Strict: a record that ends early or has trailing bytes is a parse_error.
    const auto* p = reinterpret_cast<const std::uint8_t*>(record.data());
    const auto j = nlohmann::json::from_cbor(p, p + record.size());
    if (!j.is_object() || !j.contains("format") || !j.at("format").is_string() ||
        j.at("format").get<std::string>() != record_format)
      throw comm::comm_error(fmt::format("rank {} sent no checkpoint opening record", leader));
    if (const auto& f = j.at("failure"); !f.is_null()) leader_failure = f.get<std::string>();
    leader_location = j.at("at").get<std::string>();
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
      calls.insert_or_assign(std::move(k), std::move(a));
    }
    for (const auto& f : array(j.at("shards"))) {
      if (!f.is_array() || f.size() != 3) throw std::invalid_argument("a shard is not [name, size, etag]");
      facts.push_back({f[0].get<std::string>(), u64(f[1]), json_etag(f[2])});
    }
  } catch (const nlohmann::json::exception& e) {
    damaged(leader, e);
  } catch (const std::invalid_argument& e) {
    damaged(leader, e);
  }

  // Rank 0's failure, reproduced where it was a format or index rule (the
  // same bytes parse the same way), else named.
  auto [cat, file] = resolve(where, opt);
  if (opened_location(*cat, file) != leader_location) {
    // Another location than rank 0's (a prefix or directory of its own): its
    // own metadata, read by itself. Rank 0's failure still fails it.
    if (leader_failure)
      throw distributed_error(fmt::format("rank {} failed while opening the checkpoint: {}", leader, *leader_failure), leader);
    return file ? open_file(std::move(cat), *file, where.path().string(), opt) : open(std::move(cat), opt);
  }
  replaying_catalog replay(*cat, calls, leader_failure, leader);
  const auto before = cat->bytes_read();
  std::shared_ptr<catalog> through(std::shared_ptr<void>(), &replay);
  auto c = file ? open_file(through, *file, where.path().string(), opt) : open(through, opt);
  if (leader_failure) replay.throw_leader_failure(*leader_failure);
  c.storage_ = cat;
  for (const auto& f : facts)
    if (std::any_of(c.shards_.begin(), c.shards_.end(), [&](const shard& s) { return s.name == f.name; }))
      cat->adopt(f.name, f.size, f.etag);
  c.header_bytes_read_ = cat->bytes_read() - before;
  return c;
}

}  // namespace sluice::inline v0
