# Unity batches that a compiler cache shared by clones can hit.
#
# CMake's unity builds (UNITY_BUILD) write batch files that include each
# source by its absolute path, so the same batch differs from one clone to
# the next and a compiler cache shared by the clones on a machine
# (tools/common.sh: ccache) never hits it. CMake 4.0's
# UNITY_BUILD_RELOCATABLE fixes that; Debian 12 ships CMake 3.25.
#
# hoist_relocatable_unity(), called once at the end of the top-level
# CMakeLists.txt, does what UNITY_BUILD would for every target that has it
# on: its C++ sources (those not marked SKIP_UNITY_BUILD_INCLUSION), in
# batches of UNITY_BUILD_BATCH_SIZE in the order given, become batch files
# in the target's build directory that include them by paths relative to
# the batch file (sources outside the project keep their absolute paths,
# which are the same in every clone); then UNITY_BUILD goes off, so CMake
# writes no batches of its own. A batch file is written only when its
# text changes, so configuring again recompiles nothing.

# hoist_targets_in(OUT DIR): every build-system target defined in DIR and
# the directories below it.
function(hoist_targets_in out dir)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    hoist_targets_in(below "${subdir}")
    list(APPEND targets ${below})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# hoist_write_if_changed(FILE TEXT)
function(hoist_write_if_changed file text)
  if(EXISTS "${file}")
    file(READ "${file}" old)
    if(old STREQUAL text)
      return()
    endif()
  endif()
  file(WRITE "${file}" "${text}")
endfunction()

# hoist_unity_batches(TARGET): TARGET's batches, as described above.
function(hoist_unity_batches target)
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  get_target_property(binary_dir ${target} BINARY_DIR)
  get_target_property(size ${target} UNITY_BUILD_BATCH_SIZE)
  if(NOT size)
    set(size 8)
  endif()
  set(batch_dir "${binary_dir}/hoist_unity/${target}")
  set(kept "")
  set(batched "")
  foreach(source IN LISTS sources)
    if(source MATCHES "^\\$<" OR NOT source MATCHES "\\.(cc|cpp|cxx)$")
      list(APPEND kept "${source}")
      continue()
    endif()
    cmake_path(ABSOLUTE_PATH source BASE_DIRECTORY "${source_dir}"
               NORMALIZE OUTPUT_VARIABLE full)
    get_source_file_property(skip "${full}" DIRECTORY "${source_dir}"
                             SKIP_UNITY_BUILD_INCLUSION)
    if(skip)
      list(APPEND kept "${source}")
      continue()
    endif()
    cmake_path(IS_PREFIX PROJECT_SOURCE_DIR "${full}" NORMALIZE inside)
    if(inside)
      file(RELATIVE_PATH path "${batch_dir}" "${full}")
    else()
      set(path "${full}")
    endif()
    list(APPEND batched "${path}")
  endforeach()
  set(files "")
  set(text "")
  set(count 0)
  list(LENGTH batched total)
  foreach(path IN LISTS batched)
    string(APPEND text "#include \"${path}\"\n")
    math(EXPR count "${count} + 1")
    math(EXPR in_batch "${count} % ${size}")
    if(in_batch EQUAL 0 OR count EQUAL total)
      list(LENGTH files index)
      set(file "${batch_dir}/batch_${index}.cc")
      hoist_write_if_changed("${file}"
        "/* Written by cmake/HoistUnity.cmake. */\n${text}")
      list(APPEND files "${file}")
      set(text "")
    endif()
  endforeach()
  set_property(TARGET ${target} PROPERTY SOURCES ${kept} ${files})
  set_property(TARGET ${target} PROPERTY UNITY_BUILD OFF)
endfunction()

function(hoist_relocatable_unity)
  hoist_targets_in(targets "${PROJECT_SOURCE_DIR}")
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "INTERFACE_LIBRARY" OR type STREQUAL "UTILITY")
      continue()
    endif()
    get_target_property(unity ${target} UNITY_BUILD)
    if(unity)
      hoist_unity_batches(${target})
    endif()
  endforeach()
endfunction()
