# Runs a tool with --metrics FILE, then checks FILE: promtool (Prometheus's own linter of
# the text format) accepts it, and it holds the expected samples. Used by
# tests/tools/CMakeLists.txt's tools.*.metrics tests.
#   -D CMD="prog;arg;..."  -D METRICS_FILE=path  -D PROMTOOL=path
#   -D EXPECT_METRICS="regex;regex;..." (each must match the file)
#   -D EMULATOR="..." (optional, when cross-compiling; promtool runs on the host)
file(REMOVE ${METRICS_FILE})
include(${CMAKE_CURRENT_LIST_DIR}/run_cmd.cmake)
if(NOT EXISTS ${METRICS_FILE})
  message(FATAL_ERROR "${METRICS_FILE} was not written\nstderr:\n${err}")
endif()
execute_process(COMMAND ${PROMTOOL} check metrics INPUT_FILE ${METRICS_FILE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(READ ${METRICS_FILE} text)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "promtool check metrics: exit code ${rc}\n${out}${err}\nthe file:\n${text}")
endif()
foreach(re ${EXPECT_METRICS})
  if(NOT text MATCHES "${re}")
    message(FATAL_ERROR "${METRICS_FILE} does not match '${re}':\n${text}")
  endif()
endforeach()
