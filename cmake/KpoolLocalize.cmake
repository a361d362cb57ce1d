# cmake -P: the SDK archive's one object, with kpool's internals local.
#
#   -DLINKER=ld -DNM=nm -DOBJCOPY=objcopy -DREADELF=readelf -DEXPORTS=build/kpool.map
#   -DOBJECTS="a.o;b.o;..." -DHALIDE_RUNTIME=runtime.o -DOUTPUT=kpool_sdk.o
#
# The runtime's objects, every kernel's and the Halide runtime's are linked
# into one relocatable object (ld -r: the kernels' calls into the Halide
# runtime resolved inside it), whose global symbols of kpool and Halide are
# then made local, except the C API that kpool.map exports. An engine that
# links another Halide-built library gets that library's runtime, and kpool
# keeps its own (no shared halide_* symbol, no silent merge of weak ones).
cmake_minimum_required(VERSION 3.28)
include("${CMAKE_CURRENT_LIST_DIR}/KpoolSymbols.cmake")

function(run)
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if (NOT status EQUAL 0)
        message(FATAL_ERROR "${ARGN} failed (${status}):\n${out}${err}")
    endif ()
    set(run_output "${out}" PARENT_SCOPE)
endfunction()

file(STRINGS "${EXPORTS}" export_lines REGEX "^ +kpool_[a-z0-9_]+;")
set(exports)
foreach (line IN LISTS export_lines)
    string(REGEX REPLACE "^ +(kpool_[a-z0-9_]+);.*$" "\\1" name "${line}")
    list(APPEND exports "${name}")
endforeach ()

set(combined "${OUTPUT}.combined.o")
run("${LINKER}" -r -o "${combined}" ${OBJECTS})
# Everything the Halide runtime defines is kpool's own copy of it.
kpool_nm_symbols("${NM}" runtime_names runtime_types -g --defined-only "${HALIDE_RUNTIME}")
kpool_nm_symbols("${NM}" names types -g --defined-only "${combined}")
set(internal)
foreach (name type IN ZIP_LISTS names types)
    if (name IN_LIST exports)
        continue ()
    endif ()
    # Local: the Halide runtime, kpool's kernels and C++ runtime, and every
    # other strong definition. Kept global: the weak definitions of the C++
    # toolchain (standard library inline functions, the personality
    # routine's DW.ref): they sit in COMDAT groups the program shares, and
    # a local copy of one whose group the linker keeps elsewhere would
    # dangle.
    set(weak OFF)
    if (type MATCHES "^[WwVvu]$")
        set(weak ON)
    endif ()
    if (name IN_LIST runtime_names OR name MATCHES "^(kpool_|halide_)|5kpool|6Halide" OR NOT weak)
        list(APPEND internal "${name}")
    endif ()
endforeach ()
list(REMOVE_DUPLICATES internal)
# An internal symbol that names a COMDAT group (the Halide runtime's inline
# functions) is renamed, not made local: the linker keeps one group per
# name, and another Halide runtime's group of that name, dropped for ours,
# would leave its calls without a target. Under a name of kpool's own the
# group is never shared.
run("${READELF}" -g --wide "${combined}")
string(REGEX MATCHALL "COMDAT group section [^\n]*\] contains" groups "${run_output}")
set(renames)
foreach (group IN LISTS groups)
    string(REGEX REPLACE "^.*`\\.group' \\[(.*)\\] contains$" "\\1" signature "${group}")
    if (signature IN_LIST internal)
        list(REMOVE_ITEM internal "${signature}")
        string(APPEND renames "${signature} kpool_internal.${signature}\n")
    endif ()
endforeach ()
list(JOIN internal "\n" internal_text)
file(WRITE "${OUTPUT}.local" "${internal_text}\n")
file(WRITE "${OUTPUT}.renamed" "${renames}")
run("${OBJCOPY}" "--localize-symbols=${OUTPUT}.local" "--redefine-syms=${OUTPUT}.renamed" "${combined}" "${OUTPUT}")
file(REMOVE "${combined}")
