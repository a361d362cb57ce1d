# kpool_install_sdk(KERNELS <kernel library> ... HALIDE_RUNTIME <runtime library>)
#
# The C/C++ SDK that `cmake --install <build> --prefix <dir>` writes:
#
#   include/kpool/kpool.h, kpool.hpp   the C API and its C++ wrapper
#   include/kpool/torch.hpp            header-only ops for engines built with torch's C++ API
#   lib/libkpool.a                     the runtime, every kernel variant and the Halide runtime, as
#                                      one object whose only global kpool and Halide symbols are
#                                      the C API (the op table's version script, build/kpool.map)
#   lib/libkpool.so[.0.1[.0]]          the same as one shared object, exporting the C API only
#                                      (version script build/kpool.map; SONAME libkpool.so.0.1.<build>)
#   lib/cmake/kpool/                   find_package(kpool CONFIG): kpool::kpool (the archive)
#                                      and kpool::kpool_shared
#   lib/pkgconfig/kpool.pc             pkg-config --cflags --libs kpool (--static: the archive)
#   bin/kpool                          the command-line tool (tools/)
#
# An engine links it without Halide and without this source tree: the
# kernels are machine code (CPU) and PTX (CUDA) inside the libraries, and
# the headers include nothing but <stdint.h>. Every path is relative to the
# prefix, so an installed copy can be moved.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

function(kpool_install_sdk)
    cmake_parse_arguments(ARG "" "HALIDE_RUNTIME" "KERNELS" ${ARGN})

    # In the build, `kpool` is an archive of the runtime alone, beside one
    # archive per kernel variant and the Halide runtime's, linked in that
    # order. An engine gets one archive: each of those archives one object
    # file (the generator's output, a source of its target), and kpool_static
    # takes those objects as its own, after the runtime's.
    set(kernel_objects)
    set(runtime_object)
    foreach (lib IN LISTS ARG_KERNELS ARG_HALIDE_RUNTIME)
        get_target_property(sources ${lib} SOURCES)
        get_target_property(dir ${lib} BINARY_DIR)
        foreach (source IN LISTS sources)
            if (NOT source MATCHES "\\${CMAKE_CXX_OUTPUT_EXTENSION}$")
                message(FATAL_ERROR "kpool_install_sdk: ${lib} is built from ${source}, not from an object file")
            endif ()
            cmake_path(ABSOLUTE_PATH source BASE_DIRECTORY "${dir}")
            list(APPEND kernel_objects "${source}")
            if (lib STREQUAL ARG_HALIDE_RUNTIME)
                set(runtime_object "${source}")
            endif ()
        endforeach ()
    endforeach ()
    # All of them linked into one object whose only global kpool and Halide
    # symbols are the C API (cmake/KpoolLocalize.cmake): the archive links
    # beside another Halide runtime.
    set(sdk_object "${PROJECT_BINARY_DIR}/sdk/kpool_sdk${CMAKE_CXX_OUTPUT_EXTENSION}")
    add_custom_command(OUTPUT "${sdk_object}"
                       COMMAND "${CMAKE_COMMAND}" "-DLINKER=${CMAKE_LINKER}" "-DNM=${CMAKE_NM}"
                               "-DOBJCOPY=${CMAKE_OBJCOPY}" "-DREADELF=${CMAKE_READELF}" "-DEXPORTS=${KPOOL_VERSION_SCRIPT}"
                               "-DOBJECTS=$<TARGET_OBJECTS:kpool>;${kernel_objects}" "-DHALIDE_RUNTIME=${runtime_object}"
                               "-DOUTPUT=${sdk_object}"
                               -P "${PROJECT_SOURCE_DIR}/cmake/KpoolLocalize.cmake"
                       DEPENDS kpool $<TARGET_OBJECTS:kpool> ${kernel_objects} ${ARG_KERNELS} ${ARG_HALIDE_RUNTIME}
                               "${KPOOL_VERSION_SCRIPT}" "${PROJECT_SOURCE_DIR}/cmake/KpoolLocalize.cmake"
                       COMMENT "libkpool.a: one object, kpool's and Halide's internal symbols local"
                       VERBATIM)
    add_library(kpool_static STATIC "${sdk_object}")
    set_source_files_properties("${sdk_object}" PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
    # build/sdk/libkpool.a (build/libkpool.a is the runtime-only archive),
    # linked as C++ even into a C program (the package says so).
    set_target_properties(kpool_static PROPERTIES
                          OUTPUT_NAME kpool
                          EXPORT_NAME kpool
                          LINKER_LANGUAGE CXX
                          ARCHIVE_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/sdk")
    # The Halide runtime runs its thread pool on pthreads and loads the CUDA
    # driver with dlopen.
    target_link_libraries(kpool_static INTERFACE Threads::Threads ${CMAKE_DL_LIBS})
    set_target_properties(kpool_shared PROPERTIES EXPORT_NAME kpool_shared)

    # A sanitize build's libraries call the sanitizers' runtimes, which only
    # the program's link brings in: its package says so, and a consumer is
    # built and linked under the same sanitizers. clang's C driver leaves out
    # their C++ parts (UBSan's vptr check, ASan's operator new), which
    # kpool's C++ needs even in a C program, and those parts call the C++
    # runtime (gcc's sanitizer runtimes are whole shared libraries).
    set(sanitize_link_flags ${KPOOL_SANITIZE_FLAGS})
    set(sanitize_link_libraries)
    if (KPOOL_SANITIZE AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
        list(APPEND sanitize_link_flags -fsanitize-link-c++-runtime)
        list(APPEND sanitize_link_libraries stdc++)
    endif ()
    foreach (target IN ITEMS kpool_static kpool_shared)
        target_include_directories(${target} INTERFACE
                                   $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                   $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
        target_compile_options(${target} INTERFACE ${KPOOL_SANITIZE_FLAGS})
        target_link_options(${target} INTERFACE ${sanitize_link_flags})
        target_link_libraries(${target} INTERFACE ${sanitize_link_libraries})
    endforeach ()

    set(cmake_dir "${CMAKE_INSTALL_LIBDIR}/cmake/kpool")
    install(TARGETS kpool_static kpool_shared EXPORT kpool_targets
            ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT sdk
            LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT sdk)
    install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/kpool" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
            COMPONENT sdk)
    install(EXPORT kpool_targets NAMESPACE kpool:: FILE kpoolTargets.cmake DESTINATION "${cmake_dir}"
            COMPONENT sdk)

    set(package_dir "${PROJECT_BINARY_DIR}/sdk/package")
    file(CONFIGURE OUTPUT "${package_dir}/kpoolConfig.cmake" @ONLY CONTENT [=[
# kpool @PROJECT_VERSION@: kpool::kpool (static: libkpool.a, kernels and
# Halide runtime included) and kpool::kpool_shared (libkpool.so).
include(CMakeFindDependencyMacro)
find_dependency(Threads)
include("${CMAKE_CURRENT_LIST_DIR}/kpoolTargets.cmake")
]=])
    # 0.x: a minor release may change the API.
    write_basic_package_version_file("${package_dir}/kpoolConfigVersion.cmake"
                                     VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMinorVersion)
    install(FILES "${package_dir}/kpoolConfig.cmake" "${package_dir}/kpoolConfigVersion.cmake"
            DESTINATION "${cmake_dir}" COMPONENT sdk)

    # pkg-config: the prefix is found from the .pc file's own place. Libs is
    # the shared library; Libs.private what the archive needs besides
    # (--static), the C++ runtime included for C programs.
    set(pc_dir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
    file(RELATIVE_PATH pc_to_prefix "/prefix/${pc_dir}" "/prefix")
    string(REGEX REPLACE "/$" "" pc_to_prefix "${pc_to_prefix}")
    set(pc_cflags "-I\${includedir}" ${KPOOL_SANITIZE_FLAGS})
    list(TRANSFORM sanitize_link_libraries PREPEND -l OUTPUT_VARIABLE pc_sanitize_libraries)
    set(pc_libs "-L\${libdir}" -lkpool ${sanitize_link_flags} ${pc_sanitize_libraries})
    set(pc_libs_private -lstdc++ -lm -pthread)
    if (CMAKE_DL_LIBS)
        list(APPEND pc_libs_private -l${CMAKE_DL_LIBS})
    endif ()
    list(JOIN pc_cflags " " pc_cflags)
    list(JOIN pc_libs " " pc_libs)
    list(JOIN pc_libs_private " " pc_libs_private)
    file(CONFIGURE OUTPUT "${package_dir}/kpool.pc" @ONLY CONTENT [=[
prefix=${pcfiledir}/@pc_to_prefix@
includedir=${prefix}/@CMAKE_INSTALL_INCLUDEDIR@
libdir=${prefix}/@CMAKE_INSTALL_LIBDIR@

Name: kpool
Description: Ahead-of-time kernels for the key-pooling sparse-attention indexer (C and C++ API)
Version: @PROJECT_VERSION@
Cflags: @pc_cflags@
Libs: @pc_libs@
Libs.private: @pc_libs_private@
]=])
    install(FILES "${package_dir}/kpool.pc" DESTINATION "${pc_dir}" COMPONENT sdk)
endfunction()
