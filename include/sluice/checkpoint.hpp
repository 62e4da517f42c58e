#pragma once
/// \file
/// A checkpoint: its shards, their validated headers and the tensors in file
/// order. Opening reads metadata only (the index and each needed shard's
/// header); selection and renaming never reorder tensors.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <sluice/error.hpp>
#include <sluice/format/index.hpp>
#include <sluice/format/safetensors.hpp>
#include <sluice/source/concepts.hpp>
#include <sluice/source/directory_catalog.hpp>

namespace sluice::inline v0 {

/// One safetensors file of a checkpoint.
struct shard {
  std::string name;         ///< file name within the checkpoint location
  std::string uri;          ///< full path or URI
  format::header header;
};

/// One tensor of a checkpoint, located in its shard.
struct tensor_ref {
  std::string name;            ///< name after renaming (what engines see)
  std::string source_name;     ///< name in the file
  std::uint32_t shard = 0;     ///< index into checkpoint::shards()
  format::dtype type = format::dtype::U8;
  std::vector<std::uint64_t> shape;
  std::uint64_t offset = 0;    ///< absolute offset in the shard file
  std::uint64_t size = 0;      ///< bytes

  [[nodiscard]] byte_range range() const noexcept { return {offset, offset + size}; }
};

/// A prefix rewrite: a name starting with `from` gets `to` instead.
struct rename_rule {
  std::string from;
  std::string to;
};

/// Options for checkpoint::open.
struct open_options {
  /// Which tensors to keep, by their name in the file. With an index, shards
  /// holding none of the kept tensors are not opened at all.
  std::function<bool(std::string_view)> select;
  /// Prefix rewrites applied in order (first match wins), e.g. a VL wrapper's
  /// {"model.language_model.", "model."}.
  std::vector<rename_rule> rename;
  /// Index verification strictness.
  format::verify_options verify;
};

class checkpoint {
 public:
  /// Opens the checkpoint at a catalog's location: the index
  /// (model.safetensors.index.json) if present, else model.safetensors, else
  /// every *.safetensors file. Reads headers only. Throws format_error,
  /// index_error or io_error naming the file.
  [[nodiscard]] static checkpoint open(catalog& cat, const open_options& opt = {}) {
    checkpoint c;
    c.location_ = cat.location();
    const auto before = cat.bytes_read();
    std::vector<std::string> shard_names;
    std::optional<format::index> ix;
    const std::string index_name{format::index_file_name};
    if (cat.exists(index_name)) {
      const auto sz = cat.size(index_name);
      auto bytes = cat.read(index_name, 0, sz);
      ix = format::parse_index(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), cat.uri(index_name));
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
    for (const auto& name : shard_names) {
      if (ix && !cat.exists(name))
        throw index_error("missing-shard", fmt::format("index names shard '{}', which does not exist", name),
                          {ix->file, format::first_tensor_in(*ix, name)});
      c.shards_.push_back({name, cat.uri(name), read_header(cat, name)});
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
    for (std::uint32_t i = 0; i < c.shards_.size(); ++i) {
      const auto& h = c.shards_[i].header;
      for (const auto& t : h.tensors) {
        if (opt.select && !opt.select(t.name)) continue;
        c.tensors_.push_back({apply_rename(t.name, opt.rename), t.name, i, t.type, t.shape,
                              h.data_start() + t.begin, t.size()});
      }
    }
    c.check_unique_names();
    return c;
  }

  /// Opens a checkpoint directory, or a single .safetensors file (a path to
  /// the index file opens its directory).
  [[nodiscard]] static checkpoint open(const std::filesystem::path& path, const open_options& opt = {}) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec) && path.filename() == format::index_file_name) {
      directory_catalog cat(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
      return open(cat, opt);
    }
    if (std::filesystem::is_regular_file(path, ec)) {
      directory_catalog cat(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
      checkpoint c;
      c.location_ = path.string();
      const auto name = path.filename().string();
      c.shards_.push_back({name, cat.uri(name), read_header(cat, name)});
      c.header_bytes_read_ = cat.bytes_read();
      const auto& h = c.shards_[0].header;
      for (const auto& t : h.tensors)
        if (!opt.select || opt.select(t.name))
          c.tensors_.push_back({apply_rename(t.name, opt.rename), t.name, 0, t.type, t.shape, h.data_start() + t.begin, t.size()});
      c.check_unique_names();
      return c;
    }
    directory_catalog cat(path);
    return open(cat, opt);
  }

  /// Reads and validates one shard's header through a catalog: the 8-byte
  /// length, then exactly the JSON (catalogs with costly round trips serve both
  /// from one speculative read).
  [[nodiscard]] static format::header read_header(catalog& cat, const std::string& name) {
    const auto uri = cat.uri(name);
    const auto file_size = cat.size(name);
    auto first = cat.read_prefix(name, 8);
    const auto n = format::parse_header_length(first, file_size, uri);
    auto json = cat.read(name, 8, n);
    if (json.size() != n)
      throw truncated_error(fmt::format("header read returned {} of {} bytes", json.size(), n), {uri, "", byte_range{8, 8 + n}});
    return format::parse_header(std::string_view(reinterpret_cast<const char*>(json.data()), json.size()), file_size, uri);
  }

  [[nodiscard]] const std::string& location() const noexcept { return location_; }
  [[nodiscard]] const std::vector<shard>& shards() const noexcept { return shards_; }
  /// Tensors in file order: shard order, then offset.
  [[nodiscard]] const std::vector<tensor_ref>& tensors() const noexcept { return tensors_; }
  /// Bytes read from storage to open this checkpoint (index + headers).
  [[nodiscard]] std::uint64_t header_bytes_read() const noexcept { return header_bytes_read_; }
  /// Sum of the kept tensors' sizes.
  [[nodiscard]] std::uint64_t tensor_bytes() const noexcept {
    std::uint64_t n = 0;
    for (const auto& t : tensors_) n += t.size;
    return n;
  }
  /// The tensor with this (renamed) name, or nullptr.
  [[nodiscard]] const tensor_ref* find(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
  }

  /// The tensors for which `keep(tensor)` is true, and only the shards that
  /// hold them (shard indices are renumbered; order is kept).
  [[nodiscard]] checkpoint select(const std::function<bool(const tensor_ref&)>& keep) const {
    checkpoint c;
    c.location_ = location_;
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

  /// The named tensors (renamed names); throws config_error naming any name
  /// the checkpoint lacks.
  [[nodiscard]] checkpoint select(const std::set<std::string>& names) const {
    for (const auto& n : names)
      if (!find(n)) throw config_error(fmt::format("select: the checkpoint has no tensor '{}'", n), {location_, n});
    return select([&](const tensor_ref& t) { return names.contains(t.name); });
  }

  /// Applies prefix rewrites to the names (order unchanged). Throws
  /// config_error if two tensors end up with one name.
  [[nodiscard]] checkpoint rename(const std::vector<rename_rule>& rules) const {
    checkpoint c = *this;
    for (auto& t : c.tensors_) t.name = apply_rename(t.name, rules);
    c.check_unique_names();
    return c;
  }

 private:
  static std::string apply_rename(const std::string& name, const std::vector<rename_rule>& rules) {
    for (const auto& r : rules)
      if (name.starts_with(r.from)) return r.to + name.substr(r.from.size());
    return name;
  }
  void check_unique_names() {
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

  std::string location_;
  std::vector<shard> shards_;
  std::vector<tensor_ref> tensors_;
  std::unordered_map<std::string, std::size_t> by_name_;
  std::uint64_t header_bytes_read_ = 0;
};

}  // namespace sluice::inline v0
