# Installs the build tree into a scratch prefix, then configures, builds and runs the
# consumer project against it with find_package(moert), and compiles the consumer
# once more with pkg-config's flags. Run by ctest with -D BUILD_DIR, SOURCE_DIR,
# WORK_DIR, VERSION, LIBDIR, INCLUDEDIR, C_COMPILER, CXX_COMPILER, GENERATOR.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f ${INCLUDEDIR}/moert/version.h ${LIBDIR}/cmake/moert/moertConfig.cmake
          ${LIBDIR}/cmake/moert/moertConfigVersion.cmake ${LIBDIR}/pkgconfig/moert.pc
          ${LIBDIR}/libmoert.a ${LIBDIR}/libmoert.so)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${prefix}/${f}")
  endif()
endforeach()

run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/build
    -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
foreach(exe consumer_shared consumer_static consumer_cpp)
  run(${WORK_DIR}/build/${exe})
  if(NOT run_output MATCHES "^moert ${VERSION}\n$")
    message(FATAL_ERROR "${exe} printed '${run_output}', expected 'moert ${VERSION}'")
  endif()
endforeach()

# pkg-config: the same consumer, built with the flags moert.pc gives.
set(ENV{PKG_CONFIG_PATH} ${prefix}/${LIBDIR}/pkgconfig)
run(pkg-config --cflags --libs moert)
string(STRIP "${run_output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${C_COMPILER} ${SOURCE_DIR}/tests/install/consumer/consumer.c ${flags}
    -Wl,-rpath,${prefix}/${LIBDIR} -o ${WORK_DIR}/consumer_pkgconfig)
run(${WORK_DIR}/consumer_pkgconfig)
if(NOT run_output MATCHES "^moert ${VERSION}\n$")
  message(FATAL_ERROR "pkg-config consumer printed '${run_output}'")
endif()
message(STATUS "install test passed: find_package(moert) shared + static, pkg-config")
