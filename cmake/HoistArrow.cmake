# Object storage (S3, GCS) through Apache Arrow's C++ filesystems, taken from
# the pyarrow wheel of a Python that has it: its headers
# (pyarrow.get_include()) and its versioned libraries (libarrow.so.MAJOR00,
# libarrow_s3.so.MAJOR00), linked by their full paths with an rpath to
# pyarrow's directory, so hoist and pyarrow share one copy of Arrow (and of
# its S3 state) in a Python process.
#
# The Python looked at: HOIST_ARROW_PYTHON if set; else the interpreter of a
# Python build (scikit-build's Python_EXECUTABLE); else the project's .venv;
# else python3 on PATH. No pyarrow (or another major version than the one
# hoist is written against) leaves object storage out, and an s3:// or gs://
# root then gets an error saying how to build it in. Sanitizer builds leave
# it out too: Arrow is not built for ASan or TSan.
#
# Sets HOIST_OBJECT_STORE (ON/OFF) and, when ON, HOIST_ARROW_INCLUDE_DIR,
# HOIST_ARROW_LIBRARIES (full paths and the rpath: plain values, not a
# target, so that the installed package's export can name them),
# HOIST_ARROW_LIBRARY_FILES (the paths alone) and HOIST_ARROW_LIB_DIR.
#
# HOIST_OBJECT_STORE_PLUGIN (the Python build's default) puts the object
# stores in a module loaded at the first s3:// or gs:// root
# (src/hoist/io/CMakeLists.txt) instead of linking Arrow into hoist_io.
# The Arrow major versions hoist is built and tested against. The first is
# what python/requirements.txt pins and what the C++ builds use; 25 builds
# the CPython 3.10 wheel (pyarrow 26 needs Python 3.11). HOIST_PYARROW_MAJOR
# becomes the one found.
set(HOIST_PYARROW_MAJORS 26 25)
list(GET HOIST_PYARROW_MAJORS 0 HOIST_PYARROW_MAJOR)
option(HOIST_WITH_OBJECT_STORE
       "Build S3/GCS roots when a Python with pyarrow is found" ON)
set(HOIST_OBJECT_STORE OFF)
set(plugin_default OFF)
if(SKBUILD)
  set(plugin_default ON)
endif()
option(HOIST_OBJECT_STORE_PLUGIN
       "Object stores in a module loaded on first use (Python wheels)"
       ${plugin_default})

function(hoist_find_arrow)
  if(NOT HOIST_WITH_OBJECT_STORE OR HOIST_SANITIZE OR HOIST_TSAN OR HOIST_FUZZ)
    message(STATUS "object storage (S3, GCS): off (option or sanitizer build)")
    return()
  endif()
  set(python "${HOIST_ARROW_PYTHON}")
  if(NOT python AND Python_EXECUTABLE)
    set(python "${Python_EXECUTABLE}")
  endif()
  if(NOT python AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  endif()
  if(NOT python)
    find_program(python NAMES python3)
  endif()
  if(NOT python)
    message(STATUS "object storage (S3, GCS): off (no Python to find pyarrow)")
    return()
  endif()
  execute_process(
    COMMAND "${python}" -c
      "import pyarrow as p; print(p.__version__.split('.')[0]); print(p.get_include()); print(p.get_library_dirs()[0])"
    OUTPUT_VARIABLE out ERROR_QUIET RESULT_VARIABLE rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(STATUS "object storage (S3, GCS): off (no pyarrow in ${python}; "
                   "pip install 'pyarrow==${HOIST_PYARROW_MAJOR}.*')")
    return()
  endif()
  string(REPLACE "\n" ";" out "${out}")
  list(GET out 0 major)
  list(GET out 1 include_dir)
  list(GET out 2 lib_dir)
  if(NOT major IN_LIST HOIST_PYARROW_MAJORS)
    message(STATUS "object storage (S3, GCS): off (pyarrow ${major} in "
                   "${python}; hoist needs pyarrow==${HOIST_PYARROW_MAJOR}.*)")
    return()
  endif()
  set(HOIST_PYARROW_MAJOR ${major} PARENT_SCOPE)
  # Arrow 26 moved S3 out of libarrow into libarrow_s3.
  set(arrow "${lib_dir}/libarrow.so.${major}00")
  set(arrow_s3 "")
  if(major GREATER_EQUAL 26)
    set(arrow_s3 "${lib_dir}/libarrow_s3.so.${major}00")
  endif()
  if(NOT EXISTS "${arrow}" OR (arrow_s3 AND NOT EXISTS "${arrow_s3}")
     OR NOT EXISTS "${include_dir}/arrow/filesystem/s3fs.h")
    message(STATUS "object storage (S3, GCS): off (${lib_dir} lacks "
                   "libarrow or libarrow_s3, or their headers)")
    return()
  endif()
  set(HOIST_ARROW_INCLUDE_DIR "${include_dir}" PARENT_SCOPE)
  set(files ${arrow_s3} "${arrow}")
  set(HOIST_ARROW_LIBRARY_FILES ${files} PARENT_SCOPE)
  set(HOIST_ARROW_LIBRARIES ${files} "-Wl,-rpath,${lib_dir}" PARENT_SCOPE)
  set(HOIST_OBJECT_STORE ON PARENT_SCOPE)
  set(HOIST_ARROW_LIB_DIR "${lib_dir}" PARENT_SCOPE)
  set(HOIST_ARROW_PYTHON_FOUND "${python}" PARENT_SCOPE)
  message(STATUS "object storage (S3, GCS): on (pyarrow ${major}, ${lib_dir})")
endfunction()
hoist_find_arrow()
