// The two sides of checkpoint::open(location, communicator) (checkpoint.hpp):
// rank 0 opens through a catalog that records every answer its storage gave;
// the record travels in one broadcast, and the other ranks open by replaying
// it through the same checkpoint::open, so that validation and its typed
// errors are the very same code on every rank. After a successful open the
// record carries rank 0's parses instead of the header and index bytes: the
// others check them by the same rules (format::check_header, check_index)
// rather than lex the same JSON again, which for a 91,000-tensor checkpoint
// is most of an open's time. A failed open carries the bytes, and each rank
// reproduces the failure by parsing them.

#include <sluice/checkpoint.hpp>

#include <algorithm>
#include <compare>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "open_record.hpp"

#include <sluice/source/any_source.hpp>
#include <sluice/error.hpp>
#include <sluice/load.hpp>
#include <sluice/sink/any_sink.hpp>

namespace sluice::inline v0 {

namespace {

using namespace detail::open_record;

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
  // Not recorded: it returns nothing, and the read_prefix calls it prepares are.
  void prefetch_prefixes(const std::vector<std::string>& names) override { inner_.prefetch_prefixes(names); }
  void forget_prefixes() override { inner_.forget_prefixes(); }
  // The data path is the inner catalog's (the opened checkpoint reads through its own catalog anyway).
  [[nodiscard]] bool shares_page_cache() const override { return inner_.shares_page_cache(); }
  [[nodiscard]] std::unique_ptr<any_source> open_source(const checkpoint& ck, asio::io_context& ioc, const source_options& opt,
                                                        const reader_sizing& sizing) override {
    return inner_.open_source(ck, ioc, opt, sizing);
  }

  [[nodiscard]] std::map<call_key, answer> take_calls() noexcept { return std::move(calls_); }

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
  [[nodiscard]] bool shares_page_cache() const override { return inner_.shares_page_cache(); }
  [[nodiscard]] std::unique_ptr<any_source> open_source(const checkpoint& ck, asio::io_context& ioc, const source_options& opt,
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
  std::vector<std::byte> parses;
  std::set<std::string> parsed_files;
  std::string opened_at = where.uri();
  try {
    auto [cat, file] = resolve(where, opt);
    opened_at = opened_location(*cat, file);
    rec = std::make_unique<recording_catalog>(*cat);
    const auto before = cat->bytes_read();
    // The recording catalog stands in only while opening: not owned by the checkpoint.
    std::shared_ptr<catalog> through(std::shared_ptr<void>(), rec.get());
    detail::parse_memo memo;
    auto c = file ? open_file(through, *file, where.path().string(), opt, &memo) : open_through(through, opt, &memo);
    std::vector<std::pair<std::string, const format::header*>> headers;
    for (const auto& s : c.shards_) headers.emplace_back(s.name, &s.header);
    parses = encode_parsed(opt.limits, headers, memo.index ? &*memo.index : nullptr);
    for (const auto& s : c.shards_) parsed_files.insert(s.name);
    if (memo.index) parsed_files.insert(std::string(format::index_file_name));
    c.storage_ = cat;
    c.header_bytes_read_ = cat->bytes_read() - before;
    // Known by now (sizes read, ETags pinned by the header reads): no request.
    for (const auto& s : c.shards_) facts.push_back({s.name, cat->size(s.name), cat->etag(s.name)});
    out.emplace(std::move(c));
  } catch (...) {
    failure = std::current_exception();
    out.reset();
  }
  record r;
  if (failure) r.failure = what_of(failure);
  r.at = opened_at;
  if (rec) r.calls = rec->take_calls();
  if (!failure) {
    // The parses stand for the bytes they were parsed from.
    std::erase_if(r.calls, [&](const auto& call) {
      const auto& k = call.first;
      return (k.what == op::read || k.what == op::read_prefix) && parsed_files.contains(k.name);
    });
    r.parsed = std::move(parses);
  }
  r.shards = std::move(facts);
  return encode(r);
}

checkpoint checkpoint::open_replayed(const sluice::location& where, const open_options& opt,
                                     std::span<const std::byte> record, std::size_t leader) {
  auto r = decode(record, leader);
  const auto& leader_failure = r.failure;
  const auto& leader_location = r.at;
  const auto& calls = r.calls;
  const auto& facts = r.shards;

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
  // Rank 0's parses, where it parsed within this rank's limits (else this
  // rank parses, and reads what the record no longer holds itself).
  detail::parse_memo memo;
  memo.replaying = true;
  memo.leader = leader;
  if (!r.parsed.empty() && !leader_failure) {
    auto p = decode_parsed(r.parsed, leader);
    if (p.limits == opt.limits) {
      for (auto& [name, h] : p.headers) memo.headers.insert_or_assign(std::move(name), std::move(h));
      memo.index = std::move(p.index);
    }
  }
  replaying_catalog replay(*cat, calls, leader_failure, leader);
  const auto before = cat->bytes_read();
  std::shared_ptr<catalog> through(std::shared_ptr<void>(), &replay);
  auto c = file ? open_file(through, *file, where.path().string(), opt, &memo) : open_through(through, opt, &memo);
  if (leader_failure) replay.throw_leader_failure(*leader_failure);
  c.storage_ = cat;
  for (const auto& f : facts)
    if (std::any_of(c.shards_.begin(), c.shards_.end(), [&](const shard& s) { return s.name == f.name; }))
      cat->adopt(f.name, f.size, f.etag);
  c.header_bytes_read_ = cat->bytes_read() - before;
  return c;
}

}  // namespace sluice::inline v0
