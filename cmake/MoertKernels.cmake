# The microkernels under kernels/: scalar references always, ISA variants where the
# target and compiler can build them, each with its own flags (never global ones).
# Appends absolute paths to MOERT_SOURCES and MOERT_KERNEL_DEFINITIONS (the
# MOERT_KERNELS_<ISA> macros kernels/config.cc dispatches on).
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
)
set(MOERT_KERNEL_DEFINITIONS)

# x86-64: AVX2 + FMA + F16C.
set(MOERT_AVX2_KERNEL_SOURCES
)
# aarch64: NEON with the dot-product extension, and with i8mm.
set(MOERT_NEONDOT_KERNEL_SOURCES
)
set(MOERT_NEONI8MM_KERNEL_SOURCES
)

if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND MOERT_AVX2_KERNEL_SOURCES)
  set_source_files_properties(${MOERT_AVX2_KERNEL_SOURCES} PROPERTIES
    COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")
  list(APPEND MOERT_KERNEL_SOURCES ${MOERT_AVX2_KERNEL_SOURCES})
  list(APPEND MOERT_KERNEL_DEFINITIONS MOERT_KERNELS_AVX2)
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

# SME2 (armv9-a+sme2) needs clang 19: see the SME2 block below.

list(APPEND MOERT_SOURCES ${MOERT_KERNEL_SOURCES})
