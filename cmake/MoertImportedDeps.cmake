# Imported targets moert::xnnpack, moert::pthreadpool, moert::cpuinfo, moert::zstd,
# moert::sodium and, where found, moert::uring, found with
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

# liburing (Debian's liburing-dev): the expert loader's io_uring reads. Optional: without
# it (or with -DMOERT_IO_URING=OFF) the loader reads on a pool of pread threads.
# pkg-config's answer, where it has one, is where to look first.
if(NOT DEFINED MOERT_IO_URING OR MOERT_IO_URING)
  if(NOT TARGET moert::uring)
    find_package(PkgConfig QUIET)
    if(PKG_CONFIG_FOUND)
      pkg_check_modules(MOERT_LIBURING_PC QUIET liburing)
    endif()
    find_path(moert_uring_INCLUDE_DIR liburing.h HINTS ${MOERT_LIBURING_PC_INCLUDE_DIRS})
    find_library(moert_uring_LIBRARY NAMES uring HINTS ${MOERT_LIBURING_PC_LIBRARY_DIRS})
    if(moert_uring_INCLUDE_DIR AND moert_uring_LIBRARY)
      add_library(moert::uring UNKNOWN IMPORTED)
      set_target_properties(moert::uring PROPERTIES
        IMPORTED_LOCATION "${moert_uring_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${moert_uring_INCLUDE_DIR}")
    endif()
  endif()
endif()
