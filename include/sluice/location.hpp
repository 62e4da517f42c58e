#pragma once
/// \file
/// Where a checkpoint is: a local path (a directory, a .safetensors file or
/// an index file), or a URI whose scheme a storage component registered
/// (`s3://bucket/prefix/` once a translation unit of the program includes
/// <sluice/s3/source.hpp> and links sluice::s3), or a catalog the
/// caller makes when the location is opened (an S3 catalog with its own
/// config: s3_location()). `checkpoint::open(location)` opens any of them;
/// the checkpoint then remembers its catalog, so `load()` and
/// `load_distributed()` read it whatever the storage.

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace sluice::inline v0 {

class catalog;

/// Makes the catalog of a URI of a registered scheme.
using catalog_factory = std::function<std::shared_ptr<catalog>(const std::string& uri)>;

class location {
 public:
  location(std::string uri_or_path) : uri_(std::move(uri_or_path)) {}  // NOLINT(google-explicit-constructor)
  location(const char* uri_or_path) : uri_(uri_or_path) {}             // NOLINT(google-explicit-constructor)
  location(std::string_view uri_or_path) : uri_(uri_or_path) {}        // NOLINT(google-explicit-constructor)
  location(const std::filesystem::path& path) : uri_(path.string()) {}  // NOLINT(google-explicit-constructor)
  /// `uri`, whose catalog `make()` returns when the location is opened.
  location(std::string uri, std::function<std::shared_ptr<catalog>()> make) : uri_(std::move(uri)), make_(std::move(make)) {}

  [[nodiscard]] const std::string& uri() const noexcept { return uri_; }
  /// "s3" for "s3://...", empty for a local path.
  [[nodiscard]] std::string scheme() const {
    const auto p = uri_.find("://");
    return p == std::string::npos ? std::string() : uri_.substr(0, p);
  }
  /// Whether it is a local path (no scheme, or file://).
  [[nodiscard]] bool local() const { return !make_ && (scheme().empty() || scheme() == "file"); }
  /// The local path (file:// stripped).
  [[nodiscard]] std::filesystem::path path() const { return scheme() == "file" ? uri_.substr(7) : uri_; }
  /// The catalog of a non-local location: the caller's factory, else the
  /// one registered for its scheme. Throws config_error naming the URI when
  /// no component registered the scheme.
  [[nodiscard]] std::shared_ptr<catalog> make_catalog() const;

 private:
  std::string uri_;
  std::function<std::shared_ptr<catalog>()> make_;
};

/// Registers the catalog factory of a URI scheme ("s3"); a storage component
/// calls it when a program links it (src/s3/register.cpp). Thread-safe; a
/// later registration of the same scheme replaces the earlier one. Returns
/// true (for static initialisers). An "s3://" location in a program without
/// sluice::s3 throws missing_component_error naming it.
bool register_scheme(const std::string& scheme, catalog_factory make);

}  // namespace sluice::inline v0
