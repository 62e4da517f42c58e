#pragma once
/// \file
/// coalesce: tensors in file order → read requests. Adjacent tensors of one
/// file are merged into one request of at most `max_read` bytes; a tensor
/// larger than that is split into chunks. A tensor with a direct destination
/// gets requests of its own that read straight into it.

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

/// A tensor to load, and where to read it straight into (empty: through staging).
struct tensor_job {
  const tensor_ref* tensor = nullptr;
  std::span<std::byte> direct;
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

  [[nodiscard]] std::uint64_t end() const noexcept { return offset + length; }
};

struct coalesce_options {
  std::uint64_t max_read = std::uint64_t{32} << 20;  ///< bytes per request at most
};

class coalesce : public pipeable {
 public:
  using input_type = tensor_job;
  using output_type = read_request;

  explicit coalesce(coalesce_options opt = {}) : opt_(opt) {
    if (opt_.max_read == 0) opt_.max_read = 1;
  }

  [[nodiscard]] task<void> run(channel<input_type>& in, channel<output_type>& out) {
    std::optional<read_request> cur;
    while (auto job = co_await in.receive()) {
      const tensor_ref& t = *job->tensor;
      if (!job->direct.empty()) {
        if (cur) co_await out.send(std::exchange(cur, std::nullopt).value());
        for (std::uint64_t off = 0; off < t.size; off += opt_.max_read) {
          const auto len = std::min(opt_.max_read, t.size - off);
          co_await out.send(make_request(t, off, len, job->direct.subspan(off, len)));
        }
        continue;
      }
      const bool fits = cur && cur->file == t.shard && cur->end() == t.offset && cur->length + t.size <= opt_.max_read;
      if (fits) {
        cur->pieces.push_back({&t, 0, t.size});
        cur->length += t.size;
        continue;
      }
      if (cur) co_await out.send(std::exchange(cur, std::nullopt).value());
      if (t.size <= opt_.max_read) {
        cur = make_request(t, 0, t.size, {});
        continue;
      }
      for (std::uint64_t off = 0; off < t.size; off += opt_.max_read) {
        const auto len = std::min(opt_.max_read, t.size - off);
        co_await out.send(make_request(t, off, len, {}));
      }
    }
    if (cur) co_await out.send(std::move(*cur));
  }

 private:
  // Built outside the coroutine body: g++ 12 rejects nested braced lists there.
  static read_request make_request(const tensor_ref& t, std::uint64_t off, std::uint64_t len, std::span<std::byte> direct) {
    read_request r;
    r.file = t.shard;
    r.offset = t.offset + off;
    r.length = len;
    r.pieces.push_back({&t, off, len});
    r.direct = direct;
    return r;
  }
  coalesce_options opt_;
};

}  // namespace sluice::inline v0
