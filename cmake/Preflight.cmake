# Before project(): every build dependency hoist cannot do without, checked
# at once, so that a build where some are missing (`pip install` of the
# sdist on a bare machine) stops with one message that lists them all and
# how to install them, rather than at the first find_package deep in the
# configure. Optional ones (liburing, MPI, CUDA, pyarrow) are not checked:
# the build goes on without them.

# Where headers are looked for: the system's, and those a user points at.
set(hoist_include_dirs /usr/include /usr/local/include)
foreach(var CPATH CPLUS_INCLUDE_PATH)
  if(DEFINED ENV{${var}})
    string(REPLACE ":" ";" dirs "$ENV{${var}}")
    list(APPEND hoist_include_dirs ${dirs})
  endif()
endforeach()
foreach(prefix ${CMAKE_PREFIX_PATH} $ENV{CMAKE_PREFIX_PATH} $ENV{CONDA_PREFIX})
  list(APPEND hoist_include_dirs "${prefix}/include")
endforeach()

set(hoist_missing "")
set(hoist_debian "")
set(hoist_rhel "")
# hoist_need(WHAT FOUND DEBIAN RHEL)
macro(hoist_need what found debian rhel)
  if(NOT ${found})
    list(APPEND hoist_missing "${what}")
    list(APPEND hoist_debian ${debian})
    list(APPEND hoist_rhel ${rhel})
  endif()
endmacro()

if(DEFINED CMAKE_CXX_COMPILER)
  find_program(hoist_cxx NAMES "${CMAKE_CXX_COMPILER}")
elseif(DEFINED ENV{CXX})
  find_program(hoist_cxx NAMES "$ENV{CXX}")
else()
  find_program(hoist_cxx NAMES c++ g++ clang++)
endif()
hoist_need("a C++20 compiler (g++ 10 or later, or clang 14 or later)"
           hoist_cxx g++ gcc-c++)
find_program(hoist_pkg_config NAMES pkg-config pkgconf)
hoist_need("pkg-config" hoist_pkg_config pkg-config pkgconf-pkg-config)
foreach(dep
    "abseil|absl/status/statusor.h|libabsl-dev|abseil-cpp-devel"
    "nlohmann-json|nlohmann/json.hpp|nlohmann-json3-dev|json-devel"
    "CLI11|CLI/CLI.hpp|libcli11-dev|cli11-devel"
    "xxHash|xxhash.h|libxxhash-dev|xxhash-devel")
  string(REPLACE "|" ";" dep "${dep}")
  list(GET dep 0 name)
  list(GET dep 1 header)
  list(GET dep 2 debian)
  list(GET dep 3 rhel)
  string(MAKE_C_IDENTIFIER "hoist_header_${header}" var)
  find_file(${var} NAMES "${header}" PATHS ${hoist_include_dirs}
            NO_DEFAULT_PATH)
  hoist_need("${name} (${header})" ${var} ${debian} ${rhel})
endforeach()

if(hoist_missing)
  list(JOIN hoist_missing "\n  - " missing)
  list(JOIN hoist_debian " " debian)
  list(JOIN hoist_rhel " " rhel)
  message(FATAL_ERROR
    "\nhoist cannot be built here: these build dependencies are missing:\n"
    "  - ${missing}\n"
    "Install them, then build again:\n"
    "  Debian, Ubuntu:      apt-get install ${debian}\n"
    "  RHEL, Fedora, Rocky: dnf install ${rhel}"
    "   (abseil and CLI11 from EPEL on RHEL)\n"
    "Or install a prebuilt wheel, which needs none of them: "
    "pip install --only-binary :all: hoist-checkpoint\n"
    "(Headers are looked for in: ${hoist_include_dirs}; set CPATH or "
    "CMAKE_PREFIX_PATH for others.)\n")
endif()
