#pragma once
/// \file
/// Library version.

#define SLUICE_VERSION_MAJOR 0
#define SLUICE_VERSION_MINOR 1
#define SLUICE_VERSION_PATCH 0
#define SLUICE_VERSION_STRING "0.1.0"

namespace sluice::inline v0 {
/// The library version as "major.minor.patch".
inline constexpr const char* version_string = SLUICE_VERSION_STRING;
}  // namespace sluice::inline v0
