#pragma once
/// \file
/// A checkpoint: its shards, their validated headers and the tensors in file
/// order. Opening reads metadata only (the index and each needed shard's
/// header); selection and renaming never reorder tensors.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <sluice/comm/concepts.hpp>
#include <sluice/error.hpp>
#include <sluice/format/index.hpp>
#include <sluice/format/safetensors.hpp>
#include <sluice/source/concepts.hpp>
#include <sluice/location.hpp>
#include <sluice/source/directory_catalog.hpp>

namespace sluice::inline v0 {

namespace detail {
struct parse_memo;  // src/core/open_record.hpp
}

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
  /// Caps on the metadata (index size, header depth, tensor count, name
  /// length): a checkpoint beyond them is a format_error or index_error
  /// naming the cap, before memory is sized from it (format/limits.hpp).
  format::limits limits;
  /// A local index file (model.safetensors.index.json format) to open the
  /// location through instead of the location's own index (e.g. an engine's
  /// index of a draft model whose shards live in S3). The shards it names
  /// (those holding selected tensors) are resolved in the location and
  /// verified against what the location lists, before any tensor byte is
  /// read: each must be listed (rule "missing-shard"), with the size and, on
  /// a location with ETags (S3), the ETag that the index's
  /// `metadata.shards.<name>` records, if it does ("stale-shard"); then the
  /// headers are read and `format::verify` checks the index against them
  /// ("missing-tensor", "unindexed-tensor", ...). Empty: none.
  std::filesystem::path index;
};

class checkpoint {
 public:
  /// Opens the checkpoint at a catalog's location: through `opt.index` if
  /// set, else the index (model.safetensors.index.json) if present, else
  /// model.safetensors, else every *.safetensors file. Reads headers only. Throws format_error,
  /// index_error or io_error naming the file.
  /// The checkpoint keeps a reference to `cat`, which must outlive every load
  /// of it (the overload below shares ownership instead).
  [[nodiscard]] static checkpoint open(catalog& cat, const open_options& opt = {});
  [[nodiscard]] static checkpoint open(std::shared_ptr<catalog> cat, const open_options& opt = {});

  /// Opens the checkpoint at `where`: a directory, a single .safetensors
  /// file (a path to the index file opens its directory), or a URI of a
  /// registered scheme ("s3://bucket/prefix/", see location.hpp).
  [[nodiscard]] static checkpoint open(const sluice::location& where, const open_options& opt = {});

  /// Opens the checkpoint at `where` once for every rank of `c` (a
  /// collective: every rank calls it, with the same options). Rank 0 of `c` alone reads the
  /// index, the listing and the shard headers from storage, recording every
  /// answer its catalog gave (bytes, sizes, ETags, existence); one broadcast
  /// shares the record, and every other rank opens by replaying it through
  /// the same validation as `open(where, opt)`, so it throws the same typed
  /// errors (a corrupt header is the same format_error on every rank). After
  /// a successful open the record holds rank 0's parsed headers and index
  /// instead of their JSON: a rank with the same limits checks them by the
  /// parser's rules (format::check_header, check_index) rather than parse
  /// the JSON again; a parse that breaks one is a comm_error naming rank 0. A failure of rank 0's storage itself (an S3 error, an unreadable
  /// file) makes the others throw distributed_error naming rank 0 and its
  /// error; rank 0 throws its own. No rank waits on another that failed.
  /// A rank whose location is not rank 0's (its catalog's location differs:
  /// a prefix or directory of its own) opens it itself, as `open(where, opt)`.
  ///
  /// Each rank keeps its own catalog for the data paths, pinned to what rank
  /// 0 saw (catalog::adopt: on S3 the ETags, so no HEAD; in a directory its
  /// own files' sizes are checked). header_bytes_read() is what this rank read
  /// from storage: everything on rank 0, nothing on the others unless their
  /// options asked for more than rank 0's did (they read that themselves).
  /// A world of one rank is `open(where, opt)`.
  template <comm::communicator Comm>
  [[nodiscard]] static checkpoint open(const sluice::location& where, Comm& c, const open_options& opt = {});

  /// Reads and validates one shard's header through a catalog: the 8-byte
  /// length, then exactly the JSON (catalogs with costly round trips serve both
  /// from one speculative read).
  [[nodiscard]] static format::header read_header(catalog& cat, const std::string& name, const format::limits& lim = {});

  [[nodiscard]] const std::string& location() const noexcept { return location_; }
  /// The catalog it was opened through: its storage, whose data paths every
  /// load of it uses. Throws usage_error for a checkpoint that was not opened.
  [[nodiscard]] catalog& storage() const;
  [[nodiscard]] const std::vector<shard>& shards() const noexcept { return shards_; }
  /// Every shard's URI (a path for local files), in shard order: the files a
  /// source over this checkpoint opens (file index = shard index).
  [[nodiscard]] std::vector<std::string> shard_uris() const {
    std::vector<std::string> u;
    u.reserve(shards_.size());
    for (const auto& s : shards_) u.push_back(s.uri);
    return u;
  }
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
  [[nodiscard]] checkpoint select(const std::function<bool(const tensor_ref&)>& keep) const;

  /// The named tensors (renamed names); throws config_error naming any name
  /// the checkpoint lacks.
  [[nodiscard]] checkpoint select(const std::set<std::string>& names) const;

  /// Applies prefix rewrites to the names (order unchanged). Throws
  /// config_error if two tensors end up with one name.
  [[nodiscard]] checkpoint rename(const std::vector<rename_rule>& rules) const;

 private:
  static std::string apply_rename(const std::string& name, const std::vector<rename_rule>& rules);
  static void check_listed(catalog& cat, const format::index& ix, const std::vector<std::string>& shards,
                           const open_options& opt);
  void check_unique_names();
  // The local catalog of `where` and, for a single .safetensors file, its name.
  static std::pair<std::shared_ptr<catalog>, std::optional<std::string>> resolve(const sluice::location& where,
                                                                                 const open_options& opt);
  // The opens above, sharing parses with a collective open's other ranks
  // through `memo` (src/core/open_record.hpp) where it is set.
  static checkpoint open_file(std::shared_ptr<catalog> cat, const std::string& name, std::string location,
                              const open_options& opt, detail::parse_memo* memo = nullptr);
  static checkpoint open_through(std::shared_ptr<catalog> cat, const open_options& opt, detail::parse_memo* memo);
  // read_header, or the header `memo` holds for `name` (checked).
  static format::header header_of(catalog& cat, const std::string& name, const format::limits& lim, detail::parse_memo* memo);
  // The two sides of the collective open (src/core/collective_open.cpp): rank
  // 0 opens through a recording catalog and returns the serialised record
  // (its failure included, when `out` stays empty); the others open by
  // replaying it.
  static std::vector<std::byte> open_recorded(const sluice::location& where, const open_options& opt,
                                              std::optional<checkpoint>& out, std::exception_ptr& failure);
  static checkpoint open_replayed(const sluice::location& where, const open_options& opt,
                                  std::span<const std::byte> record, std::size_t leader);

  std::string location_;
  std::vector<shard> shards_;
  std::vector<tensor_ref> tensors_;
  std::unordered_map<std::string, std::size_t> by_name_;
  std::uint64_t header_bytes_read_ = 0;
  std::shared_ptr<catalog> storage_;
};

template <comm::communicator Comm>
checkpoint checkpoint::open(const sluice::location& where, Comm& c, const open_options& opt) {
  if (c.size() <= 1) return open(where, opt);
  constexpr std::size_t leader = 0;
  // Two broadcasts: the record's size, then the record (equal sizes on every rank).
  std::uint64_t size = 0;
  auto size_bytes = std::as_writable_bytes(std::span(&size, 1));
  if (c.rank() == leader) {
    std::optional<checkpoint> ck;
    std::exception_ptr failure;
    auto record = open_recorded(where, opt, ck, failure);
    size = record.size();
    c.broadcast(size_bytes, leader);
    c.broadcast(record, leader);
    if (failure) std::rethrow_exception(failure);
    return std::move(*ck);
  }
  c.broadcast(size_bytes, leader);
  std::vector<std::byte> record(size);
  c.broadcast(record, leader);
  return open_replayed(where, opt, record, leader);
}

}  // namespace sluice::inline v0
