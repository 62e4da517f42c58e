// The distributed load for the Python package: the driver instantiated once,
// over any_sink (the costly translation unit, kept apart from the bindings so
// that the two compile in parallel).
#include "glue.hpp"

#include <sluice/distributed.hpp>

namespace sluice_py {

nlohmann::json run_distributed(const checkpoint& ck, const distributed_request& req, any_sink s, distributed_options opt) {
  const auto st = load_distributed(ck, req.topology, req.offload, req.who, s, std::move(opt));
  auto j = st.to_json();
  j["tensor_bytes"] = ck.tensor_bytes();
  const double gib = static_cast<double>(st.bytes_read + st.bytes_received) / double(1ull << 30);
  j["gib_per_s"] = st.seconds > 0 ? gib / st.seconds : 0.0;
  return j;
}

}  // namespace sluice_py
