# sluice_component(<name> [HEADERS h...] [SOURCES s...] [DEPS d...] [LINK_ANCHOR symbol])
# Defines sluice_<name> (INTERFACE when it has no sources, STATIC otherwise),
# its alias sluice::<name>, and its own export set sluice-<name>-targets.
# LINK_ANCHOR: every program that links the target is linked with
# --undefined=<symbol>, which pulls the archive member defining it (and that
# member's static initialiser: the component registering its backend) even
# though nothing in the program refers to it (docs/design.md, "Components and
# CMake targets").
function(sluice_component name)
  cmake_parse_arguments(C "" "LINK_ANCHOR" "HEADERS;SOURCES;DEPS" ${ARGN})
  set(t sluice_${name})
  if(C_SOURCES)
    add_library(${t} STATIC ${C_SOURCES})
    target_link_libraries(${t} PUBLIC sluice::sluice ${C_DEPS})
    target_compile_definitions(${t} PUBLIC SLUICE_HAS_$<UPPER_CASE:${name}>=1)
    set_target_properties(${t} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    if(C_LINK_ANCHOR)
      target_link_options(${t} INTERFACE "LINKER:--undefined=${C_LINK_ANCHOR}")
    endif()
    if(TARGET sluice_warnings)
      target_link_libraries(${t} PRIVATE $<BUILD_INTERFACE:sluice_warnings>)
    endif()
  else()
    add_library(${t} INTERFACE)
    target_link_libraries(${t} INTERFACE sluice::sluice ${C_DEPS})
    target_compile_definitions(${t} INTERFACE SLUICE_HAS_$<UPPER_CASE:${name}>=1)
  endif()
  add_library(sluice::${name} ALIAS ${t})
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${name})
  if(C_HEADERS)
    if(C_SOURCES)
      target_sources(${t} PUBLIC FILE_SET HEADERS BASE_DIRS include FILES ${C_HEADERS})
    else()
      target_sources(${t} INTERFACE FILE_SET HEADERS BASE_DIRS include FILES ${C_HEADERS})
    endif()
    set_target_properties(${t} PROPERTIES VERIFY_INTERFACE_HEADER_SETS ON)
  endif()
  install(TARGETS ${t} EXPORT sluice-${name}-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} FILE_SET HEADERS)
  install(EXPORT sluice-${name}-targets NAMESPACE sluice:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sluice)
  set(SLUICE_COMPONENTS ${SLUICE_COMPONENTS} ${name} PARENT_SCOPE)
endfunction()
