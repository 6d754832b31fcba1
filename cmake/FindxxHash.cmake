# FindxxHash: libxxhash as the imported target xxHash::xxhash (the name
# xxHash's own CMake package uses). Used by mhckpt's build and, installed
# beside mhckptConfig.cmake, by projects that find_package(mhckpt).
find_path(XXHASH_INCLUDE_DIR xxhash.h)
find_library(XXHASH_LIBRARY xxhash)
mark_as_advanced(XXHASH_INCLUDE_DIR XXHASH_LIBRARY)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(xxHash REQUIRED_VARS XXHASH_LIBRARY XXHASH_INCLUDE_DIR)

if(xxHash_FOUND AND NOT TARGET xxHash::xxhash)
  add_library(xxHash::xxhash UNKNOWN IMPORTED)
  set_target_properties(xxHash::xxhash PROPERTIES
    IMPORTED_LOCATION "${XXHASH_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${XXHASH_INCLUDE_DIR}")
endif()
