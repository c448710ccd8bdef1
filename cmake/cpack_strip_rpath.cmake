# CPACK_PRE_BUILD_SCRIPTS: runs after CPack staged the components, before it packs them. Removes
# the $ORIGIN RUNPATH (needed only for a relocatable `cmake --install` prefix) from every ELF
# file in the packages: there libtier is in a default library directory, and Debian policy
# 10.2 forbids an RPATH.
file(GLOB_RECURSE tier_staged LIST_DIRECTORIES false "${CPACK_TEMPORARY_DIRECTORY}/*")
foreach(f IN LISTS tier_staged)
  if(IS_SYMLINK "${f}")
    continue()
  endif()
  file(READ "${f}" magic LIMIT 4 HEX)
  if(magic STREQUAL "7f454c46")
    file(RPATH_REMOVE FILE "${f}")
  endif()
endforeach()
