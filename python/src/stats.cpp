// The library's stats as Python dicts: nlohmann::json (load_stats::to_json,
// the distributed driver's summary) converted value by value, and what a
// local load adds to it (the source, the budget, CPU time, peak RSS).
#include "bindings.hpp"

#include <sys/resource.h>

#include <cmath>

#include <nlohmann/json.hpp>

namespace sluice_py {

namespace {

std::uint64_t peak_rss() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<std::uint64_t>(u.ru_maxrss) * 1024;
}

}  // namespace

py::object to_py(const nlohmann::json& j) {
  using t = nlohmann::json::value_t;
  switch (j.type()) {
    case t::null:
    case t::discarded: return py::none();
    case t::boolean: return py::bool_(j.get<bool>());
    case t::number_integer: return py::int_(j.get<std::int64_t>());
    case t::number_unsigned: return py::int_(j.get<std::uint64_t>());
    case t::number_float: {
      // why: the stats once crossed as JSON text, where nlohmann writes NaN and
      // infinities as null; callers json.dump the dict, which must stay valid JSON.
      const double d = j.get<double>();
      return std::isfinite(d) ? py::object(py::float_(d)) : py::object(py::none());
    }
    case t::string: return lenient_str(j.get_ref<const std::string&>());
    case t::binary: {
      const auto& b = j.get_binary();
      return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
    }
    case t::array: {
      py::list l(j.size());
      std::size_t i = 0;
      for (const auto& e : j) l[i++] = to_py(e);
      return l;
    }
    case t::object: {
      py::dict d;
      for (const auto& [k, v] : j.items()) d[lenient_str(k)] = to_py(v);
      return d;
    }
  }
  return py::none();
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

py::dict local_stats(const checkpoint& ck, const load_stats& st, const load_options& opt, double cpu) {
  const double gib = static_cast<double>(st.tensor_bytes) / double(1ull << 30);
  nlohmann::json j = st.to_json();  // the names sluice-load --json prints
  j["source"] = ck.location();
  j["shards"] = ck.shards().size();
  j["staging"]["budget"] = opt.staging_budget;
  j["cpu_seconds"] = cpu;
  j["cpu_seconds_per_gib"] = gib > 0 ? cpu / gib : 0;
  j["peak_rss_bytes"] = peak_rss();
  return py::dict(to_py(j));
}

}  // namespace sluice_py
