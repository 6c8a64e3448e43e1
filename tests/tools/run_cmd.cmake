# Included by the tool-test scripts: runs CMD (under EMULATOR when set) and fails unless
# it exits 0; leaves its output in `out` and `err`.
if(EMULATOR)
  set(CMD ${EMULATOR} ${CMD})
endif()
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "exit code ${rc}\nstdout:\n${out}\nstderr:\n${err}")
endif()
