# cmake -P: what the SDK's libraries expose (the version script the op table generates, build/kpool.map).
#   libkpool.so: SONAME libkpool.so.<major>.<minor>.<build>, and its exported
#     functions are exactly the C API: the functions kpool.h declares (and
#     the tuner's kpool_tune_select in a tuning build).
#   sdk/libkpool.a: no global symbol of the Halide runtime or of kpool's
#     internals (kernels, C++ runtime); its kpool_* globals are the C API.
#
# -D: SHARED (libkpool.so) ARCHIVE (sdk/libkpool.a) HEADER (kpool.h) NM READELF VERSION
cmake_minimum_required(VERSION 3.28)

include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/KpoolSymbols.cmake")

function(symbols out)
    kpool_nm_symbols("${NM}" names types ${ARGN})
    list(REMOVE_DUPLICATES names)
    list(SORT names)
    set(${out} "${names}" PARENT_SCOPE)
endfunction()

file(READ "${HEADER}" header)
string(REGEX MATCHALL "[ *](kpool_[a-z0-9_]+)\\(" declared "${header}")
list(TRANSFORM declared REPLACE "^[ *](kpool_[a-z0-9_]+)\\($" "\\1")
list(REMOVE_DUPLICATES declared)
list(SORT declared)

# The names without their version (kpool_version@@KPOOL_0.1), less the
# version node itself and the tuner's entry point (tuning builds only).
symbols(exported -D --defined-only "${SHARED}")
list(TRANSFORM exported REPLACE "@.*$" "")
list(FILTER exported EXCLUDE REGEX "^(KPOOL_[0-9.]+|kpool_tune_select)$")
if (NOT exported STREQUAL declared)
    message(FATAL_ERROR "libkpool.so exports\n  ${exported}\nbut the C API is\n  ${declared}")
endif ()
message(STATUS "libkpool.so exports the C API alone")

execute_process(COMMAND "${READELF}" -d "${SHARED}" OUTPUT_VARIABLE dynamic)
string(REGEX MATCH "Library soname: \\[([a-z0-9._]+)\\]" soname "${dynamic}")
set(soname "${CMAKE_MATCH_1}")
string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" major_minor "${VERSION}")
if (NOT soname MATCHES "^libkpool\\.so\\.${CMAKE_MATCH_1}\\.${CMAKE_MATCH_2}\\.[0-9a-f]+$")
    message(FATAL_ERROR "libkpool.so has SONAME '${soname}', expected libkpool.so.${major_minor}.<build>")
endif ()

symbols(globals -g --defined-only "${ARCHIVE}")
# (kpool_internal.*: the Halide runtime's COMDAT functions under kpool's own
# names, which no other library has.)
set(leaked ${globals})
list(FILTER leaked INCLUDE REGEX "(^halide_|6Halide|^kpool_|5kpool)")
list(FILTER leaked EXCLUDE REGEX "^kpool_internal\\.")
list(REMOVE_ITEM leaked ${declared} kpool_tune_select)
if (leaked)
    list(LENGTH leaked count)
    list(SUBLIST leaked 0 20 some)
    message(FATAL_ERROR "libkpool.a has ${count} global internal symbols, e.g.\n  ${some}")
endif ()
set(api ${globals})
list(FILTER api INCLUDE REGEX "^kpool_")
list(FILTER api EXCLUDE REGEX "^kpool_internal\\.")
list(REMOVE_ITEM api kpool_tune_select)
if (NOT api STREQUAL declared)
    message(FATAL_ERROR "libkpool.a's global kpool symbols are\n  ${api}\nnot the C API\n  ${declared}")
endif ()
message(STATUS "libkpool.a: no global Halide or internal kpool symbol")
