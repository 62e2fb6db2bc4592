# `cmake --install`: headers, libveloxquant.so and libveloxquant.a, the CLI, a CMake package
# (find_package(VeloxQuant CONFIG) -> VeloxQuant::veloxquant, the shared library, and
# VeloxQuant::veloxquant_static) and a pkg-config file (veloxquant.pc). The Python module goes
# to ${VELOXQUANT_PYTHON_INSTALL_DIR} (python/CMakeLists.txt).
include(CMakePackageConfigHelpers)

set(VQ_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/VeloxQuant)

install(TARGETS veloxquant veloxquant_shared EXPORT VeloxQuantTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/veloxquant DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS veloxquant_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT VeloxQuantTargets NAMESPACE VeloxQuant:: DESTINATION ${VQ_CMAKE_INSTALL_DIR}
  FILE VeloxQuantTargets.cmake)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/VeloxQuantConfig.cmake.in
  ${PROJECT_BINARY_DIR}/VeloxQuantConfig.cmake INSTALL_DESTINATION ${VQ_CMAKE_INSTALL_DIR})
# Before 1.0 a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/VeloxQuantConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/VeloxQuantConfig.cmake
  ${PROJECT_BINARY_DIR}/VeloxQuantConfigVersion.cmake DESTINATION ${VQ_CMAKE_INSTALL_DIR})

# pkg-config: paths relative to the .pc file, so `cmake --install --prefix P` works for any P.
file(RELATIVE_PATH VQ_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" VQ_PC_TO_PREFIX "${VQ_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/veloxquant.pc.in ${PROJECT_BINARY_DIR}/veloxquant.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/veloxquant.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# A separate project (one C file, one C++ file) built against a fresh install in the build
# tree, through find_package and through pkg-config.
if(VELOXQUANT_BUILD_TESTS)
  add_test(NAME install_consumer COMMAND bash ${PROJECT_SOURCE_DIR}/tests/install/consumer_test.sh
    ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR} "${VELOXQUANT_SANITIZE}")
  set_tests_properties(install_consumer PROPERTIES LABELS unit
    PASS_REGULAR_EXPRESSION "consumer: all checks passed")
endif()
