# Installs the build tree into a scratch prefix, then configures, builds and
# runs tests/package/consumer against it.
set(prefix ${BIN}/package-test/prefix)
set(build ${BIN}/package-test/consumer)
file(REMOVE_RECURSE ${BIN}/package-test)
foreach(step
    "${CMAKE_COMMAND};--install;${BIN};--prefix;${prefix}"
    "${CMAKE_COMMAND};-S;${SRC};-B;${build};-G;Ninja;-DCMAKE_CXX_COMPILER=${CXX};-DCMAKE_PREFIX_PATH=${prefix};-DCMAKE_BUILD_TYPE=Release"
    "${CMAKE_COMMAND};--build;${build}"
    "${build}/consumer;${build}")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${step}\n${err}")
  endif()
endforeach()
