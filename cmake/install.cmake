# Installs the headers and exports commsgd::commsgd (and commsgd::mpi / commsgd::torch / commsgd::cuda when built).
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/commsgd TYPE INCLUDE)
install(TARGETS commsgd EXPORT commsgd-targets)
install(EXPORT commsgd-targets NAMESPACE commsgd:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/commsgd)
if(TARGET commsgd_mpi)
  install(TARGETS commsgd_mpi EXPORT commsgd-mpi-targets)
  install(EXPORT commsgd-mpi-targets NAMESPACE commsgd:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/commsgd)
endif()
if(TARGET commsgd_torch)
  install(TARGETS commsgd_torch EXPORT commsgd-torch-targets)
  install(EXPORT commsgd-torch-targets NAMESPACE commsgd:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/commsgd)
endif()
if(TARGET commsgd_cuda)
  install(TARGETS commsgd_cuda EXPORT commsgd-cuda-targets)
  install(EXPORT commsgd-cuda-targets NAMESPACE commsgd:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/commsgd)
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/commsgd-config.cmake.in
                              ${PROJECT_BINARY_DIR}/commsgd-config.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/commsgd)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/commsgd-config-version.cmake
                                 COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/commsgd-config.cmake ${PROJECT_BINARY_DIR}/commsgd-config-version.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/commsgd)
