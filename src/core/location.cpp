// URI schemes of storage components, and opening a location's catalog.

#include <sluice/location.hpp>

#include <map>
#include <mutex>

#include <fmt/format.h>

#include <sluice/error.hpp>
#include <sluice/source/concepts.hpp>

namespace sluice::inline v0 {

namespace {
struct scheme_registry {
  std::mutex m;
  std::map<std::string, catalog_factory> by_scheme;
};
scheme_registry& registry() {
  static scheme_registry r;  // first use, whichever static initialiser comes first
  return r;
}
}  // namespace

bool register_scheme(const std::string& scheme, catalog_factory make) {
  auto& r = registry();
  std::lock_guard lock(r.m);
  r.by_scheme[scheme] = std::move(make);
  return true;
}

std::shared_ptr<catalog> location::make_catalog() const {
  if (make_) return make_();
  const auto s = scheme();
  catalog_factory make;
  {
    auto& r = registry();
    std::lock_guard lock(r.m);
    if (auto it = r.by_scheme.find(s); it != r.by_scheme.end()) make = it->second;
  }
  if (!make) {
    if (s == "s3")
      throw missing_component_error("sluice::s3", "s3:// locations need the S3 component: link sluice::s3", {uri_});
    throw config_error(fmt::format("no storage is registered for {}:// locations", s), {uri_});
  }
  return make(uri_);
}

}  // namespace sluice::inline v0
