# FindRE2: Google's RE2 (Debian's libre2-dev) via pkg-config, with a
# find_path/find_library fallback. Defines RE2::RE2 and RE2_FOUND. The core
# links it privately (src/core/name_pattern.cpp); no installed header names it.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PC_RE2 QUIET re2)
endif()
find_path(RE2_INCLUDE_DIR re2/re2.h HINTS ${PC_RE2_INCLUDE_DIRS})
find_library(RE2_LIBRARY NAMES re2 HINTS ${PC_RE2_LIBRARY_DIRS})
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(RE2 REQUIRED_VARS RE2_LIBRARY RE2_INCLUDE_DIR)
if(RE2_FOUND AND NOT TARGET RE2::RE2)
  add_library(RE2::RE2 UNKNOWN IMPORTED)
  set_target_properties(RE2::RE2 PROPERTIES IMPORTED_LOCATION ${RE2_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${RE2_INCLUDE_DIR})
endif()
mark_as_advanced(RE2_INCLUDE_DIR RE2_LIBRARY)
