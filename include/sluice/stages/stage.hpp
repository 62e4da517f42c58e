#pragma once
/// \file
/// stage: a filled slot → tensor views. Each view borrows its bytes from the
/// slot and holds a lease on it; the slot returns to the pool when the last
/// view is released. A tensor split over several requests is delivered as
/// ordered pieces, or — with `whole_tensors` — assembled into an owned buffer
/// and delivered once.

#include <cstring>
#include <optional>

#include <sluice/core/channel.hpp>
#include <sluice/memory/lease.hpp>
#include <sluice/core/task.hpp>
#include <sluice/stages/concepts.hpp>
#include <sluice/stages/fetch.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0 {

struct stage_options {
  bool whole_tensors = false;  ///< assemble multi-piece tensors before delivering them
};

class stage : public pipeable {
 public:
  using input_type = fetched;
  using output_type = tensor_view;

  explicit stage(stage_options opt = {}) : opt_(opt) {}

  [[nodiscard]] task<void> run(channel<input_type>& in, channel<output_type>& out) {
    while (auto f = co_await in.receive()) {
      const auto& req = f->request;
      for (const auto& p : req.pieces) {
        const auto pos = p.tensor->offset + p.tensor_offset - req.offset;
        tensor_view v;
        v.tensor = p.tensor;
        v.offset = p.tensor_offset;
        v.bytes = std::span<const std::byte>(f->data).subspan(pos, p.length);
        v.hold = f->hold;
        v.kind = req.direct.empty() ? view_kind::bytes : view_kind::placed;
        if (opt_.whole_tensors && v.kind == view_kind::bytes && !v.whole()) {
          if (auto whole = assemble(std::move(v))) co_await out.send(std::move(*whole));
          continue;
        }
        co_await out.send(std::move(v));
      }
    }
  }

 private:
  // Pieces of one tensor arrive in order and are not interleaved with others.
  std::optional<tensor_view> assemble(tensor_view piece) {
    if (piece.first()) {
      assembling_ = tensor_view{};
      assembling_.tensor = piece.tensor;
      assembling_.hold = lease::allocate(piece.tensor->size);
      assembling_.bytes = assembling_.hold.bytes();
    }
    std::memcpy(assembling_.hold.bytes().data() + piece.offset, piece.bytes.data(), piece.bytes.size());
    if (!piece.last()) return std::nullopt;
    return std::exchange(assembling_, tensor_view{});
  }

  stage_options opt_;
  tensor_view assembling_;
};

}  // namespace sluice::inline v0
