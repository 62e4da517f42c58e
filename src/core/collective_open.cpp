// The two sides of checkpoint::open(location, communicator) (checkpoint.hpp):
// rank 0 opens through a catalog that records every answer its storage gave;
// the record travels in one broadcast, and the other ranks open by replaying
// it through the same checkpoint::open, so that parsing, validation and their
// typed errors are the very same code on every rank.

#include <sluice/checkpoint.hpp>

#include <algorithm>
#include <compare>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <sluice/distributed/slice_reader.hpp>
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
  std::vector<std::byte> value;  // the answer, encoded (see encode/decode below)
};

constexpr std::uint32_t record_magic = 0x534c4f31;  // "SLO1"

class writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(std::byte{v}); }
  void u64(std::uint64_t v) { raw(&v, sizeof v); }
  void bytes(std::span<const std::byte> b) {
    u64(b.size());
    raw(b.data(), b.size());
  }
  void str(const std::string& s) { bytes(std::as_bytes(std::span(s.data(), s.size()))); }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<std::byte> out_;
};

// Reads a record; one that ends early or lies about a length is a comm_error
// (it came over the communicator and must have been damaged there).
class reader {
 public:
  explicit reader(std::span<const std::byte> in) : in_(in) {}
  std::uint8_t u8() { return std::to_integer<std::uint8_t>(take(1)[0]); }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    std::memcpy(&v, take(sizeof v).data(), sizeof v);
    return v;
  }
  std::vector<std::byte> bytes() {
    const auto n = u64();
    auto b = take(n);
    return {b.begin(), b.end()};
  }
  std::string str() {
    const auto n = u64();
    auto b = take(n);
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }
  [[nodiscard]] bool done() const noexcept { return pos_ == in_.size(); }

 private:
  std::span<const std::byte> take(std::uint64_t n) {
    if (n > in_.size() - pos_)
      throw comm::comm_error(fmt::format("the checkpoint's opening record ends at byte {} of {}, {} more expected", pos_,
                                         in_.size(), n));
    auto s = in_.subspan(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

std::vector<std::byte> encode_u64(std::uint64_t v) {
  writer w;
  w.u64(v);
  return w.take();
}
std::vector<std::byte> encode_names(const std::vector<std::string>& names) {
  writer w;
  w.u64(names.size());
  for (const auto& n : names) w.str(n);
  return w.take();
}
std::vector<std::byte> encode_etag(const std::optional<std::string>& e) {
  writer w;
  w.u8(e ? 1 : 0);
  if (e) w.str(*e);
  return w.take();
}
std::vector<std::string> decode_names(std::span<const std::byte> b) {
  reader r(b);
  std::vector<std::string> out;
  for (auto n = r.u64(); n > 0; --n) out.push_back(r.str());
  return out;
}
std::optional<std::string> decode_etag(std::span<const std::byte> b) {
  reader r(b);
  if (!r.u8()) return std::nullopt;
  return r.str();
}

// Forwards to `inner` (rank 0's own catalog) and records each answer.
class recording_catalog final : public catalog {
 public:
  explicit recording_catalog(catalog& inner) : inner_(inner) {}

  [[nodiscard]] std::string location() const override { return inner_.location(); }
  [[nodiscard]] std::string uri(const std::string& name) const override { return inner_.uri(name); }
  [[nodiscard]] std::vector<std::string> list() override {
    return record({op::list, {}}, [&] { return inner_.list(); }, encode_names);
  }
  [[nodiscard]] bool exists(const std::string& name) override {
    return record({op::exists, name}, [&] { return inner_.exists(name); },
                  [](bool b) { return encode_u64(b ? 1 : 0); });
  }
  [[nodiscard]] std::uint64_t size(const std::string& name) override {
    return record({op::size, name}, [&] { return inner_.size(name); }, encode_u64);
  }
  [[nodiscard]] std::optional<std::string> etag(const std::string& name) override {
    return record({op::etag, name}, [&] { return inner_.etag(name); }, encode_etag);
  }
  [[nodiscard]] std::vector<std::byte> read(const std::string& name, std::uint64_t offset, std::uint64_t length) override {
    return record({op::read, name, offset, length}, [&] { return inner_.read(name, offset, length); },
                  [](const std::vector<std::byte>& b) { return b; });
  }
  [[nodiscard]] std::vector<std::byte> read_prefix(const std::string& name, std::uint64_t length) override {
    return record({op::read_prefix, name, 0, length}, [&] { return inner_.read_prefix(name, length); },
                  [](const std::vector<std::byte>& b) { return b; });
  }
  [[nodiscard]] load_stats load(const checkpoint&, any_sink, staging_pool&, const load_options&) override {
    throw usage_error("a recording catalog has no data path (the opened checkpoint reads through its own catalog)");
  }
  [[nodiscard]] std::unique_ptr<any_slice_reader> slice_reader(const checkpoint&, const load_options&,
                                                               const reader_sizing&) override {
    throw usage_error("a recording catalog has no data path (the opened checkpoint reads through its own catalog)");
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
    return replay({op::list, {}}, [&] { return inner_.list(); }, decode_names);
  }
  [[nodiscard]] bool exists(const std::string& name) override {
    return replay({op::exists, name}, [&] { return inner_.exists(name); },
                  [](std::span<const std::byte> b) { return reader(b).u64() != 0; });
  }
  [[nodiscard]] std::uint64_t size(const std::string& name) override {
    return replay({op::size, name}, [&] { return inner_.size(name); },
                  [](std::span<const std::byte> b) { return reader(b).u64(); });
  }
  [[nodiscard]] std::optional<std::string> etag(const std::string& name) override {
    return replay({op::etag, name}, [&] { return inner_.etag(name); }, decode_etag);
  }
  [[nodiscard]] std::vector<std::byte> read(const std::string& name, std::uint64_t offset, std::uint64_t length) override {
    return replay({op::read, name, offset, length}, [&] { return inner_.read(name, offset, length); },
                  [](std::span<const std::byte> b) { return std::vector<std::byte>(b.begin(), b.end()); });
  }
  [[nodiscard]] std::vector<std::byte> read_prefix(const std::string& name, std::uint64_t length) override {
    return replay({op::read_prefix, name, 0, length}, [&] { return inner_.read_prefix(name, length); },
                  [](std::span<const std::byte> b) { return std::vector<std::byte>(b.begin(), b.end()); });
  }
  [[nodiscard]] load_stats load(const checkpoint&, any_sink, staging_pool&, const load_options&) override {
    throw usage_error("a replaying catalog has no data path (the opened checkpoint reads through its own catalog)");
  }
  [[nodiscard]] std::unique_ptr<any_slice_reader> slice_reader(const checkpoint&, const load_options&,
                                                               const reader_sizing&) override {
    throw usage_error("a replaying catalog has no data path (the opened checkpoint reads through its own catalog)");
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

// The record: magic, rank 0's failure (flag, message), where it opened, the
// calls, the facts of every opened shard.
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
  writer w;
  w.u64(record_magic);
  w.u8(failure ? 1 : 0);
  w.str(failure ? what_of(failure) : std::string());
  w.str(opened_at);
  const auto& calls = rec ? rec->calls() : std::map<call_key, answer>{};
  w.u64(calls.size());
  for (const auto& [k, a] : calls) {
    w.u8(static_cast<std::uint8_t>(k.what));
    w.str(k.name);
    w.u64(k.offset);
    w.u64(k.length);
    w.u8(a.failed ? 1 : 0);
    w.str(a.message);
    w.bytes(a.value);
  }
  w.u64(facts.size());
  for (const auto& f : facts) {
    w.str(f.name);
    w.u64(f.size);
    w.u8(f.etag ? 1 : 0);
    w.str(f.etag.value_or(std::string()));
  }
  return w.take();
}

checkpoint checkpoint::open_replayed(const sluice::location& where, const open_options& opt,
                                     std::span<const std::byte> record, std::size_t leader) {
  reader r(record);
  if (r.u64() != record_magic) throw comm::comm_error(fmt::format("rank {} sent no checkpoint opening record", leader));
  std::optional<std::string> leader_failure;
  const bool failed = r.u8() != 0;
  auto message = r.str();
  if (failed) leader_failure = std::move(message);
  const auto leader_location = r.str();
  std::map<call_key, answer> calls;
  for (auto n = r.u64(); n > 0; --n) {
    call_key k;
    k.what = static_cast<op>(r.u8());
    k.name = r.str();
    k.offset = r.u64();
    k.length = r.u64();
    answer a;
    a.failed = r.u8() != 0;
    a.message = r.str();
    a.value = r.bytes();
    calls.insert_or_assign(std::move(k), std::move(a));
  }
  std::vector<file_facts> facts;
  for (auto n = r.u64(); n > 0; --n) {
    file_facts f;
    f.name = r.str();
    f.size = r.u64();
    const bool has = r.u8() != 0;
    auto e = r.str();
    if (has) f.etag = std::move(e);
    facts.push_back(std::move(f));
  }
  if (!r.done()) throw comm::comm_error(fmt::format("rank {}'s checkpoint opening record has trailing bytes", leader));

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
