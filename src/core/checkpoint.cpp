// Opening, selecting and renaming checkpoints, compiled once (checkpoint.hpp
// declares them).

#include <sluice/checkpoint.hpp>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <sluice/source/directory_catalog.hpp>

#include "open_record.hpp"

namespace sluice::inline v0 {

namespace {

// An index's size against the cap, before a byte of it is read.
void check_index_size(std::uint64_t size, const std::string& file, const format::limits& lim) {
  if (size > lim.max_index_bytes)
    throw index_error("index-size",
                      fmt::format("the index is {} bytes{}", size, format::limit_hint(lim.max_index_bytes, "max_index_bytes")),
                      {file});
}

// A local index file, parsed (io_error if it cannot be read).
format::index read_local_index(const std::filesystem::path& path, const format::limits& lim) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw io_error("cannot open the index file", {path.string()}, errno);
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw io_error(fmt::format("cannot stat the index file: {}", ec.message()), {path.string()}, ec.value());
  check_index_size(size, path.string(), lim);
  std::string text;
  text.resize(size);
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (in.bad() || static_cast<std::uint64_t>(in.gcount()) != size)
    throw io_error("cannot read the index file (it changed while it was read?)", {path.string()}, errno);
  return format::parse_index(text, path.string(), lim);
}

std::string_view unquoted(std::string_view etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') return etag.substr(1, etag.size() - 2);
  return etag;
}

// The first tensor the index places in `shard` that `opt` selects (for messages).
std::string named_tensor(const format::index& ix, const std::string& shard, const open_options& opt) {
  for (const auto& [tensor, s] : ix.weight_map)
    if (s == shard && (!opt.select || opt.select(tensor))) return tensor;
  return format::first_tensor_in(ix, shard);
}

}  // namespace

checkpoint checkpoint::open(catalog& cat, const open_options& opt) {
  return open(std::shared_ptr<catalog>(std::shared_ptr<void>(), &cat), opt);  // not owned
}

catalog& checkpoint::storage() const {
  if (!storage_) throw usage_error("this checkpoint was not opened (no storage to read it from)");
  return *storage_;
}

checkpoint checkpoint::open(std::shared_ptr<catalog> shared, const open_options& opt) {
  return open_through(std::move(shared), opt, nullptr);
}

namespace {

// Rank 0's parse failing this rank's check: the record was damaged on the
// way (rank 0 ran the same rules), not the files.
template <class F>
void check_shared(const detail::parse_memo& memo, F&& check) {
  try {
    check();
  } catch (const format_error& e) {  // index_error is one too
    throw comm::comm_error(fmt::format("rank {}'s checkpoint opening record is damaged: its parses break a rule: {}", memo.leader, e.what()));
  }
}

}  // namespace

format::header checkpoint::header_of(catalog& cat, const std::string& name, const format::limits& lim, detail::parse_memo* memo) {
  if (memo && memo->replaying)
    if (auto node = memo->headers.extract(name)) {
      auto& h = node.mapped();
      h.file = cat.uri(name);
      check_shared(*memo, [&] { format::check_header(h, lim); });
      return std::move(h);
    }
  return read_header(cat, name, lim);
}

checkpoint checkpoint::open_through(std::shared_ptr<catalog> shared, const open_options& opt, detail::parse_memo* memo) {
  if (!shared) throw usage_error("checkpoint::open: no catalog");
  catalog& cat = *shared;
  checkpoint c;
  c.storage_ = shared;
  c.location_ = cat.location();
  const auto before = cat.bytes_read();
  std::vector<std::string> shard_names;
  std::optional<format::index> ix;
  const std::string index_name{format::index_file_name};
  if (!opt.index.empty()) {
    ix = read_local_index(opt.index, opt.limits);
    std::set<std::string> needed;
    for (const auto& [tensor, shard] : ix->weight_map)
      if (!opt.select || opt.select(tensor)) needed.insert(shard);
    shard_names.assign(needed.begin(), needed.end());
    check_listed(cat, *ix, shard_names, opt);
  } else if (cat.exists(index_name)) {
    if (memo && memo->replaying && memo->index) {
      ix = std::move(memo->index);
      memo->index.reset();
      ix->file = cat.uri(index_name);
      check_shared(*memo, [&] { format::check_index(*ix, opt.limits); });
    } else {
      const auto sz = cat.size(index_name);
      check_index_size(sz, cat.uri(index_name), opt.limits);
      auto bytes = cat.read(index_name, 0, sz);
      ix = format::parse_index(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                               cat.uri(index_name), opt.limits);
    }
    std::set<std::string> needed;
    for (const auto& [tensor, shard] : ix->weight_map)
      if (!opt.select || opt.select(tensor)) needed.insert(shard);
    shard_names.assign(needed.begin(), needed.end());
  } else if (cat.exists("model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    for (auto& n : cat.list())
      if (n.size() > 12 && n.ends_with(".safetensors")) shard_names.push_back(n);
    if (shard_names.empty())
      throw io_error("no model.safetensors.index.json, model.safetensors or *.safetensors file", {cat.location()});
  }
  std::map<std::string, const format::header*> headers;
  c.shards_.reserve(shard_names.size());
  cat.prefetch_prefixes(shard_names);  // S3: every shard's header GET at once, not one round trip after another
  for (const auto& name : shard_names) {
    if (ix && !cat.exists(name))
      throw index_error("missing-shard", fmt::format("index names shard '{}', which does not exist", name),
                        {ix->file, format::first_tensor_in(*ix, name)});
    c.shards_.push_back({name, cat.uri(name), header_of(cat, name, opt.limits, memo)});
  }
  for (const auto& s : c.shards_) headers.emplace(s.name, &s.header);
  if (ix) {
    if (opt.select) {
      // Verify only what was opened: the index restricted to opened shards.
      format::index sub;
      sub.file = ix->file;
      for (const auto& [t, s] : ix->weight_map)
        if (headers.contains(s)) sub.weight_map.emplace(t, s);
      format::verify(sub, headers, opt.verify);  // sub has no total_size: a subset cannot match it
    } else {
      format::verify(*ix, headers, opt.verify);
    }
  }
  c.header_bytes_read_ = cat.bytes_read() - before;
  cat.forget_prefixes();  // the headers are parsed: the catalog's copies of their bytes are not needed
  for (std::uint32_t i = 0; i < c.shards_.size(); ++i) {
    const auto& h = c.shards_[i].header;
    for (const auto& t : h.tensors) {
      if (opt.select && !opt.select(t.name)) continue;
      c.tensors_.push_back({apply_rename(t.name, opt.rename), t.name, i, t.type, t.shape,
                            h.data_start() + t.begin, t.size()});
    }
  }
  c.check_unique_names();
  // Rank 0 of a collective open: the index it read through its catalog goes
  // in the record (a local index file, opt.index, is each rank's own).
  if (memo && !memo->replaying && opt.index.empty()) memo->index = std::move(ix);
  return c;
}


// A local index's shards against what the location lists (one listing: on
// S3 it also brings every size and ETag, so no HEAD is needed): each listed,
// with the size and ETag the index records for it, if any.
void checkpoint::check_listed(catalog& cat, const format::index& ix, const std::vector<std::string>& shards,
                              const open_options& opt) {
  std::set<std::string> listed;
  for (auto& n : cat.list()) listed.insert(std::move(n));
  for (const auto& name : shards) {
    const auto tensor = named_tensor(ix, name, opt);
    if (!listed.contains(name))
      throw index_error("missing-shard", fmt::format("index names shard '{}', which {} does not list", name, cat.location()),
                        {ix.file, tensor});
    const auto rec = ix.shard_records.find(name);
    if (rec == ix.shard_records.end()) continue;
    if (rec->second.size) {
      const auto size = cat.size(name);
      if (size != *rec->second.size)
        throw index_error("stale-shard",
                          fmt::format("shard '{}' is {} bytes, the index '{}' records {}", name, size, ix.file, *rec->second.size),
                          {cat.uri(name), tensor});
    }
    if (rec->second.etag) {
      const auto etag = cat.etag(name);  // none in a directory: nothing to compare
      if (etag && unquoted(*etag) != unquoted(*rec->second.etag))
        throw index_error("stale-shard",
                          fmt::format("shard '{}' has ETag {}, the index '{}' records {}", name, *etag, ix.file, *rec->second.etag),
                          {cat.uri(name), tensor});
    }
  }
}

std::pair<std::shared_ptr<catalog>, std::optional<std::string>> checkpoint::resolve(const sluice::location& where,
                                                                                      const open_options& opt) {
  if (!where.local()) return {where.make_catalog(), std::nullopt};
  const auto path = where.path();
  const auto parent = [&] { return path.has_parent_path() ? path.parent_path() : std::filesystem::path("."); };
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return {std::make_shared<directory_catalog>(path), std::nullopt};
  // With a local index, a path to a file stands for its directory.
  if (path.filename() == format::index_file_name || !opt.index.empty())
    return {std::make_shared<directory_catalog>(parent()), std::nullopt};
  return {std::make_shared<directory_catalog>(parent()), path.filename().string()};
}

checkpoint checkpoint::open_file(std::shared_ptr<catalog> shared, const std::string& name, std::string location,
                                 const open_options& opt, detail::parse_memo* memo) {
  auto& cat = *shared;
  checkpoint c;
  c.storage_ = shared;
  c.location_ = std::move(location);
  const auto before = cat.bytes_read();
  c.shards_.push_back({name, cat.uri(name), header_of(cat, name, opt.limits, memo)});
  c.header_bytes_read_ = cat.bytes_read() - before;
  cat.forget_prefixes();
  const auto& h = c.shards_[0].header;
  for (const auto& t : h.tensors)
    if (!opt.select || opt.select(t.name))
      c.tensors_.push_back({apply_rename(t.name, opt.rename), t.name, 0, t.type, t.shape, h.data_start() + t.begin, t.size()});
  c.check_unique_names();
  return c;
}

checkpoint checkpoint::open(const sluice::location& where, const open_options& opt) {
  auto [cat, file] = resolve(where, opt);
  return file ? open_file(std::move(cat), *file, where.path().string(), opt) : open(std::move(cat), opt);
}

format::header checkpoint::read_header(catalog& cat, const std::string& name, const format::limits& lim) {
  const auto uri = cat.uri(name);
  const auto file_size = cat.size(name);
  auto first = cat.read_prefix(name, 8);
  const auto n = format::parse_header_length(first, file_size, uri, lim);
  auto json = cat.read(name, 8, n);
  if (json.size() != n)
    throw truncated_error(fmt::format("header read returned {} of {} bytes", json.size(), n), {uri, "", byte_range{8, 8 + n}});
  return format::parse_header(std::string_view(reinterpret_cast<const char*>(json.data()), json.size()), file_size, uri, lim);
}

checkpoint checkpoint::select(const std::function<bool(const tensor_ref&)>& keep) const {
  checkpoint c;
  c.location_ = location_;
  c.storage_ = storage_;
  c.header_bytes_read_ = header_bytes_read_;
  std::vector<std::int64_t> remap(shards_.size(), -1);
  for (const auto& t : tensors_) {
    if (!keep(t)) continue;
    if (remap[t.shard] < 0) {
      remap[t.shard] = static_cast<std::int64_t>(c.shards_.size());
      c.shards_.push_back(shards_[t.shard]);
    }
    c.tensors_.push_back(t);
    c.tensors_.back().shard = static_cast<std::uint32_t>(remap[t.shard]);
  }
  c.check_unique_names();
  return c;
}

checkpoint checkpoint::select(const std::set<std::string>& names) const {
  for (const auto& n : names)
    if (!find(n)) throw config_error(fmt::format("select: the checkpoint has no tensor '{}'", n), {location_, n});
  return select([&](const tensor_ref& t) { return names.contains(t.name); });
}

checkpoint checkpoint::rename(const std::vector<rename_rule>& rules) const {
  checkpoint c = *this;
  for (auto& t : c.tensors_) t.name = apply_rename(t.name, rules);
  c.check_unique_names();
  return c;
}

std::string checkpoint::apply_rename(const std::string& name, const std::vector<rename_rule>& rules) {
  for (const auto& r : rules)
    if (name.starts_with(r.from)) return r.to + name.substr(r.from.size());
  return name;
}

void checkpoint::check_unique_names() {
  by_name_.clear();
  by_name_.reserve(tensors_.size());
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    if (!by_name_.emplace(tensors_[i].name, i).second) {
      const auto& first = tensors_[by_name_[tensors_[i].name]];
      throw config_error(fmt::format("two tensors are named '{}' (from '{}' in {} and '{}' in {})", tensors_[i].name,
                                     first.source_name, shards_[first.shard].name, tensors_[i].source_name,
                                     shards_[tensors_[i].shard].name),
                         {location_, tensors_[i].name});
    }
  }
}

}  // namespace sluice::inline v0
