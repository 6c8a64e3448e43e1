# The microkernels under kernels/: scalar references always, ISA variants where the
# target and compiler can build them, each with its own flags (never global ones).
# Appends absolute paths to MOERT_SOURCES and MOERT_KERNEL_DEFINITIONS (the
# MOERT_KERNELS_<ISA> macros kernels/config.cc dispatches on), and sets
# MOERT_KERNEL_OBJECTS (objects built by another compiler, for both libraries).
include_guard(GLOBAL)
set(k ${PROJECT_SOURCE_DIR}/kernels)

set(MOERT_KERNEL_SOURCES
  ${k}/config.cc
  ${k}/q8-quant/q8-quant-scalar.cc
  ${k}/q4-gemv/q4-gemv-1x8-scalar.cc
  ${k}/q4-gemm/q4-gemm-4x8-scalar.cc
  ${k}/q4m-gemv/q4m-gemv-1x8-scalar.cc
  ${k}/q4m-gemm/q4m-gemm-4x8-scalar.cc
  ${k}/q8-gemv/q8-gemv-1x8-scalar.cc
  ${k}/q8-gemm/q8-gemm-4x8-scalar.cc
  ${k}/q4s24-gemv/q4s24-gemv-1x8-scalar.cc
  ${k}/q4s24-gemm/q4s24-gemm-4x8-scalar.cc
  ${k}/f32-topk/f32-topk-scalar.cc
  ${k}/f32-gemm/f32-gemm-2x2-scalar.cc
  ${k}/f32-wsum/f32-wsum-scalar.cc
  ${k}/kv-widen/kv-widen-scalar.cc
)
set(MOERT_KERNEL_DEFINITIONS)
set(MOERT_KERNEL_OBJECTS)

# x86-64: AVX2 + FMA + F16C.
set(MOERT_AVX2_KERNEL_SOURCES
  ${k}/q8-quant/q8-quant-avx2.cc
  ${k}/q4-gemv/q4-gemv-1x8-avx2.cc
  ${k}/q4-gemm/q4-gemm-4x8-avx2.cc
  ${k}/q4m-gemv/q4m-gemv-1x8-avx2.cc
  ${k}/q4m-gemm/q4m-gemm-4x8-avx2.cc
  ${k}/q8-gemv/q8-gemv-1x8-avx2.cc
  ${k}/q8-gemm/q8-gemm-4x8-avx2.cc
  ${k}/q4s24-gemv/q4s24-gemv-1x8-avx2.cc
  ${k}/q4s24-gemm/q4s24-gemm-4x8-avx2.cc
  ${k}/f32-topk/f32-topk-avx2.cc
  ${k}/f32-gemm/f32-gemm-4x3-avx2.cc
  ${k}/f32-wsum/f32-wsum-avx2.cc
  ${k}/kv-widen/kv-widen-avx2.cc
)
# x86-64: the VNNI int8 dot products, on top of AVX2 (kernels/vnni-qgemm.h). AVX-VNNI is
# the VEX form (Alder Lake, Zen 5); AVX512-VNNI the EVEX one with 512-bit registers
# (Ice Lake, Sapphire Rapids, Zen 4). config.cc picks them at run time.
set(MOERT_AVXVNNI_KERNEL_SOURCES
  ${k}/q4-gemv/q4-gemv-1x8-avxvnni.cc
  ${k}/q4-gemm/q4-gemm-4x8-avxvnni.cc
  ${k}/q4m-gemv/q4m-gemv-1x8-avxvnni.cc
  ${k}/q4m-gemm/q4m-gemm-4x8-avxvnni.cc
  ${k}/q8-gemv/q8-gemv-1x8-avxvnni.cc
  ${k}/q8-gemm/q8-gemm-4x8-avxvnni.cc
  ${k}/q4s24-gemv/q4s24-gemv-1x8-avxvnni.cc
  ${k}/q4s24-gemm/q4s24-gemm-4x8-avxvnni.cc
)
set(MOERT_AVX512VNNI_KERNEL_SOURCES
  ${k}/q4-gemv/q4-gemv-1x8-avx512vnni.cc
  ${k}/q4-gemm/q4-gemm-4x8-avx512vnni.cc
  ${k}/q4m-gemv/q4m-gemv-1x8-avx512vnni.cc
  ${k}/q4m-gemm/q4m-gemm-4x8-avx512vnni.cc
  ${k}/q8-gemv/q8-gemv-1x8-avx512vnni.cc
  ${k}/q8-gemm/q8-gemm-4x8-avx512vnni.cc
  ${k}/q4s24-gemv/q4s24-gemv-1x8-avx512vnni.cc
  ${k}/q4s24-gemm/q4s24-gemm-4x8-avx512vnni.cc
)
# AVX512-VBMI (Ice Lake, Sapphire Rapids, Zen 4) on top of AVX512-VNNI: byte permutes
# across the whole register, for W4S24's pair codes.
set(MOERT_AVX512VBMI_KERNEL_SOURCES
  ${k}/q4s24-gemv/q4s24-gemv-1x8-avx512vbmi.cc
  ${k}/q4s24-gemm/q4s24-gemm-4x8-avx512vbmi.cc
)
# aarch64: NEON with the dot-product extension, and with i8mm.
set(MOERT_NEONDOT_KERNEL_SOURCES
  ${k}/q8-quant/q8-quant-neon.cc
  ${k}/q4-gemv/q4-gemv-1x8-neondot.cc
  ${k}/q4-gemm/q4-gemm-4x8-neondot.cc
  ${k}/q4m-gemv/q4m-gemv-1x8-neondot.cc
  ${k}/q4m-gemm/q4m-gemm-4x8-neondot.cc
  ${k}/q8-gemv/q8-gemv-1x8-neondot.cc
  ${k}/q8-gemm/q8-gemm-4x8-neondot.cc
  ${k}/q4s24-gemv/q4s24-gemv-1x8-neondot.cc
  ${k}/q4s24-gemm/q4s24-gemm-4x8-neondot.cc
  ${k}/f32-topk/f32-topk-neon.cc
  ${k}/kv-widen/kv-widen-neon.cc
)
set(MOERT_NEONI8MM_KERNEL_SOURCES
  ${k}/q4-gemm/q4-gemm-4x8-neoni8mm.cc
  ${k}/q4m-gemm/q4m-gemm-4x8-neoni8mm.cc
  ${k}/q8-gemm/q8-gemm-4x8-neoni8mm.cc
)

set(MOERT_AMX_KERNEL_SOURCES
  ${k}/q4-gemm/q4-gemm-16x8-amx.cc
  ${k}/q4m-gemm/q4m-gemm-16x8-amx.cc
  ${k}/q8-gemm/q8-gemm-16x8-amx.cc
)

# Adds the kernel sources in the list variable `sources`, compiled with the list
# `flags`, and defines `definition` (MOERT_KERNELS_<ISA>).
macro(moert_add_isa_kernels sources flags definition)
  set_source_files_properties(${${sources}} PROPERTIES COMPILE_OPTIONS "${flags}")
  list(APPEND MOERT_KERNEL_SOURCES ${${sources}})
  list(APPEND MOERT_KERNEL_DEFINITIONS ${definition})
endmacro()

if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND MOERT_AVX2_KERNEL_SOURCES)
  moert_add_isa_kernels(MOERT_AVX2_KERNEL_SOURCES "-mavx2;-mfma;-mf16c" MOERT_KERNELS_AVX2)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-mavxvnni MOERT_HAVE_MAVXVNNI)
  if(MOERT_HAVE_MAVXVNNI)
    moert_add_isa_kernels(MOERT_AVXVNNI_KERNEL_SOURCES "-mavx2;-mfma;-mf16c;-mavxvnni"
                          MOERT_KERNELS_AVXVNNI)
  endif()
  # GCC 12's avx512fintrin.h trips its own -Wmaybe-uninitialized (the self-initialised
  # __Y of _mm512_undefined_epi32 and friends): a false positive in the header.
  set(moert_avx512_flags -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vnni)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    list(APPEND moert_avx512_flags -Wno-maybe-uninitialized)
  endif()
  moert_add_isa_kernels(MOERT_AVX512VNNI_KERNEL_SOURCES "${moert_avx512_flags}"
                        MOERT_KERNELS_AVX512VNNI)
  moert_add_isa_kernels(MOERT_AVX512VBMI_KERNEL_SOURCES "${moert_avx512_flags};-mavx512vbmi"
                        MOERT_KERNELS_AVX512VBMI)
  # AMX-INT8: GCC 11+ and clang 12+ have the tile intrinsics. The tests run the same
  # loop over a scalar model of the tile instructions (kernels/amx-tile-emulator.h)
  # with these AVX-512 flags, which MOERT_AVX512_FLAGS (a global) passes on.
  check_cxx_compiler_flag(-mamx-int8 MOERT_HAVE_MAMX)
  if(MOERT_HAVE_MAMX)
    moert_add_isa_kernels(MOERT_AMX_KERNEL_SOURCES "${moert_avx512_flags};-mamx-tile;-mamx-int8"
                          MOERT_KERNELS_AMX)
  endif()
  set(MOERT_AVX512_FLAGS "${moert_avx512_flags}" CACHE INTERNAL "AVX-512 kernel flags")
endif()
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$" AND MOERT_NEONDOT_KERNEL_SOURCES)
  set_source_files_properties(${MOERT_NEONDOT_KERNEL_SOURCES} PROPERTIES
    COMPILE_OPTIONS "-march=armv8.2-a+dotprod")
  set_source_files_properties(${MOERT_NEONI8MM_KERNEL_SOURCES} PROPERTIES
    COMPILE_OPTIONS "-march=armv8.2-a+dotprod+i8mm")
  list(APPEND MOERT_KERNEL_SOURCES ${MOERT_NEONDOT_KERNEL_SOURCES}
       ${MOERT_NEONI8MM_KERNEL_SOURCES})
  list(APPEND MOERT_KERNEL_DEFINITIONS MOERT_KERNELS_NEON)
endif()

# SME2 (aarch64): GCC 12, the cross build's compiler, cannot build SME2, so clang 19
# (Debian's clang-19, which scripts/setup-deps.sh --aarch64 installs) compiles these
# to objects (MOERT_KERNEL_OBJECTS) that src/CMakeLists.txt adds to both libraries,
# so every target linking moert_internal gets them too. Without clang 19 (or with
# -DMOERT_SME2=OFF) SME2 is left out (no MOERT_KERNELS_SME2), never stubbed.
# kernels/sme-abi-support.S carries the SME ABI routines clang's code calls, which
# Debian 12's libgcc lacks.
# -march=armv9-a+nosve+sme2: SVE only inside streaming mode, where SME2 brings it,
# so the non-streaming prologues also run on SME CPUs without SVE (Apple M4).
# Debian 12's qemu 7.2 (and 10.0) cannot run SME2, so the tests skip these kernels
# there (config.cc reads HWCAP2). qemu 11 can: the static qemu-aarch64 of Debian's
# qemu-user 11.1 (trixie-backports; unpack the .deb, no install needed) runs
#   qemu-aarch64 -cpu max,sme512=on -L /usr/aarch64-linux-gnu \
#     -E LD_LIBRARY_PATH=<sysroot>/usr/lib/aarch64-linux-gnu <build>/bin/kernels_test
# (sme128 ... sme2048 pick the streaming vector length).
set(MOERT_SME2_KERNEL_SOURCES
  ${k}/q4-gemv/q4-gemv-1x8-sme2.cc
  ${k}/q4-gemm/q4-gemm-16x8-sme2.cc
  ${k}/q4m-gemv/q4m-gemv-1x8-sme2.cc
  ${k}/q4m-gemm/q4m-gemm-16x8-sme2.cc
  ${k}/q8-gemv/q8-gemv-1x8-sme2.cc
  ${k}/q8-gemm/q8-gemm-16x8-sme2.cc
  ${k}/sme-abi-support.S
)
option(MOERT_SME2 "Build the SME2 kernels on aarch64 when clang 19 is found" ON)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$" AND MOERT_SME2)
  find_program(MOERT_SME2_COMPILER NAMES clang++-19 clang-19
               DOC "clang 19, to build the SME2 kernels")
  if(MOERT_SME2_COMPILER)
    set(moert_sme2_flags --target=aarch64-linux-gnu -march=armv9-a+nosve+sme2 -O2 -fPIC
        -ffp-contract=off -fvisibility=hidden -fvisibility-inlines-hidden
        -I${PROJECT_SOURCE_DIR})
    if(CMAKE_SYSROOT)
      list(APPEND moert_sme2_flags --sysroot=${CMAKE_SYSROOT})
    endif()
    if(CMAKE_BUILD_TYPE MATCHES "^(Debug|RelWithDebInfo)$")
      list(APPEND moert_sme2_flags -g)
    endif()
    # The warnings of moert_set_warnings (cmake/MoertWarnings.cmake), and -Wconversion.
    set(moert_sme2_cxx_flags -std=c++20 -Wall -Wextra -Wpedantic -Wshadow -Wcast-align
        -Wunused -Wnull-dereference -Wimplicit-fallthrough -Wold-style-cast -Wconversion)
    if(MOERT_WERROR)
      list(APPEND moert_sme2_cxx_flags -Werror)
    endif()
    foreach(moert_sme2_src ${MOERT_SME2_KERNEL_SOURCES})
      get_filename_component(moert_sme2_name ${moert_sme2_src} NAME)
      set(moert_sme2_obj ${CMAKE_CURRENT_BINARY_DIR}/sme2/${moert_sme2_name}.o)
      set(moert_sme2_lang_flags ${moert_sme2_cxx_flags})
      if(moert_sme2_name MATCHES "\\.S$")
        set(moert_sme2_lang_flags)
      endif()
      add_custom_command(
        OUTPUT ${moert_sme2_obj}
        COMMAND ${MOERT_SME2_COMPILER} ${moert_sme2_flags} ${moert_sme2_lang_flags}
                -MD -MF ${moert_sme2_obj}.d -c ${moert_sme2_src} -o ${moert_sme2_obj}
        DEPENDS ${moert_sme2_src}
        DEPFILE ${moert_sme2_obj}.d
        COMMENT "Building SME2 object sme2/${moert_sme2_name}.o (clang 19)"
        VERBATIM)
      set_source_files_properties(${moert_sme2_obj} PROPERTIES
        EXTERNAL_OBJECT TRUE GENERATED TRUE)
      list(APPEND MOERT_KERNEL_OBJECTS ${moert_sme2_obj})
    endforeach()
    list(APPEND MOERT_KERNEL_DEFINITIONS MOERT_KERNELS_SME2)
    message(STATUS "moert: SME2 kernels built with ${MOERT_SME2_COMPILER}")
  else()
    message(STATUS "moert: clang-19 not found, SME2 kernels left out "
                   "(scripts/setup-deps.sh --aarch64 installs it)")
  endif()
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64)$")
  message(STATUS "moert: MOERT_SME2=OFF, SME2 kernels left out")
endif()

list(APPEND MOERT_SOURCES ${MOERT_KERNEL_SOURCES})
