# `cmake --install BUILD --prefix P`: the public headers under P/include/mhckpt,
# the static libraries, the CMake package (find_package(mhckpt) gives
# mhckpt::mhckpt), a pkg-config file, and the `mhckpt` tool. The Python wheel
# installs its own component only (pyproject.toml), none of these.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The public headers: these roots and every header of this project that they
# include, followed transitively. Change the roots, or the includes, and the
# installed set follows (the roots are scanned again when they change).
set(MHCKPT_PUBLIC_HEADER_ROOTS coordinator/checkpoint_manager.h)

function(mhckpt_header_closure out)
  set(todo ${ARGN})
  set(seen)
  while(todo)
    list(POP_FRONT todo header)
    if(header IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${header})
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
                 ${PROJECT_SOURCE_DIR}/${header})
    file(STRINGS ${PROJECT_SOURCE_DIR}/${header} lines REGEX "^#include \"")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" included "${line}")
      if(EXISTS ${PROJECT_SOURCE_DIR}/${included})
        list(APPEND todo ${included})
      endif()
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

mhckpt_header_closure(mhckpt_public_headers ${MHCKPT_PUBLIC_HEADER_ROOTS})
foreach(header IN LISTS mhckpt_public_headers)
  cmake_path(GET header PARENT_PATH folder)
  install(FILES ${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mhckpt/${folder}
          COMPONENT dev)
endforeach()

# Exported as mhckpt::base, mhckpt::worker, mhckpt::io and mhckpt::mhckpt
# (the coordinator: the public API).
set_target_properties(mhckpt_base PROPERTIES EXPORT_NAME base)
set_target_properties(mhckpt_worker PROPERTIES EXPORT_NAME worker)
set_target_properties(mhckpt_io PROPERTIES EXPORT_NAME io)
set_target_properties(mhckpt_coordinator PROPERTIES EXPORT_NAME mhckpt)
install(TARGETS mhckpt_base mhckpt_worker mhckpt_io mhckpt_coordinator
        EXPORT mhckptTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mhckpt)

# Keeps the paths of libraries outside the system's (e.g. Debian's HDF5).
set_target_properties(mhckpt_cli PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS mhckpt_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)

set(mhckpt_config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/mhckpt)
install(EXPORT mhckptTargets NAMESPACE mhckpt:: DESTINATION ${mhckpt_config_dir}
        COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mhckptConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/mhckptConfig.cmake
                              INSTALL_DESTINATION ${mhckpt_config_dir})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mhckptConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mhckptConfig.cmake
              ${PROJECT_BINARY_DIR}/mhckptConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindxxHash.cmake
        DESTINATION ${mhckpt_config_dir} COMPONENT dev)

# pkg-config: the libraries are static, so Libs names everything they link,
# by the paths this build used; MPI comes from the compiler wrapper (mpicxx).
# The prefix is found from the file's own place, so --prefix moves it.
file(RELATIVE_PATH mhckpt_pc_to_prefix /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
set(mhckpt_pc_libs $<TARGET_LINKER_FILE:spdlog::spdlog> $<TARGET_LINKER_FILE:fmt::fmt>
    ${XXHASH_LIBRARY} ${HDF5_C_LIBRARIES})
if(MHCKPT_NCCL)
  list(APPEND mhckpt_pc_libs ${NCCL_LIBRARY})
endif()
if(MHCKPT_CUDA)
  list(APPEND mhckpt_pc_libs $<TARGET_LINKER_FILE:${MHCKPT_CUDART}>)
endif()
list(JOIN mhckpt_pc_libs " " mhckpt_pc_libs)
configure_file(${PROJECT_SOURCE_DIR}/cmake/mhckpt.pc.in ${PROJECT_BINARY_DIR}/mhckpt.pc.in @ONLY)
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/mhckpt.pc INPUT ${PROJECT_BINARY_DIR}/mhckpt.pc.in)
install(FILES ${PROJECT_BINARY_DIR}/mhckpt.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)
