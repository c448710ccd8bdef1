# tier_include_root(<target> <PUBLIC|INTERFACE|PRIVATE> <entry>...): give <target> an include
# root of its own that holds only the given folders or single headers, as symbolic links under
# ${PROJECT_BINARY_DIR}/include-roots/<target>/. An entry is a path relative to the source tree
# ("daemon/durability/journal": included as "daemon/durability/journal/..."), or <name>=<path> to include it under
# another name ("nvme=daemon/tiering/nvme": included as "nvme/...").
#
# Headers keep one spelling everywhere ("daemon/durability/journal/records.hpp", "nvme/engine.hpp",
# "wire/codec.hpp"), but a target sees only the roots of the targets it links: tier_journal
# can include "wire/..." (it links tier_wire) and cannot include "daemon/state/state.hpp" (it does
# not link tierd_core), so a wrong-way include fails to compile instead of creating a cycle.
# No target exports the repository root.

# The roots are made afresh at every configure. A root left by an older layout can hold a link
# to a whole folder where the tree now links single headers; writing a header link through it
# would land in the source tree, over the header itself. rm -rf removes links, never what they
# point to.
execute_process(COMMAND rm -rf ${PROJECT_BINARY_DIR}/include-roots)

function(tier_include_root target scope)
  set(root ${PROJECT_BINARY_DIR}/include-roots/${target})
  foreach(entry IN LISTS ARGN)
    if(entry MATCHES "^([^=]+)=(.+)$")
      set(name ${CMAKE_MATCH_1})
      set(path ${CMAKE_MATCH_2})
    else()
      set(name ${entry})
      set(path ${entry})
    endif()
    if(NOT EXISTS ${PROJECT_SOURCE_DIR}/${path})
      message(FATAL_ERROR "tier_include_root(${target}): no ${path} in the source tree")
    endif()
    get_filename_component(parent ${root}/${name} DIRECTORY)
    # Never through a link: ${parent} must be a directory of the root itself.
    string(REPLACE "/" ";" steps ${name})
    list(POP_BACK steps)
    set(at ${root})
    foreach(step IN LISTS steps)
      set(at ${at}/${step})
      if(IS_SYMLINK ${at})
        message(FATAL_ERROR "tier_include_root(${target}): ${name} would be written through the link ${at}")
      endif()
    endforeach()
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${path} ${root}/${name} SYMBOLIC)
  endforeach()
  target_include_directories(${target} ${scope} $<BUILD_INTERFACE:${root}>)
endfunction()

# tier_include_headers(<target> <PUBLIC|INTERFACE|PRIVATE> <name> <dir>): every header directly
# in <dir> (not its subfolders, which are libraries of their own) in <target>'s include root as
# "<name>/<header>". For a folder that holds another library's folder ("daemon/tiering" holds
# ram/, nvme/, policy/), so that linking it does not make those headers visible as well.
function(tier_include_headers target scope name dir)
  file(GLOB headers RELATIVE ${PROJECT_SOURCE_DIR}/${dir} CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/${dir}/*.hpp)
  set(entries)
  foreach(h IN LISTS headers)
    list(APPEND entries ${name}/${h}=${dir}/${h})
  endforeach()
  tier_include_root(${target} ${scope} ${entries})
endfunction()
