# Imported targets moert::xnnpack, moert::pthreadpool, moert::cpuinfo, moert::zstd and
# moert::sodium found with
# find_path/find_library. Installed with moert so that moertConfig.cmake can recreate
# them for apps linking the static library.
include_guard(GLOBAL)

function(moert_import_library target header library)
  if(TARGET ${target})
    return()
  endif()
  string(MAKE_C_IDENTIFIER "${target}" id)
  find_path(${id}_INCLUDE_DIR ${header})
  find_library(${id}_LIBRARY NAMES ${library})
  if(NOT ${id}_INCLUDE_DIR OR NOT ${id}_LIBRARY)
    message(FATAL_ERROR "moert: ${header} / lib${library} not found; "
                        "run scripts/setup-deps.sh")
  endif()
  add_library(${target} UNKNOWN IMPORTED)
  set_target_properties(${target} PROPERTIES
    IMPORTED_LOCATION "${${id}_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${${id}_INCLUDE_DIR}")
endfunction()

moert_import_library(moert::cpuinfo cpuinfo.h cpuinfo)
moert_import_library(moert::pthreadpool pthreadpool.h pthreadpool)
moert_import_library(moert::xnnpack xnnpack.h XNNPACK)
# zstd: repro bundles and expert delta packages; libsodium: their Ed25519 signatures.
moert_import_library(moert::zstd zstd.h zstd)
moert_import_library(moert::sodium sodium.h sodium)
