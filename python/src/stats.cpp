// The library's stats as Python dicts: nlohmann::json (load_stats::to_json,
// the distributed driver's summary) converted value by value, and what a
// local load adds to it (the source, the budget, CPU time, peak RSS).
#include "bindings.hpp"

#include <sys/resource.h>

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
  // Leaked on purpose: a static py::object would be released after the interpreter is gone.
  static auto* loads = new py::object(py::module_::import("json").attr("loads"));
  return (*loads)(j.dump());
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
