#pragma once
/// \file
/// coalesce: byte extents in file order → read requests. Adjacent extents of
/// one file are merged into one request of at most `max_read` bytes; an
/// extent larger than that is split into chunks, and with an alignment no
/// request crosses one of its multiples. An extent with a direct
/// destination gets requests of its own that read straight into it. An
/// extent to be handed out as a page-cache view (`map`) gets one request of
/// its own, whatever its size: no slot holds it.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include <sluice/checkpoint.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/core/task.hpp>
#include <sluice/stages/concepts.hpp>

namespace sluice::inline v0 {

/// What every load reads: bytes [offset, offset + size) of a tensor, and
/// where to read them straight into (empty: through staging). A single-process
/// load reads whole tensors (`whole()`); a distributed load reads the plan's
/// slices of them (a TP part, a row range) — the same type, so both go through
/// the same coalesce | fetch | stage | place.
struct byte_extent {
  const tensor_ref* tensor = nullptr;
  std::uint64_t offset = 0;   ///< within the tensor
  std::uint64_t size = 0;
  std::span<std::byte> direct;
  bool map = false;           ///< hand the bytes out as a view of the page cache (the source said it can)
  /// Read through the page cache, never past it (any_source::read_via_page_cache):
  /// other ranks of the node take these bytes from it.
  bool via_page_cache = false;
  /// The whole tensor `t`.
  [[nodiscard]] static byte_extent whole(const tensor_ref& t, std::span<std::byte> direct = {}) noexcept {
    return {&t, 0, t.size, direct};
  }
  /// Where the extent starts in its file.
  [[nodiscard]] std::uint64_t file_offset() const noexcept { return tensor->offset + offset; }
};

/// A part of a tensor inside a read request.
struct request_piece {
  const tensor_ref* tensor = nullptr;
  std::uint64_t tensor_offset = 0;  ///< where this piece starts within the tensor
  std::uint64_t length = 0;
};

/// One read from storage: [offset, offset + length) of one file.
struct read_request {
  std::uint32_t file = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::vector<request_piece> pieces;  ///< in file order, tiling the range
  std::span<std::byte> direct;        ///< non-empty: read into this, not a slot
  bool mapped = false;                ///< a view of the page cache (source.map), not a read
  bool via_page_cache = false;        ///< byte_extent::via_page_cache (a request never mixes the two)

  [[nodiscard]] std::uint64_t end() const noexcept { return offset + length; }
};

struct coalesce_options {
  std::uint64_t max_read = std::uint64_t{32} << 20;  ///< bytes per request at most
  /// No request crosses a multiple of this in its file (0: none): the
  /// source's any_source::read_alignment (the node-local cache's blocks).
  std::uint64_t align = 0;
};

class coalesce : public pipeable {
 public:
  using input_type = byte_extent;
  using output_type = read_request;

  explicit coalesce(coalesce_options opt = {}) : opt_(opt) {
    if (opt_.max_read == 0) opt_.max_read = 1;
  }

  [[nodiscard]] task<void> run(channel<input_type>& in, channel<output_type>& out) {
    std::optional<read_request> cur;
    while (auto job = co_await in.receive()) {
      const byte_extent x = *job;
      if (x.map) {
        if (cur) co_await out.send(std::exchange(cur, std::nullopt).value());
        auto r = make_request(x, 0, x.size, {});
        r.mapped = true;
        co_await out.send(std::move(r));
        continue;
      }
      if (!x.direct.empty()) {
        if (cur) co_await out.send(std::exchange(cur, std::nullopt).value());
        for (std::uint64_t off = 0; off < x.size;) {
          const auto len = chunk(x, off);
          co_await out.send(make_request(x, off, len, x.direct.subspan(off, len)));
          off += len;
        }
        continue;
      }
      const bool fits = cur && cur->file == x.tensor->shard && cur->end() == x.file_offset() && cur->via_page_cache == x.via_page_cache &&
                        cur->length + x.size <= opt_.max_read && same_block(cur->offset, x.file_offset() + x.size);
      if (fits) {
        cur->pieces.push_back({x.tensor, x.offset, x.size});
        cur->length += x.size;
        continue;
      }
      if (cur) co_await out.send(std::exchange(cur, std::nullopt).value());
      if (x.size == 0) {   // a zero-size tensor still gets its (empty) request
        cur = make_request(x, 0, 0, {});
        continue;
      }
      // The extent's chunks: each sent but the last, which may merge with
      // what follows (without an alignment, only an extent of one chunk).
      for (std::uint64_t off = 0; off < x.size;) {
        const auto len = chunk(x, off);
        if (off + len == x.size && (opt_.align || off == 0)) {
          cur = make_request(x, off, len, {});
          break;
        }
        co_await out.send(make_request(x, off, len, {}));
        off += len;
      }
    }
    if (cur) co_await out.send(std::move(*cur));
  }

 private:
  // The request at `off` of extent `x`: at most max_read, not across a
  // multiple of the alignment.
  [[nodiscard]] std::uint64_t chunk(const byte_extent& x, std::uint64_t off) const noexcept {
    auto len = std::min(opt_.max_read, x.size - off);
    if (opt_.align) len = std::min(len, opt_.align - (x.file_offset() + off) % opt_.align);
    return len;
  }
  // Whether [begin, end) of a file lies within one alignment block.
  [[nodiscard]] bool same_block(std::uint64_t begin, std::uint64_t end) const noexcept {
    return !opt_.align || end <= begin - begin % opt_.align + opt_.align;
  }
  // Built outside the coroutine body: g++ 12 rejects nested braced lists there.
  // `off` is relative to the extent.
  static read_request make_request(const byte_extent& x, std::uint64_t off, std::uint64_t len, std::span<std::byte> direct) {
    read_request r;
    r.file = x.tensor->shard;
    r.offset = x.file_offset() + off;
    r.length = len;
    r.pieces.push_back({x.tensor, x.offset + off, len});
    r.direct = direct;
    r.via_page_cache = x.via_page_cache;
    return r;
  }
  coalesce_options opt_;
};

}  // namespace sluice::inline v0
