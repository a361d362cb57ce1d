# families.add_family (cmake -P, registered in tests/CMakeLists.txt): a GPU
# family is its row of the family table and its knobs file. This configures a
# build of this source tree that adds one family by those two alone (a row
# for sm_89 / PTX 8.1 with the e4m3 conversion; sm90's knobs as its
# parameters, in a copy of the knobs directory), reusing this build's
# generator, and builds two of its kernels: their PTX raised to .target sm_89
# and assembled by ptxas for sm_89 (the build fails otherwise), SASS kept for
# the library; and the runtime's family list names it. Not run: no GPU here.
#
# -D: SOURCE_DIR KPOOL_BUILD_DIR WORK_DIR GENERATOR MAKE_PROGRAM FAMILY_TABLE
#     (the build's rows) KNOBS_DIR PYTHON
cmake_minimum_required(VERSION 3.28)

set(family sm89)
set(row "${family}:89:sm_89:8.1:e4m3")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(COPY "${KNOBS_DIR}/" DESTINATION "${WORK_DIR}/schedules" FILES_MATCHING PATTERN "*.knobs" PATTERN "*.base")
file(COPY_FILE "${KNOBS_DIR}/sm90.knobs" "${WORK_DIR}/schedules/${family}.knobs")

function(run what)
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if (NOT status EQUAL 0)
        message(FATAL_ERROR "${what} failed (${status}):\n${out}")
    endif ()
    message(STATUS "${what}: done")
endfunction()

# The table (a list) through an initial cache: a -D would split it.
list(APPEND FAMILY_TABLE "${row}")
file(WRITE "${WORK_DIR}/family_table.cmake"
     "set(KPOOL_CUDA_FAMILY_TABLE \"${FAMILY_TABLE}\" CACHE STRING \"\")\n")
run("configure a build with the ${family} row"
    "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${build}" -G "${GENERATOR}" "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}"
    -C "${WORK_DIR}/family_table.cmake"
    "-DPython3_EXECUTABLE=${PYTHON}" -DKPOOL_BUILD_TESTS=OFF -DKPOOL_CUDA_FAMILIES=${family}
    "-DKPOOL_KNOBS_DIR=${WORK_DIR}/schedules"
    # This build's generator binary, not a second compile of it.
    "-Dkpool-halide_generators_ROOT=${KPOOL_BUILD_DIR}/cmake")
set(kernels kpool_${family}_fwht128_quant_fp8_words kpool_${family}_compress_to_cache_p4_bf16_triton)
run("build ${kernels}" "${CMAKE_COMMAND}" --build "${build}" --target ${kernels})

foreach (kernel IN LISTS kernels)
    file(READ "${build}/${kernel}.o" object HEX)
    string(HEX ".target sm_89\n" target)
    string(FIND "${object}" "${target}" at)
    if (at EQUAL -1)
        message(FATAL_ERROR "${kernel}.o: its PTX is not raised to .target sm_89")
    endif ()
    file(STRINGS "${build}/${kernel}.sass" modules)
    list(GET modules 0 module)
    string(REGEX REPLACE "^.* " "" cubin "${module}")
    if (NOT EXISTS "${cubin}")
        message(FATAL_ERROR "${kernel}: no SASS assembled for sm_89 (${build}/${kernel}.sass)")
    endif ()
endforeach ()
# The e4m3 feature of the row reached the schedule: sm_89's conversion instruction.
file(STRINGS "${build}/kpool_${family}_fwht128_quant_fp8_words.o" conversion REGEX "cvt.rn.satfinite.e4m3x2.f32")
if (NOT conversion)
    message(FATAL_ERROR "kpool_${family}_fwht128_quant_fp8_words: no cvt.rn.satfinite.e4m3x2.f32 (the row's e4m3)")
endif ()
file(READ "${build}/kpool_families.inc" families)
if (NOT families MATCHES "X\\(${family}, 89\\)")
    message(FATAL_ERROR "kpool_families.inc does not list ${family}: ${families}")
endif ()
message(STATUS "${family}: built, raised to sm_89 / PTX 8.1, ptxas-checked, in the runtime's family list")
