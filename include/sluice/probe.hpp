#pragma once
/// \file
/// The probe: runs a checkpoint's tensors through a sink as metadata-only views
/// (`view_kind::metadata`, empty bytes: nothing is read, writes are
/// suppressed), in file order, and reports what the sink accepted. Run through
/// a `manifest::recorder`, it yields the load contract and the per-layer plan
/// from shard headers alone — the only bytes read are the ones
/// `checkpoint::open` read (checkpoint::header_bytes_read()).
///
/// Wiring for a command-line tool (`--probe`, `--contract-out FILE`):
/// \code
///   auto report = sluice::probe_contract(ck);           // or (ck, engine_loader)
///   sluice::print_probe_plan(std::cout, report.plan);         // --probe
///   sluice::manifest::save(report.contract, file);      // --contract-out FILE
/// \endcode

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sluice/checkpoint.hpp>
#include <sluice/manifest/contract.hpp>
#include <sluice/sink/concepts.hpp>
#include <sluice/tensor_view.hpp>

namespace sluice::inline v0 {

/// What a probe saw.
struct probe_result {
  std::vector<const tensor_ref*> seen;  ///< every tensor offered, in file order
  std::vector<bool> accepted;           ///< per `seen`: whether the sink accepted it
  std::uint64_t tensor_bytes = 0;       ///< bytes of the accepted tensors (what a load would place)
  std::uint64_t header_bytes_read = 0;  ///< bytes read to open the checkpoint
  std::uint64_t bytes_read = 0;         ///< tensor bytes read: always 0

  [[nodiscard]] std::size_t accepted_count() const noexcept {
    std::size_t n = 0;
    for (bool a : accepted) n += a ? 1 : 0;
    return n;
  }
};

/// Offers each of `ck`'s tensors to `s` as a metadata-only view, in file
/// order, then calls `s.finish()` if it has one. Reads nothing.
template <sink Sink>
probe_result probe(const checkpoint& ck, Sink& s) {
  probe_result r;
  r.header_bytes_read = ck.header_bytes_read();
  r.seen.reserve(ck.tensors().size());
  r.accepted.reserve(ck.tensors().size());
  for (const auto& t : ck.tensors()) {
    tensor_view v;
    v.tensor = &t;
    v.kind = view_kind::metadata;
    const bool ok = s.accept(std::move(v));
    r.seen.push_back(&t);
    r.accepted.push_back(ok);
    if (ok) r.tensor_bytes += t.size;
  }
  if constexpr (requires { s.finish(); }) s.finish();
  return r;
}

/// A loader that accepts every tensor onto the destination of its own name
/// (the contract of a plain load, when no engine loader is at hand).
struct accept_all {
  void operator()(tensor_view) const noexcept {}
};

/// One layer of a load plan.
struct probe_layer {
  std::int64_t layer = manifest::non_layer;
  std::size_t keys = 0;     ///< applications in the layer's contract
  std::size_t tensors = 0;  ///< distinct source tensors
  std::uint64_t bytes = 0;  ///< bytes of those tensors
};

/// A load plan: per layer (non-layer tensors first), what a load would apply.
struct probe_plan {
  std::vector<probe_layer> layers;
  std::size_t keys = 0;
  std::size_t tensors = 0;              ///< tensors offered
  std::size_t accepted = 0;             ///< tensors the loader accepted
  std::uint64_t bytes = 0;              ///< bytes of the accepted tensors
  std::uint64_t header_bytes_read = 0;
  std::uint64_t bytes_read = 0;         ///< tensor bytes read by the probe: 0

  /// {"layers":[{"layer":N|null,"keys":K,"tensors":T,"bytes":B}], "keys", "tensors",
  /// "accepted", "bytes", "header_bytes_read", "bytes_read"}.
  [[nodiscard]] nlohmann::json to_json() const {
    nlohmann::json ls = nlohmann::json::array();
    for (const auto& l : layers)
      ls.push_back({{"layer", l.layer == manifest::non_layer ? nlohmann::json(nullptr) : nlohmann::json(l.layer)},
                    {"keys", l.keys},
                    {"tensors", l.tensors},
                    {"bytes", l.bytes}});
    return {{"layers", std::move(ls)}, {"keys", keys},   {"tensors", tensors},
            {"accepted", accepted},   {"bytes", bytes}, {"header_bytes_read", header_bytes_read},
            {"bytes_read", bytes_read}};
  }
};

/// The plan of a contract and the probe that built it.
[[nodiscard]] inline probe_plan make_probe_plan(const manifest::contract& c, const probe_result& r) {
  probe_plan p;
  for (const auto& [l, lc] : c.layers()) {
    p.layers.push_back({l, lc.keys.size(), lc.sources().size(), lc.bytes});
    p.keys += lc.keys.size();
  }
  p.tensors = r.seen.size();
  p.accepted = r.accepted_count();
  p.bytes = r.tensor_bytes;
  p.header_bytes_read = r.header_bytes_read;
  p.bytes_read = r.bytes_read;
  return p;
}

/// What probe_contract() returns.
struct probe_report {
  probe_result result;
  manifest::contract contract;
  probe_plan plan;
};

/// Probes `ck` through a recorder around `loader` (default: accept_all) and
/// returns the probe, the contract and the plan. The loader sees metadata
/// views only and must not write.
template <manifest::recordable_loader F = accept_all>
[[nodiscard]] probe_report probe_contract(const checkpoint& ck, F loader = {}, manifest::recorder_options opt = {}) {
  manifest::recorder<F> rec(std::move(loader), std::move(opt));
  probe_report rep;
  rep.result = probe(ck, rec);
  rep.contract = rec.freeze();
  rep.plan = make_probe_plan(rep.contract, rep.result);
  return rep;
}

/// Prints the plan, one line per layer, then a total line.
inline void print_probe_plan(std::ostream& os, const probe_plan& p) {
  os << fmt::format("{:<20} {:>8} {:>8} {:>16}\n", "layer", "keys", "tensors", "bytes");
  for (const auto& l : p.layers)
    os << fmt::format("{:<20} {:>8} {:>8} {:>16}\n", l.layer == manifest::non_layer ? std::string("non-layer") : std::to_string(l.layer),
                      l.keys, l.tensors, l.bytes);
  os << fmt::format("{} layers, {} keys, {} of {} tensors accepted, {} bytes; header bytes read {}, tensor bytes read {}\n",
                    p.layers.size(), p.keys, p.accepted, p.tensors, p.bytes, p.header_bytes_read, p.bytes_read);
}

}  // namespace sluice::inline v0
