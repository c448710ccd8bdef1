# CPack: `cpack -G DEB` in the build directory makes one .deb per package, the way Debian splits
# a daemon with a library (docs/install.md lists what each holds):
#   tierd          daemon, tierctl, tier-bench, the unit, generator, sysusers/tmpfiles, conffile
#   libtier0       libtier.so.0 (SONAME), with a shlibs file and the ldconfig trigger
#   libtier-dev    headers, libtier.so, the CMake package and tier.pc
#   python3-tierd  the Python module (when it was built)
#   tier-train     the trainer (OpenMPI, OpenBLAS), so the daemon does not pull them in
# Installs under /usr; the tierd maintainer scripts in packaging/debian apply the sysusers.d and
# tmpfiles.d snippets and register the unit with deb-systemd-helper, leaving it disabled.
set(CPACK_PACKAGE_NAME "tierd")
set(CPACK_PACKAGE_VENDOR "tierd")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# No CPACK_PACKAGE_DESCRIPTION_SUMMARY: CPack would prepend it to every package's description;
# the first line of each CPACK_DEBIAN_<GROUP>_DESCRIPTION is that package's synopsis.
set(TIER_DEB_MAINTAINER "tierd maintainers <maintainers@users.noreply.a-seed-abb31d83.example>"
    CACHE STRING "Maintainer field of the .deb packages")
set(CPACK_PACKAGE_CONTACT "${TIER_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${TIER_DEB_MAINTAINER}")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_GENERATOR "DEB")
# RelWithDebInfo binaries carry their debug info in the build tree, not in the package.
set(CPACK_STRIP_FILES ON)
# The Debian revision: packaging/debian/changelog's top entry is PROJECT_VERSION-1.
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "")
# Installed programs carry a $ORIGIN RUNPATH so a `cmake --install` prefix is relocatable; in
# the packages libtier is in a default library directory, so the script strips it (Debian
# policy 10.2: no RPATH).
set(CPACK_PRE_BUILD_SCRIPTS ${CMAKE_CURRENT_LIST_DIR}/cpack_strip_rpath.cmake)

# One package per component group.
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)
set(CPACK_COMPONENTS_ALL daemon conffile libtier dev)
set(CPACK_COMPONENT_DAEMON_GROUP tierd)
set(CPACK_COMPONENT_CONFFILE_GROUP tierd)
set(CPACK_COMPONENT_LIBTIER_GROUP libtier0)
set(CPACK_COMPONENT_DEV_GROUP libtierdev)
set(tier_deb_version "${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")
set(tier_libtier "libtier0 (= ${tier_deb_version})")
# dpkg-shlibdeps finds libtier.so.0 in the libtier0 staging tree; the Depends on it is set here.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS
    "${PROJECT_BINARY_DIR}/_CPack_Packages/Linux/DEB/${CPACK_PACKAGE_NAME}-${PROJECT_VERSION}-Linux/libtier0/usr/${CMAKE_INSTALL_LIBDIR}")

set(tier_pkg_dir ${PROJECT_SOURCE_DIR}/packaging/debian)

set(CPACK_DEBIAN_TIERD_PACKAGE_NAME tierd)
set(CPACK_DEBIAN_TIERD_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_TIERD_PACKAGE_DEPENDS "${tier_libtier}, adduser, init-system-helpers (>= 1.54~)")
set(CPACK_DEBIAN_TIERD_PACKAGE_RECOMMENDS "hwloc")
set(CPACK_DEBIAN_TIERD_DESCRIPTION
"node memory tier (NUMA-aware RAM and NVMe) for sharded training state
A per-node daemon that serves host RAM, as NUMA-aware shared-memory arenas,
and local NVMe as one memory tier for ZeRO-3 style offloaded training
state, with tierctl and tier-bench. The service is installed disabled:
edit /etc/tierd/tierd.toml, then systemctl enable --now tierd.")
set(CPACK_DEBIAN_TIERD_PACKAGE_CONTROL_EXTRA
  ${tier_pkg_dir}/conffiles ${tier_pkg_dir}/postinst ${tier_pkg_dir}/prerm ${tier_pkg_dir}/postrm)

set(CPACK_DEBIAN_LIBTIER0_PACKAGE_NAME libtier0)
set(CPACK_DEBIAN_LIBTIER0_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIBTIER0_DESCRIPTION
"client library of the tierd node memory tier
libtier connects to tierd, creates pools and tensors and leases them: the
tensor's arena is mapped into the process, so reads and writes are plain
memory accesses.")
# A shlibs file, so packages built against libtier.so.0 depend on this one, and the ldconfig
# trigger (the triggers file), as dh_makeshlibs writes them.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)  # only libtier0 has a library with a SONAME
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY "=")
set(CPACK_DEBIAN_LIBTIER0_PACKAGE_CONTROL_EXTRA
  ${tier_pkg_dir}/libtier0/triggers ${tier_pkg_dir}/libtier0/postinst ${tier_pkg_dir}/libtier0/postrm)

set(CPACK_DEBIAN_LIBTIERDEV_PACKAGE_NAME libtier-dev)
set(CPACK_DEBIAN_LIBTIERDEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_LIBTIERDEV_PACKAGE_DEPENDS "${tier_libtier}")
set(CPACK_DEBIAN_LIBTIERDEV_DESCRIPTION
"development files of libtier, the tierd client library
The C++23 headers, the CMake package (find_package(tier), tier::client) and
the pkg-config file tier.pc.")

if(TARGET tierd_python)
  list(APPEND CPACK_COMPONENTS_ALL python)
  set(CPACK_COMPONENT_PYTHON_GROUP python)
  set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-tierd)
  set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
  # The module is built for one Python minor version.
  if(TIER_PYTHON_VERSION MATCHES "^([0-9]+)\\.([0-9]+)$")
    math(EXPR tier_py_next "${CMAKE_MATCH_2} + 1")
    set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS
        "${tier_libtier}, python3 (>= ${TIER_PYTHON_VERSION}), python3 (<< ${CMAKE_MATCH_1}.${tier_py_next})")
  else()
    set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "${tier_libtier}, python3")
  endif()
  set(CPACK_DEBIAN_PYTHON_PACKAGE_SUGGESTS "python3-numpy, python3-torch")
  set(CPACK_DEBIAN_PYTHON_DESCRIPTION
"Python module of the tierd node memory tier
The module tierd: pools, tensors and leases of a running tierd as Python
objects, with zero-copy buffers (NumPy, PyTorch).")
endif()

if(TARGET tier-train)
  list(APPEND CPACK_COMPONENTS_ALL trainer)
  set(CPACK_COMPONENT_TRAINER_GROUP trainer)
  set(CPACK_DEBIAN_TRAINER_PACKAGE_NAME tier-train)
  set(CPACK_DEBIAN_TRAINER_PACKAGE_SECTION science)
  set(CPACK_DEBIAN_TRAINER_PACKAGE_DEPENDS "${tier_libtier}")
  set(CPACK_DEBIAN_TRAINER_PACKAGE_RECOMMENDS "tierd (= ${tier_deb_version}), openmpi-bin")
  set(CPACK_DEBIAN_TRAINER_DESCRIPTION
"ZeRO-3 trainer whose sharded state lives in tierd
tier-train trains a GPT-style transformer with its parameters, gradients
and optimizer state sharded across MPI ranks and kept in tierd (host RAM
and NVMe) or in private memory.")
endif()

include(CPack)
