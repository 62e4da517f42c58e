#pragma once
/// \file
/// deliver_window: window_state → window_ticket. The place step of a
/// distributed load: calls the sink for every tensor of the window, in plan
/// order, the same calls on every rank — owners get their bytes
/// (`view_kind::bytes`, or `view_kind::device` with a device lane; under
/// TP > 1 their part, `tensor_view::part` saying which), non-owners a
/// `view_kind::placeholder` view (unless `placeholders` is off), every
/// local rank a `view_kind::shared` view of a shared table. Then it releases
/// the window and passes on its ticket (the window's stats; the driver hands
/// out the next window's ticket for it). A tensor whose bytes read_window left
/// to it (window_state::at_delivery: distributed_options::pieces_above) it
/// reads as it delivers it, through the load's slice reader: into the sink's
/// destination for it where the sink has one (one `view_kind::placed`
/// view), else in ordered pieces (`tensor_view::offset` within the part), a
/// batch of them at a time, each in a buffer of the window buffers that the
/// pieces after it take again once the sink lets go. A failed read of it is
/// this rank's failure, as a sink's is. A sink that throws does not stop the
/// stage: its error leaves in the ticket (window_ticket::failure), the driver
/// puts it in the next window's ticket, and that window's status exchange
/// reports it (or, after the last window, the driver's final one); from then
/// on the sink is not called again.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <vector>

#include <sluice/checkpoint.hpp>
#include <sluice/comm/device_lane.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/memory/lease.hpp>
#include <sluice/core/task.hpp>
#include <sluice/distributed/fault.hpp>
#include <sluice/distributed/slice_reader.hpp>
#include <sluice/distributed/window.hpp>
#include <sluice/memory/shared_host.hpp>
#include <sluice/memory/window_buffers.hpp>
#include <sluice/policy/plan.hpp>
#include <sluice/sink/any_sink.hpp>
#include <sluice/stages/concepts.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0::detail {

// The part of `e` rank `r` keeps, as its views say it: the split's block, or
// a grouped split's block of every run (plan_entry::groups).
[[nodiscard]] inline tensor_part part_view(const policy::load_plan& plan, const policy::plan_entry& e, policy::rank_t r) {
  if (e.split == policy::tp_split::none) return {};
  const auto dim = e.groups ? e.group_dim : e.split == policy::tp_split::rows ? 0u : 1u;
  return {dim, static_cast<std::uint32_t>(plan.part_of(e, r)), static_cast<std::uint32_t>(plan.parts(e)),
          e.groups ? e.groups : 1u};
}

class deliver_window : public pipeable {
 public:
  using input_type = window_state;
  using output_type = window_ticket;  ///< the window delivered

  /// `segment`: the node's shared segment (shared tables' views), or
  /// `tables`: by plan entry, each shared table's view of the page cache
  /// (empty: the segment's); `placeholders`: distributed_options::placeholders.
  /// `reader`, `buffers`: where the tensors read at delivery are read
  /// through and into (the load's own: read_window's reader, whose batches
  /// may overlap, and window buffers), in pieces as `delivery` says.
  deliver_window(const checkpoint& ck, const policy::load_plan& plan, policy::rank_t me, const memory::shared_host& segment,
                 const std::vector<lease>& tables, any_sink sink, bool placeholders, slice_reader& reader,
                 window_buffers& buffers, delivery_reads delivery)
      : ck_(&ck), plan_(&plan), me_(me), segment_(&segment), tables_(&tables), sink_(sink), placeholders_(placeholders),
        reader_(&reader), buffers_(&buffers), piece_(std::max<std::uint64_t>(delivery.piece, 4096)),
        depth_(std::max<std::size_t>(delivery.depth, 1)) {}

  [[nodiscard]] task<void> run(channel<input_type>& in, channel<output_type>& out) {
    for (;;) {
      auto ws = co_await in.receive();
      if (!ws) break;
      // A failure no status exchange reported (its window had none) goes on
      // with the ticket: the next window's reads stop, and the next status
      // exchange reports it.
      window_ticket t{ws->window, ws->failure, ws->stats};
      co_await deliver(*ws, t);
      ws.reset();  // the window's buffers, before read_window reuses them
      co_await out.send(std::move(t));
    }
  }

 private:
  task<void> deliver(const window_state& ws, window_ticket& t) {
    const auto& plan = *plan_;
    auto& st = t.stats;
    fault_point("delivery", me_);
    if (failed_) co_return;  // the load fails at the next status exchange: the sink is not called again
    const auto d0 = std::chrono::steady_clock::now();
    try {
      for (std::size_t i = ws.begin; i < ws.end; ++i) {
        const auto& e = plan.entries[i];
        tensor_view v;
        v.tensor = &ck_->tensors()[e.index];
        if (e.shared() && !tables_->empty()) {  // the node's one copy is its page cache
          v.kind = view_kind::shared;
          v.bytes = (*tables_)[i].bytes();
          v.hold = (*tables_)[i];
          v.host_destined = true;
          st.shared_views += 1;
        } else if (e.shared()) {
          v.kind = view_kind::shared;
          v.bytes = segment_->bytes().subspan(e.shared_offset, e.info.size);
          v.hold = lease(segment_->keep(), segment_->bytes());  // the whole segment: a sink registers it once
          v.host_destined = true;
          st.shared_views += 1;
        } else if (e.owners.contains(me_) && !ws.at_delivery[i - ws.begin].empty()) {
          v.kind = view_kind::bytes;
          v.host_destined = e.owner_destination == policy::destination::host;
          v.part = part_view(plan, e, me_);
          st.owned += 1;
          st.kept += plan.kept_bytes(e);
          st.tensors += 1;
          st.accepted += co_await read_and_deliver(e, ws.at_delivery[i - ws.begin], std::move(v)) ? 1 : 0;
          continue;
        } else if (e.owners.contains(me_)) {
          const auto& L = ws.lanes[ws.lane_of[i - ws.begin]];
          const bool dev = L.which == window_lane::device;
          v.kind = dev ? view_kind::device : view_kind::bytes;
          v.bytes = ws.kept_at[i - ws.begin];
          v.hold = dev ? L.dev_kept : ws.views[i - ws.begin] ? ws.views[i - ws.begin] : L.kept;
          v.host_destined = e.owner_destination == policy::destination::host;
          v.part = part_view(plan, e, me_);
          st.owned += 1;
          st.kept += plan.kept_bytes(e);
          st.device_views += dev ? 1 : 0;
        } else if (placeholders_) {
          v.kind = view_kind::placeholder;
          st.placeholders += 1;
        } else {
          continue;
        }
        st.tensors += 1;
        st.accepted += sink_.accept(std::move(v)) ? 1 : 0;
      }
    } catch (...) {
      failed_ = true;
      t.failure = std::current_exception();
    }
    st.deliver_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
  }

  // Reads this rank's part of `e` (`reads`: its extents, in file order,
  // covering it) and hands it to the sink as `v` says (its tensor, kind and
  // part set): into the sink's destination for a whole tensor where it has
  // one, else in pieces. Whether the sink accepted it (its last piece).
  task<bool> read_and_deliver(const policy::plan_entry& e, const std::vector<byte_extent>& reads, tensor_view v) {
    const auto begin = plan_->kept_begin(e, me_);
    if (e.split == policy::tp_split::none) {
      if (const auto dst = sink_.direct_destination(*v.tensor); !dst.empty() && dst.size() == v.tensor->size) {
        auto into = reads;
        for (auto& x : into) x.direct = dst.subspan(x.offset, x.size);
        co_await reader_->read(into);
        v.kind = view_kind::placed;
        v.bytes = dst;
        co_return sink_.accept(std::move(v));
      }
    }
    // Pieces of at most piece_ bytes, none across two of its reads (whose
    // page-cache rules may differ), read depth_ at a time.
    std::vector<byte_extent> pieces;
    for (const auto& x : reads)
      for (std::uint64_t at = 0; at < x.size; at += piece_) {
        auto p = x;
        p.offset += at, p.size = std::min(piece_, x.size - at);
        pieces.push_back(p);
      }
    bool accepted = true;
    std::vector<lease> held;
    for (std::size_t k = 0; k < pieces.size(); k += depth_) {
      const auto n = std::min(depth_, pieces.size() - k);
      std::vector<byte_extent> batch(pieces.begin() + static_cast<std::ptrdiff_t>(k),
                                     pieces.begin() + static_cast<std::ptrdiff_t>(k + n));
      held.clear();
      for (auto& x : batch) {
        held.push_back(buffers_->get(piece_));  // one size: the next batch takes back what the sink let go
        x.direct = held.back().bytes().first(x.size);
      }
      co_await reader_->read(batch);
      for (std::size_t j = 0; j < n; ++j) {
        auto piece = v;
        piece.offset = batch[j].offset - begin;
        piece.bytes = batch[j].direct;
        piece.hold = std::move(held[j]);
        accepted = sink_.accept(std::move(piece));
      }
    }
    co_return accepted;
  }

  const checkpoint* ck_;
  const policy::load_plan* plan_;
  policy::rank_t me_;
  const memory::shared_host* segment_;
  const std::vector<lease>* tables_;
  any_sink sink_;
  bool placeholders_;
  slice_reader* reader_;
  window_buffers* buffers_;
  std::uint64_t piece_;
  std::size_t depth_;
  bool failed_ = false;  // the sink threw: it is not called again
};

}  // namespace sluice::inline v0::detail
