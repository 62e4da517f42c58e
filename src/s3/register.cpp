// Linking sluice::s3 registers the s3:// scheme: "s3://bucket/prefix/"
// locations open an s3_catalog configured from the environment
// (s3::config::from_environment()). The target's link option
// --undefined=sluice_s3_link pulls this member out of the archive (an
// unreferenced member, and its initialiser, would be dropped); see
// docs/design.md, "Components and CMake targets".

#include <sluice/s3/source.hpp>

extern "C" void sluice_s3_link() {}

namespace sluice::inline v0::detail {
namespace {
const bool s3_scheme_registered =
    register_scheme("s3", [](const std::string& uri) { return std::make_shared<s3_catalog>(uri); });
}  // namespace
}  // namespace sluice::inline v0::detail
