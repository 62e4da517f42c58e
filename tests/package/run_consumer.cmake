# Installs the build tree into a scratch prefix, then configures, builds and
# runs the consumer project SRC (its executable EXE) against it, with the
# build's compiler, compiler launcher, build type and compile/link flags
# (BIN SRC EXE CXX LAUNCHER BUILD_TYPE CXX_FLAGS EXE_LINKER_FLAGS). Each
# consumer has its own scratch folder, so the tests may run in parallel.
# With RANKS=N and RANK_LAUNCHER (this build's sluice-launch), the consumer
# first writes its checkpoint (`EXE --write DIR`), then runs once per rank
# under the launcher (`EXE DIR`).
set(prefix ${BIN}/package-test/${EXE}/prefix)
set(build ${BIN}/package-test/${EXE}/build)
file(REMOVE_RECURSE ${BIN}/package-test/${EXE})
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()
set(configure ${CMAKE_COMMAND} -S ${SRC} -B ${build} -G Ninja -DCMAKE_CXX_COMPILER=${CXX}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${EXE_LINKER_FLAGS}")
if(LAUNCHER)
  list(APPEND configure -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
# One step per variable: a step is a command line (a list).
set(step_install ${CMAKE_COMMAND} --install ${BIN} --prefix ${prefix})
set(step_configure ${configure})
set(step_build ${CMAKE_COMMAND} --build ${build})
set(step_run ${build}/${EXE} ${build})
set(steps step_install step_configure step_build)
if(RANKS)
  set(step_write ${build}/${EXE} --write ${build}/checkpoint)
  set(step_run ${RANK_LAUNCHER} -n ${RANKS} --comm-timeout 60 -- ${build}/${EXE} ${build}/checkpoint)
  list(APPEND steps step_write)
endif()
# FAULT=PHASE:RANK:SIGNAL: the run has SLUICE_TEST_FAULT set, which an
# installed library must ignore (it has no test hook).
if(FAULT)
  set(step_run ${CMAKE_COMMAND} -E env SLUICE_TEST_FAULT=${FAULT} ${step_run})
endif()
list(APPEND steps step_run)
foreach(step IN ITEMS ${steps})
  execute_process(COMMAND ${${step}} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${${step}}\n${err}")
  endif()
endforeach()
