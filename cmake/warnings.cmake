# tier::warnings: the compiler warnings every target of the project is built with (C++ sources
# only; the CUDA kernels and third-party headers are not held to them). TIER_WERROR turns them
# into errors; tools/test (CI) configures with it ON so a new warning fails the build, while a
# developer's default build only reports them.
option(TIER_WERROR "Treat compiler warnings as errors" OFF)

add_library(tier_warnings INTERFACE)
add_library(tier::warnings ALIAS tier_warnings)
target_compile_options(tier_warnings INTERFACE
  "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra>"
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${TIER_WERROR}>>:-Werror>)
