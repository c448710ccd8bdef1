# CPack: `cpack -G DEB` in the build directory makes tierd_<version>_<arch>.deb.
# Installs under /usr; the maintainer scripts in packaging/debian create the tierd system user,
# reload systemd and leave tierd.service disabled until the admin enables it.
set(CPACK_PACKAGE_NAME "tierd")
set(CPACK_PACKAGE_VENDOR "tierd")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "node memory tier (NUMA-aware RAM and NVMe) for sharded training state")
set(CPACK_PACKAGE_CONTACT "tierd maintainers <tierd@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_GENERATOR "DEB")
# RelWithDebInfo binaries carry their debug info in the build tree, not in the package.
set(CPACK_STRIP_FILES ON)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "admin")
# The synopsis line is CPACK_PACKAGE_DESCRIPTION_SUMMARY; this is the extended description.
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
"A per-node daemon that serves host RAM, as NUMA-aware shared-memory arenas, and local NVMe
as one memory tier for ZeRO-3 style offloaded training state, plus libtier (C++ client,
CMake package tier::client, pkg-config tier), tierctl, tier-bench, tier-train and the
Python module tierd. The service is installed disabled: systemctl enable --now tierd.")
# dpkg-shlibdeps computes Depends from the ELF files (libnuma1, libhwloc15, liburing2,
# libsystemd0, libstdc++6, ...); the list below is what it cannot see.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
# The Python module is built for one Python minor version.
if(TARGET tierd_python AND TIER_PYTHON_VERSION MATCHES "^([0-9]+)\\.([0-9]+)$")
  math(EXPR tier_py_next "${CMAKE_MATCH_2} + 1")
  set(CPACK_DEBIAN_PACKAGE_RECOMMENDS
      "python3 (>= ${TIER_PYTHON_VERSION}), python3 (<< ${CMAKE_MATCH_1}.${tier_py_next}), hwloc")
else()
  set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "hwloc")
endif()
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-numpy, python3-torch")
# A shlibs file for libtier.so.0, so packages built against it depend on this one.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${PROJECT_SOURCE_DIR}/packaging/debian/postinst
  ${PROJECT_SOURCE_DIR}/packaging/debian/prerm
  ${PROJECT_SOURCE_DIR}/packaging/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

include(CPack)
