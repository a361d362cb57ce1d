# sdk.install_and_consume (cmake -P, registered in tests/CMakeLists.txt):
# installs the build into a fresh prefix, builds examples/consumer against
# that prefix alone (the build's generator and compilers, no Halide, no
# source tree) and runs its programs; then, when pkg-config is there,
# compiles consumer_c.c with `pkg-config --cflags --libs kpool` (the shared
# library) and with `--static` (the archive) and runs both.
#
# -D: KPOOL_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR MAKE_PROGRAM
#     C_COMPILER CXX_COMPILER BUILD_TYPE PKG_CONFIG (empty: none)
cmake_minimum_required(VERSION 3.28)

# Runs a command; on success prints its last line and leaves its whole
# output in run_output, on failure stops the test with all of it.
function(run what)
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if (NOT status EQUAL 0)
        message(FATAL_ERROR "${what} failed (${status}):\n${out}")
    endif ()
    string(STRIP "${out}" out)
    string(REGEX REPLACE "^.*\n" "" last_line "${out}")
    if (last_line STREQUAL "")
        set(last_line "done")
    endif ()
    message(STATUS "${what}: ${last_line}")
    set(run_output "${out}" PARENT_SCOPE)
endfunction()

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/consumer")
file(REMOVE_RECURSE "${WORK_DIR}")

execute_process(COMMAND "${CMAKE_COMMAND}" --install "${KPOOL_BUILD_DIR}" --prefix "${prefix}"
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
if (NOT status EQUAL 0)
    message(FATAL_ERROR "cmake --install failed (${status}):\n${out}")
endif ()

# The SDK is the C/C++ product alone: the Python package's files (the
# torch call extension, its copy of libkpool.so) install only with
# `--component python` (pip).
file(GLOB_RECURSE python_files "${prefix}/*_torch_calls*" "${prefix}/kpool/*")
if (python_files)
    message(FATAL_ERROR "cmake --install wrote the Python package's files into the SDK: ${python_files}")
endif ()

# The package alone: no package registries, nothing but the prefix to search.
run("configure the consumer"
    "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${consumer_build}" -G "${GENERATOR}"
    "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}" "-DCMAKE_C_COMPILER=${C_COMPILER}"
    "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
    "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
    -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
file(STRINGS "${consumer_build}/CMakeCache.txt" kpool_dir REGEX "^kpool_DIR:")
string(REGEX REPLACE "^kpool_DIR:[A-Z]*=" "" kpool_dir "${kpool_dir}")
cmake_path(IS_PREFIX prefix "${kpool_dir}" NORMALIZE in_prefix)
if (NOT in_prefix)
    message(FATAL_ERROR "the consumer found kpool in ${kpool_dir}, not in ${prefix}")
endif ()
run("build the consumer" "${CMAKE_COMMAND}" --build "${consumer_build}")
run("consumer (C++ API, kpool::kpool)" "${consumer_build}/consumer")
run("consumer_c (C API, kpool::kpool_shared)" "${consumer_build}/consumer_c")

if (NOT PKG_CONFIG)
    message(STATUS "pkg-config not found: the kpool.pc check is skipped")
    return()
endif ()
set(pc_dir)
foreach (dir IN ITEMS lib lib64 lib/x86_64-linux-gnu)
    if (EXISTS "${prefix}/${dir}/pkgconfig/kpool.pc")
        set(pc_dir "${prefix}/${dir}/pkgconfig")
    endif ()
endforeach ()
if (NOT pc_dir)
    message(FATAL_ERROR "no kpool.pc under ${prefix}")
endif ()
set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
set(ENV{PKG_CONFIG_LIBDIR} "${pc_dir}")
run("pkg-config --modversion kpool" "${PKG_CONFIG}" --modversion kpool)
set(version "${run_output}")
run("pkg-config --variable=libdir kpool" "${PKG_CONFIG}" --variable=libdir kpool)
set(libdir "${run_output}")
run("pkg-config --cflags --libs kpool" "${PKG_CONFIG}" --cflags --libs kpool)
separate_arguments(shared_flags UNIX_COMMAND "${run_output}")
run("pkg-config --static --cflags --libs kpool" "${PKG_CONFIG}" --static --cflags --libs kpool)
separate_arguments(static_flags UNIX_COMMAND "${run_output}")
# --static lists the archive's own needs (Libs.private); -lkpool would still
# pick libkpool.so, so name the archive.
list(TRANSFORM static_flags REPLACE "^-lkpool$" "${libdir}/libkpool.a")

set(source "${CONSUMER_SOURCE_DIR}/consumer_c.c")
set(define "-DKPOOL_EXPECTED_VERSION=\"${version}\"")
run("cc consumer_c.c $(pkg-config --cflags --libs kpool)"
    "${C_COMPILER}" "${define}" "${source}" -o "${WORK_DIR}/consumer_c_pc" ${shared_flags} "-Wl,-rpath,${libdir}")
run("consumer_c (pkg-config, libkpool.so)" "${WORK_DIR}/consumer_c_pc")
run("cc consumer_c.c $(pkg-config --static --cflags --libs kpool)"
    "${C_COMPILER}" "${define}" "${source}" -o "${WORK_DIR}/consumer_c_pc_static" ${static_flags})
# No rpath here: were libkpool.so linked instead of the archive, it would
# not load.
run("consumer_c (pkg-config --static, libkpool.a)" "${WORK_DIR}/consumer_c_pc_static")

# kpool's archive beside another Halide AOT library with its own runtime
# (an engine's own Halide kernels): one program, both run.
set(other_includes ${OTHER_HALIDE_INCLUDE})
list(TRANSFORM other_includes PREPEND "-I")
run("cc two_runtimes.c libkpool.a <another Halide library and its runtime>"
    "${C_COMPILER}" "${TWO_RUNTIMES_SOURCE}" -o "${WORK_DIR}/two_runtimes" ${other_includes} ${static_flags}
    ${OTHER_HALIDE_LIBS} -pthread -ldl)
run("two_runtimes (libkpool.a beside another Halide runtime)" "${WORK_DIR}/two_runtimes")
