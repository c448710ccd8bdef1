# The Python interpreter the binding is built for and tested with: Debian's /usr/bin/python3
# when it exists (it sees python3-numpy and python3-torch; a pyenv python3 earlier on PATH does
# not), else whatever find_package(Python3) finds. Override with -DPython3_EXECUTABLE=...
if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python interpreter for the tierd module")
endif()
