# ctest tune.illegal_knobs: a hand edit that breaks a `require` line of a
# knobs file (fwht.run = 16 with fwht.values = 8 overriding sm90.knobs's base)
# must fail the configure, naming the files, the line and the values.
#
#   cmake -DSOURCE=<repo> -DWORK=<dir> -DGENERATOR=Ninja -P illegal_knobs_fail_configure.cmake
file(REMOVE_RECURSE "${WORK}")
file(COPY "${SOURCE}/schedules/" DESTINATION "${WORK}/schedules" FILES_MATCHING PATTERN "*.knobs" PATTERN "*.base")
file(APPEND "${WORK}/schedules/sm90.knobs" "# a hand edit\nfwht.values = 8\n# another\nfwht.run = 16\n")
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE}" -B "${WORK}/build" -G "${GENERATOR}"
                        -DKPOOL_BUILD_TESTS=OFF -DKPOOL_CUDA=ON -DKPOOL_CUDA_FAMILIES=sm90
                        "-DKPOOL_KNOBS_DIR=${WORK}/schedules"
                RESULT_VARIABLE failed OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX REPLACE "[ \n]+" " " out "${out}")
set(expected "cuda.base:[0-9]+: require fwht.run <= fwht.values does not hold for fwht.run = 16, fwht.values = 8 \\(in [^)]*sm90.knobs\\)")
if (NOT failed OR NOT out MATCHES "${expected}")
    message(FATAL_ERROR "the configure took an illegal sm90.knobs (exit ${failed}):\n${out}")
endif ()
message(STATUS "the configure rejected it: ${CMAKE_MATCH_0}")
