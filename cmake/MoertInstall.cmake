# Install rules: headers, libmoert (static and shared), moertConfig.cmake with its
# version file and moert.pc, so an app writes find_package(moert) and links
# moert::moert (shared) or moert::moert_static.
include(CMakePackageConfigHelpers)

set(MOERT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/moert)

install(TARGETS moert_static moert_shared EXPORT moertTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/moert
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/moert/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/moert)

install(EXPORT moertTargets NAMESPACE moert:: DESTINATION ${MOERT_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/moertConfig.cmake.in
  ${PROJECT_BINARY_DIR}/moertConfig.cmake INSTALL_DESTINATION ${MOERT_CMAKE_DIR})
# 0.x: only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/moertConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/moertConfig.cmake
  ${PROJECT_BINARY_DIR}/moertConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/MoertImportedDeps.cmake
  DESTINATION ${MOERT_CMAKE_DIR})

# Relocatable: the prefix is found from where moert.pc lies.
file(RELATIVE_PATH MOERT_PC_RELATIVE_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" MOERT_PC_RELATIVE_PREFIX "${MOERT_PC_RELATIVE_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/moert.pc.in ${PROJECT_BINARY_DIR}/moert.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/moert.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
