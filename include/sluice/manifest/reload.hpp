#pragma once
/// \file
/// Layerwise reload against a contract (RL weight sync, hot reload).
///
/// A `reload_session` takes an update stream — a checkpoint or a subset of one
/// loaded through `sluice::load` / `load_async` (the session is a sink), or
/// tensors the engine pushes — and copies each incoming tensor into memory it
/// owns (a view's lease is never kept, so staging slots and window buffers
/// recycle at once), except a whole `view_kind::shared` view: the node's one
/// copy of an offloaded table, which the session keeps as it is (its lease
/// holds the segment, not a slot) and publishes as a shared view, so the local
/// ranks do not each copy the node's tables. A
/// tensor is routed to the layers whose contract keys name it as their source.
/// When every key of a layer's contract has arrived at least once, the session
/// *publishes* the layer: it offers the layer's tensors to the engine's loader
/// (the same signature as during the initial load), calls the engine's publish
/// hook, and frees the layer's buffers. Buffered memory is therefore bounded by
/// this rank's share of the layers still incomplete: the contract's bytes of
/// the layers that received a tensor and are not yet published (plus extras
/// the loader accepts), not by the model, and not by what the update offers.
///
/// Extras never block a layer and are absorbed, each with a warning naming it:
/// a tensor arriving twice, an application the loader makes outside the
/// contract. A tensor no key names is offered to a loader that can decline
/// when its first piece arrives, as a probe view (`view_kind::metadata`, no
/// bytes): declined, it is dropped silently and nothing of it is buffered (an
/// expert-parallel rank offered every expert declines the ones it does not
/// own, as in the initial load; buffering them until their layer publishes
/// would hold about EP times the rank's share); accepted, it is buffered and
/// offered again with its bytes beside its layer's tensors (an extra
/// application, warned). Distributed placeholders (`view_kind::placeholder`)
/// and probe views carry no bytes and are never buffered.
///
/// A tensor outside the contract offered to a loader that cannot decline
/// (returns void) is a contract_error, checked at two points:
/// - an update read from a checkpoint with `reload(checkpoint)` (or checked
///   with `check_update(checkpoint)` before a `load_async`) is checked as a
///   whole before any byte is read: the error names every such tensor and its
///   file, and nothing is buffered, offered to the loader or published;
/// - a tensor pushed by the engine (`push`), or a view handed to `accept` (as
///   when `sluice::load(ck, session)` drives the session as a plain sink), is
///   checked on its own first piece: nothing of it is buffered or written, but
///   layers the update completed before it were already published.
///
/// An incomplete layer is never published: the publish hook runs only once
/// the loader re-applied every key of the layer's contract. A layer whose
/// loader did not re-apply some key (it declined a contract tensor, or applied
/// it under another key) is not published: contract_error names the layer and
/// each key, the layer keeps its buffers and those keys stay missing (a later
/// copy of their tensor retries the layer), and `finish()` reports it.
///
/// Who ends an update: `finish()` ends it. `sluice::load()` (and `reload()`,
/// `probe()`, the distributed loads) call the sink's `finish()` after the last
/// view, so an update read through them is already ended when they return; an
/// engine that pushes tensors itself calls `finish()`. Calling `finish()` again
/// (an engine's own "finish weight update" after `load()`) is harmless: an
/// update that received nothing since the last `finish()` is *empty*, and
/// `finish()` on it is a no-op that returns false, checks nothing and keeps the
/// previous update's result in `last_incomplete()`. An update that received
/// anything (a metadata placeholder counts) is a real update: `finish()` returns
/// true, a layer whose contract is not met is never published, and
/// contract_error names each such layer and its missing keys.
/// A tensor whose pieces do not add up to its size when its last piece
/// arrives (a piece missing or overlapping) is a contract_error naming the
/// tensor and both byte counts; nothing of it is kept.
///
/// Routing trusts the loader to be deterministic: the keys a tensor satisfies
/// are the ones it produced in the initial load. Keys were grouped into layers
/// by their *destination* name, so a source tensor counts towards the layers
/// its keys' destinations belong to, whatever its own name (`blk3.x` loaded
/// into `model.layers.5.y` completes layer 5). An extra tensor is routed to
/// the layer its own name matches with the contract's layer pattern (dropped
/// with a warning when that layer is absent or already published).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <sluice/checkpoint.hpp>
#include <sluice/memory/lease.hpp>
#include <sluice/error.hpp>
#include <sluice/format/dtype.hpp>
#include <sluice/manifest/contract.hpp>
#include <sluice/sink/concepts.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0::manifest {

/// Options of a reload session.
struct reload_options {
  /// Receives each warning (extras, duplicates); empty: printed to stderr.
  std::function<void(const std::string&)> warn;
  /// true: every layer of the contract must be met by the update; false: only
  /// the layers the update touched (a partial update of some layers).
  bool require_all_layers = true;
};

/// What a reload session did (accumulated over updates).
struct reload_stats {
  std::uint64_t updates = 0;              ///< updates ended by finish() (empty ones not counted)
  std::uint64_t tensors = 0;              ///< complete tensors received
  std::uint64_t layers_published = 0;
  std::uint64_t extras = 0;               ///< extras absorbed (each warned)
  std::uint64_t declined = 0;             ///< offers the loader declined (extras on arrival, before buffering)
  std::uint64_t buffered_bytes = 0;       ///< bytes buffered now
  std::uint64_t peak_buffered_bytes = 0;  ///< the most bytes buffered at once
};

/// The default publish hook: does nothing.
struct no_publish_hook {
  void operator()(const layer_contract&) const noexcept {}
};

/// See the file comment. `OnPublish` is called as `on_publish(layer_contract)`
/// after the layer's tensors were offered to the loader and it re-applied
/// every key of the layer's contract, before its buffers are freed; never for
/// an incomplete layer.
template <recordable_loader F, class OnPublish = no_publish_hook>
  requires std::invocable<OnPublish&, const layer_contract&>
class reload_session {
 public:
  /// Pieces are copied as they come: no assembly copy in the stage.
  static constexpr bool whole_tensors = false;
  /// True when the loader can decline (decided from its signature).
  static constexpr bool can_decline = can_decline_v<F>;

  reload_session(contract expected, F loader, OnPublish on_publish = {}, reload_options opt = {})
      : contract_(std::move(expected)),
        grouping_(contract_.layer_pattern()),
        loader_(std::move(loader)),
        on_publish_(std::move(on_publish)),
        opt_(std::move(opt)) {
    for (const auto& [l, lc] : contract_.layers())
      for (const auto& k : lc.keys) {
        auto& r = routes_[k.source];
        if (r.empty() || r.back() != l) r.push_back(l);
      }
    begin_update();
  }

  reload_session(const reload_session&) = delete;
  reload_session& operator=(const reload_session&) = delete;

  /// Sink: copies the view's bytes (a whole tensor or an ordered piece) and
  /// publishes every layer this completes. Returns false for an extra the
  /// loader declined or that was dropped, and for views without bytes (a
  /// probe's, a placeholder: nothing to buffer). Throws contract_error for a
  /// tensor outside the contract when the loader cannot decline (on its first
  /// piece), for a piece that overruns its tensor, for a tensor whose pieces do
  /// not add up to its size at its last piece, and for a layer the loader did
  /// not fully re-apply (see the file comment); the offending tensor's buffer is
  /// freed.
  bool accept(tensor_view v) {
    require_host_view(v, "reload session");
    received_ = true;  // the update is not empty, whatever becomes of this view
    if (!v.carries_data()) return false;
    const std::string& name = v.name();
    if (v.first()) {
      if (auto it = partial_.find(name); it != partial_.end()) {
        warn(fmt::format("tensor '{}' restarted before its last piece; the earlier piece is dropped", name));
        release(it->second.buf);
        partial_.erase(it);
      }
      auto route = route_of(v);  // throws for a void loader and a tensor outside the contract
      if (route.layers.empty()) return false;
      auto b = std::make_shared<buffer>();
      b->ref = *v.tensor;
      b->part = v.part;
      b->size = v.part_size();
      if (v.kind == view_kind::shared && v.whole()) {
        // why: the node's one copy of an offloaded table, which this load
        // wrote and the view's lease keeps mapped (never a staging slot):
        // a copy would make every local rank hold its own until the layer
        // publishes. The buffer keeps the view; it costs this rank nothing.
        b->kept_shared = true;
        b->shared = v.bytes;
        b->data = std::move(v.hold);
        b->filled = b->size;
        complete(pending{std::move(b), std::move(route)});
        return true;
      }
      b->data = lease::allocate(static_cast<std::size_t>(b->size));
      stats_.buffered_bytes += b->size;
      stats_.peak_buffered_bytes = std::max(stats_.peak_buffered_bytes, stats_.buffered_bytes);
      partial_.emplace(name, pending{std::move(b), std::move(route)});
    }
    auto it = partial_.find(name);
    if (it == partial_.end()) return false;  // a piece of a dropped tensor
    auto& b = *it->second.buf;
    if (v.offset + v.bytes.size() > b.size) {
      const auto detail = fmt::format("a piece at offset {} ({} bytes) overruns the tensor's size {}; the tensor is dropped",
                                      v.offset, v.bytes.size(), b.size);
      drop_partial(it);
      throw contract_error(detail, {"", name});
    }
    if (!v.bytes.empty()) std::memcpy(b.data.bytes().data() + v.offset, v.bytes.data(), v.bytes.size());
    b.filled += v.bytes.size();
    const bool done = v.last();
    v = tensor_view{};  // drop the lease before publishing (it may be a staging slot)
    if (done) {
      // why: last() only says this piece ends at the tensor's end; a piece
      // missing before it (short) or pieces overlapping (overlong) would
      // otherwise publish a tensor with bytes nobody wrote.
      if (b.filled != b.size) {
        const auto detail = fmt::format("its pieces held {} bytes at its last piece, but the tensor has {} ({}); the tensor is dropped",
                                        b.filled, b.size, b.filled < b.size ? "a piece is missing" : "pieces overlap");
        drop_partial(it);
        throw contract_error(detail, {"", name});
      }
      auto p = std::move(it->second);
      partial_.erase(it);
      complete(std::move(p));
    }
    return true;
  }

  /// Checks an update about to be read from `update` against the contract,
  /// before any byte of it is read. For a loader that cannot decline, every
  /// tensor of `update` that no contract key names is an error: throws
  /// contract_error naming each such tensor and its file (a single one is the
  /// error's tensor and file). For a loader that can decline there is nothing
  /// to check (extras are declined or absorbed when they arrive). Changes
  /// nothing in the session.
  void check_update(const checkpoint& update) const {
    if constexpr (!can_decline) {
      std::vector<const tensor_ref*> outside;
      for (const auto& t : update.tensors())
        if (!routes_.contains(t.name)) outside.push_back(&t);
      if (outside.empty()) return;
      const auto file_of = [&update](const tensor_ref& t) {
        return t.shard < update.shards().size() ? update.shards()[t.shard].uri : std::string();
      };
      if (outside.size() == 1)
        throw contract_error("the update holds a tensor that is not in the contract and the loader cannot decline it "
                             "(it returns void); nothing was read or written",
                             {file_of(*outside.front()), outside.front()->name});
      std::string list;
      for (std::size_t i = 0; i < outside.size(); ++i)
        list += fmt::format("{}tensor '{}' in file '{}'", i ? "; " : "", outside[i]->name, file_of(*outside[i]));
      throw contract_error(fmt::format("the update holds {} tensors that are not in the contract and the loader cannot "
                                       "decline them (it returns void); nothing was read or written: {}",
                                       outside.size(), list));
    }
  }

  /// Reads the update `update` into the session with `sluice::load` after
  /// check_update(update): an update a loader that cannot decline would have to
  /// refuse part-way is refused before any byte is read. `args` are the rest of
  /// load()'s arguments (none, a load_options, or a staging_pool& and a
  /// load_options); load() calls finish() after the last tensor. Returns
  /// load()'s load_stats. The blocking load() is in <sluice/load_file.hpp>
  /// (the sluice::uring component): include it where this is called. For
  /// another source, call check_update() and then load_async().
  template <class... Args>
  auto reload(const checkpoint& update, Args&&... args) {
    check_update(update);
    // why: unqualified and dependent on *this, so it is looked up (by ADL, in
    // sluice::) where reload() is instantiated: this header stays free of the
    // io_uring component.
    return load(update, *this, std::forward<Args>(args)...);
  }

  /// Pushes a tensor the engine holds (copied); same rules as accept(). The
  /// engine pushes one tensor at a time, so there is no update to check up
  /// front: a tensor outside the contract for a loader that cannot decline is
  /// refused here, on its own (nothing of it is buffered or written; layers
  /// completed before it stay published).
  bool push(std::string name, format::dtype type, std::vector<std::uint64_t> shape, std::span<const std::byte> bytes) {
    tensor_ref ref;
    ref.name = name;
    ref.source_name = std::move(name);
    ref.type = type;
    ref.shape = std::move(shape);
    ref.size = bytes.size();
    tensor_view v;
    v.tensor = &ref;
    v.bytes = bytes;
    return accept(std::move(v));
  }

  /// Ends the update. An empty update (nothing was accepted or pushed since
  /// the last finish(), as when the engine calls finish() after load() already
  /// did) is a no-op: returns false, checks nothing, and last_incomplete()
  /// keeps the previous update's result. Otherwise: layers whose contract is
  /// not met (keys that never arrived, or that the loader did not re-apply
  /// when the layer's publish was refused) are not published and their
  /// buffers are freed; throws contract_error naming each of them and its
  /// missing keys, else returns true. Either way the session then takes the
  /// next update.
  bool finish() {
    if (!received_) return false;
    received_ = false;
    ++stats_.updates;
    for (auto& [name, p] : partial_) {
      warn(fmt::format("tensor '{}' ended after {} of {} bytes; dropped", name, p.buf->filled, p.buf->size));
      release(p.buf);
    }
    partial_.clear();
    last_incomplete_.clear();
    for (auto& [l, st] : layers_) {
      if (st.published) continue;
      for (auto& e : st.entries) release(e);
      st.entries.clear();
      if (opt_.require_all_layers || st.touched)
        last_incomplete_.emplace(l, std::vector<application_key>(st.remaining.begin(), st.remaining.end()));
    }
    begin_update();
    if (last_incomplete_.empty()) return true;
    std::string msg = fmt::format("reload incomplete: {} {} did not meet {} contract and {} not published:",
                                  last_incomplete_.size(), last_incomplete_.size() == 1 ? "layer" : "layers",
                                  last_incomplete_.size() == 1 ? "its" : "their",
                                  last_incomplete_.size() == 1 ? "was" : "were");
    for (const auto& [l, keys] : last_incomplete_) {
      msg += fmt::format(" {} is missing {} {} [", layer_name(l), keys.size(), keys.size() == 1 ? "key" : "keys");
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (i) msg += "; ";
        msg += to_string(keys[i]);
      }
      msg += "];";
    }
    msg.pop_back();
    throw contract_error(msg);
  }

  /// Keys still missing per unpublished layer of the current update.
  [[nodiscard]] std::map<std::int64_t, std::vector<application_key>> missing() const {
    std::map<std::int64_t, std::vector<application_key>> m;
    for (const auto& [l, st] : layers_)
      if (!st.published) m.emplace(l, std::vector<application_key>(st.remaining.begin(), st.remaining.end()));
    return m;
  }
  /// The incomplete layers (and their missing keys) of the last finish().
  [[nodiscard]] const std::map<std::int64_t, std::vector<application_key>>& last_incomplete() const noexcept {
    return last_incomplete_;
  }
  /// Whether the layer was published in the current update.
  [[nodiscard]] bool published(std::int64_t layer) const {
    auto it = layers_.find(layer);
    return it != layers_.end() && it->second.published;
  }
  [[nodiscard]] const reload_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] const std::vector<std::string>& warnings() const noexcept { return warnings_; }
  [[nodiscard]] const contract& expected() const noexcept { return contract_; }
  [[nodiscard]] F& loader() noexcept { return loader_; }

 private:
  struct buffer {
    tensor_ref ref;
    tensor_part part;        ///< a TP part (a distributed load under TP > 1) or the whole tensor
    std::uint64_t size = 0;  ///< bytes expected: the part's
    lease data;                          ///< owned bytes, or the shared segment `shared` lies in
    std::span<const std::byte> shared;   ///< a kept shared view's bytes (nothing buffered)
    bool kept_shared = false;            ///< `shared` is the tensor (data: its segment), not `data`
    std::uint64_t filled = 0;
    unsigned holders = 0;  ///< layers holding it (bytes are released at 0)
    bool released = false;
  };
  struct route {
    std::vector<std::int64_t> layers;
    bool extra = false;
  };
  struct pending {
    std::shared_ptr<buffer> buf;
    route to;
  };
  struct layer_state {
    std::set<application_key> remaining;
    std::vector<std::shared_ptr<buffer>> entries;  ///< arrival order
    std::vector<bool> extra;                       ///< per entry: outside the contract
    bool published = false;
    bool touched = false;
  };

  void begin_update() {
    layers_.clear();
    for (const auto& [l, lc] : contract_.layers()) layers_[l].remaining = lc.keys;
  }

  void warn(std::string msg) {
    if (opt_.warn)
      opt_.warn(msg);
    else
      fmt::print(stderr, "sluice: warning: {}\n", msg);
    warnings_.push_back(std::move(msg));
  }

  /// Forgets a tensor whose pieces are still arriving and frees its bytes.
  void drop_partial(typename std::map<std::string, pending, std::less<>>::iterator it) {
    release(it->second.buf);
    partial_.erase(it);
  }

  void release(const std::shared_ptr<buffer>& b) {
    if (b->holders > 0) --b->holders;
    if (b->holders == 0 && !b->released) {
      b->released = true;
      if (!b->kept_shared) stats_.buffered_bytes -= b->size;  // a kept shared view buffered nothing
      b->data.reset();
    }
  }

  route route_of(const tensor_view& v) {
    const std::string& name = v.name();
    if (auto it = routes_.find(name); it != routes_.end()) return {it->second, false};
    if constexpr (!can_decline) {
      // why: one tensor at a time (push, or a plain load() into the session);
      // layers completed earlier in the update stay published. reload() and
      // check_update() check a whole checkpoint before anything is read.
      throw contract_error(fmt::format("tensor '{}' is not in the contract and the loader cannot decline it (it returns "
                                       "void); nothing of it was written",
                                       name),
                           {"", name});
    } else {
      // why: decided now, before a byte is buffered (see the file comment):
      // what the loader would decline never costs memory. The probe's
      // applications are not kept; an accepted extra is offered again, with
      // its bytes, when its layer publishes.
      tensor_view probe;
      probe.tensor = v.tensor;
      probe.part = v.part;
      probe.host_destined = v.host_destined;
      probe.kind = view_kind::metadata;
      std::vector<application_key> would_apply;
      if (!apply_loader(loader_, std::move(probe), would_apply)) {
        ++stats_.declined;
        return {};
      }
      const auto l = grouping_.layer_of(name);
      auto it = layers_.find(l);
      if (it == layers_.end() || it->second.published) {
        warn(fmt::format("extra tensor '{}' is not in the contract and {} {}; dropped", name, layer_name(l),
                         it == layers_.end() ? "is not in the contract" : "was already published"));
        ++stats_.extras;
        return {};
      }
      return {{l}, true};
    }
  }

  void complete(pending p) {
    ++stats_.tensors;
    const auto& name = p.buf->ref.name;
    for (const auto l : p.to.layers) {
      auto& st = layers_.at(l);
      if (st.published) {
        warn(fmt::format("tensor '{}' arrived again after {} was published; ignored", name, layer_name(l)));
        ++stats_.extras;
        continue;
      }
      for (std::size_t i = 0; i < st.entries.size(); ++i)
        if (st.entries[i]->ref.name == name) {
          warn(fmt::format("tensor '{}' arrived twice for {}; the later copy replaces the earlier", name, layer_name(l)));
          ++stats_.extras;
          release(st.entries[i]);
          st.entries.erase(st.entries.begin() + static_cast<std::ptrdiff_t>(i));
          st.extra.erase(st.extra.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
      st.entries.push_back(p.buf);
      st.extra.push_back(p.to.extra);
      ++p.buf->holders;
      st.touched = true;
      if (!p.to.extra)
        std::erase_if(st.remaining, [&](const application_key& k) { return k.source == name; });
    }
    if (p.buf->holders == 0) release(p.buf);
    for (const auto l : p.to.layers) {
      auto& st = layers_.at(l);
      if (!st.published && st.remaining.empty()) publish(l, st);
    }
  }

  void publish(std::int64_t l, layer_state& st) {
    const auto& lc = *contract_.layer(l);
    std::vector<application_key> applied;
    for (auto& e : st.entries) {
      tensor_view v;
      v.tensor = &e->ref;
      const bool shared = e->kept_shared;
      v.bytes = shared ? e->shared : e->data.bytes();
      v.hold = e->data;
      v.kind = shared ? view_kind::shared : view_kind::bytes;
      v.host_destined = shared;
      v.part = e->part;
      if (!apply_loader(loader_, std::move(v), applied)) ++stats_.declined;
    }
    std::set<application_key> done(applied.begin(), applied.end());
    for (const auto& k : done)
      if (!lc.keys.contains(k) && !contract_.contains(k)) {
        warn(fmt::format("extra application '{}' outside the contract absorbed in {}", to_string(k), layer_name(l)));
        ++stats_.extras;
      }
    std::vector<application_key> not_applied;
    for (const auto& k : lc.keys)
      if (!done.contains(k)) not_applied.push_back(k);
    if (!not_applied.empty()) {
      // why: the publish hook is where the engine switches to the new weights;
      // a layer missing keys must never reach it. The keys stay missing (and
      // the buffers held) so finish() reports the layer, or a later copy of
      // their tensor retries it.
      st.remaining.insert(not_applied.begin(), not_applied.end());
      std::string keys;
      for (std::size_t i = 0; i < not_applied.size(); ++i) {
        if (i) keys += "; ";
        keys += to_string(not_applied[i]);
      }
      throw contract_error(fmt::format("{} was not published: the loader did not re-apply {} contract {} on reload: [{}]",
                                       layer_name(l), not_applied.size(), not_applied.size() == 1 ? "key" : "keys", keys));
    }
    on_publish_(lc);
    for (auto& e : st.entries) release(e);
    st.entries.clear();
    st.extra.clear();
    st.published = true;
    ++stats_.layers_published;
  }

  contract contract_;
  layer_grouping grouping_;
  F loader_;
  OnPublish on_publish_;
  reload_options opt_;
  std::map<std::string, std::vector<std::int64_t>, std::less<>> routes_;  ///< source → layers of its keys
  std::map<std::int64_t, layer_state> layers_;
  std::map<std::string, pending, std::less<>> partial_;  ///< tensors whose pieces are still arriving
  std::map<std::int64_t, std::vector<application_key>> last_incomplete_;
  bool received_ = false;  ///< the current update received a view (it is not empty)
  std::vector<std::string> warnings_;
  reload_stats stats_;
};

static_assert(sink<reload_session<bool (*)(tensor_view)>>);

}  // namespace sluice::inline v0::manifest
