# Install rules, the CMake package config (find_package(tier) -> tier::client), the pkg-config
# file, the Python binding and the CPack .deb. Included at the very end of the top-level list so
# every target exists; each target is guarded with if(TARGET ...) so a partial tree still builds.
#
# Layout under the install prefix (GNUInstallDirs: LIBDIR is lib, or lib/<multiarch> when the
# build is configured with CMAKE_INSTALL_PREFIX=/usr on Debian), by component (= .deb package,
# cmake/cpack.cmake):
#   daemon (tierd):
#     sbin/tierd                                 the daemon (an admin-run service, hence sbin)
#     bin/tierctl bin/tier-bench
#     lib/systemd/system/tierd.service           ExecStart points at the installed sbin/tierd
#     lib/systemd/system/tierd.service.d/10-user.conf     User=tierd
#     lib/systemd/system-generators/tierd-generator       ReadWritePaths= for the NVMe dirs
#     lib/sysusers.d/tierd.conf, lib/tmpfiles.d/tierd.conf  the tierd user, /etc/tierd
#     share/tierd/tierd.toml.example             every key with its default
#     share/man/man{1,5,8}/..., share/bash-completion/completions/tierctl
#   conffile (tierd; only for the .deb, never by a plain cmake --install): /etc/tierd/tierd.toml
#   libtier (libtier0): LIBDIR/libtier.so.X.Y.Z, .so.X   SONAME libtier.so.X
#   dev (libtier-dev): include/tier/{client,export,status,types}.hpp, LIBDIR/libtier.so,
#     LIBDIR/cmake/tier/tierConfig*.cmake, tierTargets*.cmake, LIBDIR/pkgconfig/tier.pc
#   python (python3-tierd): lib/python3/dist-packages/tierd/ (_native*.so, __init__.py, torch/; when built)
#   trainer (tier-train): bin/tier-train, share/man/man1/tier-train.1
#   every component: share/doc/<package>/copyright and changelog.Debian.gz
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TIER_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
    "Where the systemd unit is installed, relative to the install prefix")
set(TIER_PYTHON_INSTALL_DIR "lib/python3/dist-packages" CACHE STRING
    "Where the Python module is installed, relative to the install prefix")
set(TIER_DOC_DIR "${CMAKE_INSTALL_DATADIR}/doc/tierd")

# The Python binding (python/CMakeLists.txt skips itself when Python3 or pybind11 is missing).
add_subdirectory(${PROJECT_SOURCE_DIR}/python ${PROJECT_BINARY_DIR}/python)

# Installed programs find libtier relative to themselves, so a prefix is relocatable
# (cmake --install --prefix anywhere, or the .deb's /usr).
function(tier_install_rpath target from_dir)
  file(RELATIVE_PATH rel "/${from_dir}" "/${CMAKE_INSTALL_LIBDIR}")
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/${rel}")
endfunction()

# --- libtier --------------------------------------------------------------------------------
# SONAME libtier.so.<project major version>. While that is 0 the ABI of include/tier/*.hpp may
# change between minor versions, so the CMake package accepts only the same minor version.
set_target_properties(tier_client PROPERTIES
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}
  EXPORT_NAME client)
# The public headers need C++23 (std::expected); consumers get the flag from the target.
set_property(TARGET tier_client APPEND PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_23)
# tier_wire is a static library linked PRIVATE into libtier.so: its objects are inside the .so
# (Status, dtype and size helpers are exported from it), so consumers never link it and the
# export does not name it (checked by tests/pkg/install_consumer.sh).
install(TARGETS tier_client EXPORT tierTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT libtier NAMELINK_COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# include/tier/ holds exactly the installed API. The GPU header (client/gpu/include/tier/gpu.hpp)
# belongs to tier::gpu, a static CUDA library for the project's own programs that is not
# installed.
install(FILES
    ${PROJECT_SOURCE_DIR}/include/tier/client.hpp
    ${PROJECT_SOURCE_DIR}/include/tier/export.hpp
    ${PROJECT_SOURCE_DIR}/include/tier/status.hpp
    ${PROJECT_SOURCE_DIR}/include/tier/types.hpp
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tier COMPONENT dev)

set(TIER_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tier)
install(EXPORT tierTargets NAMESPACE tier:: FILE tierTargets.cmake
  DESTINATION ${TIER_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/tierConfig.cmake.in
  ${PROJECT_BINARY_DIR}/pkg/tierConfig.cmake
  INSTALL_DESTINATION ${TIER_CMAKE_DIR})
# 0.x: only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pkg/tierConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/pkg/tierConfig.cmake ${PROJECT_BINARY_DIR}/pkg/tierConfigVersion.cmake
  DESTINATION ${TIER_CMAKE_DIR} COMPONENT dev)

# pkg-config: prefix is computed from the .pc file's own location, so the tree is relocatable.
file(RELATIVE_PATH TIER_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" TIER_PC_TO_PREFIX "${TIER_PC_TO_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/tier.pc.in ${PROJECT_BINARY_DIR}/pkg/tier.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/pkg/tier.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# --- programs -------------------------------------------------------------------------------
# OPTIONAL: a tree where only some programs were built (cmake --build --target ...) still
# installs; tests/pkg checks that every program present in build/bin was installed.
if(TARGET tierd)
  tier_install_rpath(tierd ${CMAKE_INSTALL_SBINDIR})
  install(TARGETS tierd RUNTIME DESTINATION ${CMAKE_INSTALL_SBINDIR} COMPONENT daemon OPTIONAL)
endif()
foreach(prog tierctl:daemon tier-bench:daemon tier-train:trainer)
  string(REPLACE ":" ";" prog "${prog}")
  list(GET prog 0 name)
  list(GET prog 1 component)
  if(TARGET ${name})
    tier_install_rpath(${name} ${CMAKE_INSTALL_BINDIR})
    install(TARGETS ${name} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${component} OPTIONAL)
  endif()
endforeach()

# --- systemd unit and example config ----------------------------------------------------------
# The unit is the daemon's own daemon/tierd.service with its ExecStart path rewritten, at install
# time, to the prefix being installed to: `cmake --install --prefix P` gets P/sbin/tierd, the
# .deb /usr/sbin/tierd. The drop-in packaging/systemd/10-user.conf runs it as the tierd user.
file(READ ${PROJECT_SOURCE_DIR}/daemon/tierd.service tier_unit_text)
# Only the ExecStart= line itself (one that starts a line), never the word in a comment.
string(REGEX REPLACE "(\nExecStart[^=\n]*=[-@+!:]*)[^ \n]*tierd" "\\1@TIER_UNIT_TIERD@"
       tier_unit_text "${tier_unit_text}")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/daemon/tierd.service)
file(WRITE ${PROJECT_BINARY_DIR}/pkg/tierd.service.in "${tier_unit_text}")
if(IS_ABSOLUTE "${CMAKE_INSTALL_SBINDIR}")
  set(tier_unit_sbin "${CMAKE_INSTALL_SBINDIR}")
else()
  set(tier_unit_sbin "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_SBINDIR}")
endif()
install(CODE "
  file(READ \"${PROJECT_BINARY_DIR}/pkg/tierd.service.in\" tier_unit)
  string(REPLACE \"@TIER_UNIT_TIERD@\" \"${tier_unit_sbin}/tierd\" tier_unit \"\${tier_unit}\")
  file(WRITE \"${PROJECT_BINARY_DIR}/pkg/unit/tierd.service\" \"\${tier_unit}\")
" COMPONENT daemon)
install(FILES ${PROJECT_BINARY_DIR}/pkg/unit/tierd.service
  DESTINATION ${TIER_SYSTEMD_UNIT_DIR} COMPONENT daemon)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/systemd/10-user.conf
  DESTINATION ${TIER_SYSTEMD_UNIT_DIR}/tierd.service.d COMPONENT daemon)
install(TARGETS tierd-generator RUNTIME DESTINATION lib/systemd/system-generators COMPONENT daemon)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/systemd/tierd.sysusers
  DESTINATION lib/sysusers.d RENAME tierd.conf COMPONENT daemon)
# tmpfiles.d's C line copies the example of this prefix to /etc/tierd/tierd.toml when missing.
set(TIER_EXAMPLE_DIR "${CMAKE_INSTALL_DATADIR}/tierd")
install(CODE "
  file(READ \"${PROJECT_SOURCE_DIR}/packaging/systemd/tierd.tmpfiles.in\" tier_tmpfiles)
  string(REPLACE \"@TIER_EXAMPLE_CONFIG@\" \"\${CMAKE_INSTALL_PREFIX}/${TIER_EXAMPLE_DIR}/tierd.toml.example\"
         tier_tmpfiles \"\${tier_tmpfiles}\")
  file(WRITE \"${PROJECT_BINARY_DIR}/pkg/tmpfiles/tierd.conf\" \"\${tier_tmpfiles}\")
" COMPONENT daemon)
install(FILES ${PROJECT_BINARY_DIR}/pkg/tmpfiles/tierd.conf DESTINATION lib/tmpfiles.d COMPONENT daemon)
install(FILES ${PROJECT_SOURCE_DIR}/daemon/tierd.toml.example DESTINATION ${TIER_EXAMPLE_DIR} COMPONENT daemon)
# The .deb's conffile. EXCLUDE_FROM_ALL: `cmake --install` (any prefix) never writes to /etc;
# only `cmake --install --component conffile` and CPack, which installs component by component.
install(FILES ${PROJECT_SOURCE_DIR}/daemon/tierd.toml.example DESTINATION /etc/tierd RENAME tierd.toml
  COMPONENT conffile EXCLUDE_FROM_ALL)

# Man pages and the bash completion.
foreach(page tierd.8:daemon tierctl.8:daemon tierd.toml.5:daemon tier-bench.1:daemon tier-train.1:trainer)
  string(REPLACE ":" ";" page "${page}")
  list(GET page 0 file)
  list(GET page 1 component)
  string(REGEX REPLACE ".*\\.([0-9])$" "\\1" section "${file}")
  install(FILES ${PROJECT_BINARY_DIR}/pkg/man/${file}.gz
    DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section} COMPONENT ${component})
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/packaging/bash-completion/tierctl
  DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions COMPONENT daemon)

# Documentation; Debian wants copyright and changelog.Debian.gz in every package's doc dir.
foreach(doc README.md docs/install.md)
  install(FILES ${PROJECT_SOURCE_DIR}/${doc} DESTINATION ${TIER_DOC_DIR} COMPONENT daemon)
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/docs/client.md DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/libtier-dev
  COMPONENT dev)
set(tier_doc_pkgs tierd:daemon libtier0:libtier libtier-dev:dev)
if(TARGET tierd_python)
  install(FILES ${PROJECT_SOURCE_DIR}/docs/python.md DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/python3-tierd
    COMPONENT python)
  list(APPEND tier_doc_pkgs python3-tierd:python)
endif()
if(TARGET tier-train)
  list(APPEND tier_doc_pkgs tier-train:trainer)
endif()
foreach(pkg IN LISTS tier_doc_pkgs)
  string(REPLACE ":" ";" pkg "${pkg}")
  list(GET pkg 0 name)
  list(GET pkg 1 component)
  install(FILES ${PROJECT_SOURCE_DIR}/packaging/debian/copyright ${TIER_DEB_CHANGELOG_GZ}
    DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${name} COMPONENT ${component})
  # lintian overrides: each remaining warning with the reason it does not apply.
  if(EXISTS ${PROJECT_SOURCE_DIR}/packaging/debian/${name}.lintian-overrides)
    install(FILES ${PROJECT_SOURCE_DIR}/packaging/debian/${name}.lintian-overrides
      DESTINATION ${CMAKE_INSTALL_DATADIR}/lintian/overrides RENAME ${name} COMPONENT ${component})
  endif()
endforeach()

# --- Python module ----------------------------------------------------------------------------
if(TARGET tierd_python)
  # The package directory tierd/: the extension tierd/_native*.so beside the pure-Python files.
  file(RELATIVE_PATH tier_py_rel "/${TIER_PYTHON_INSTALL_DIR}/tierd" "/${CMAKE_INSTALL_LIBDIR}")
  set_target_properties(tierd_python PROPERTIES INSTALL_RPATH "$ORIGIN/${tier_py_rel}")
  install(TARGETS tierd_python LIBRARY DESTINATION ${TIER_PYTHON_INSTALL_DIR}/tierd COMPONENT python OPTIONAL)
  foreach(name ${TIER_PYTHON_FILES})
    get_filename_component(dir ${name} DIRECTORY)
    install(FILES ${PROJECT_SOURCE_DIR}/python/tierd/${name} DESTINATION ${TIER_PYTHON_INSTALL_DIR}/tierd/${dir}
      COMPONENT python)
  endforeach()
endif()

include(${CMAKE_CURRENT_LIST_DIR}/cpack.cmake)
