# kpool_knobs(<family> <out-var>)
#
# The family's schedule parameters from ${KPOOL_KNOBS_DIR}/<family>.knobs (and
# the base it names, cuda.base for the GPU families), as
# the "name:value,..." string the generators take (knobs=...), read once per
# family by schedules/knobs.py (the one reader, shared with tools/tune): a
# malformed line, a value outside its legal values or a `require` that does
# not hold fails the configure with the file, the line and the values.
# Editing the file re-runs the configure.
function(kpool_knobs family out)
    get_property(knobs GLOBAL PROPERTY KPOOL_KNOBS_${family})
    if (DEFINED knobs AND NOT knobs STREQUAL "")
        set(${out} "${knobs}" PARENT_SCOPE)
        return ()
    endif ()
    set(file "${KPOOL_KNOBS_DIR}/${family}.knobs")
    if (NOT EXISTS "${file}")
        message(FATAL_ERROR "no schedule parameters for ${family}: ${file} is missing")
    endif ()
    if (NOT Python3_EXECUTABLE)
        find_package(Python3 REQUIRED COMPONENTS Interpreter)
    endif ()
    execute_process(COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/schedules/knobs.py" files "${file}"
                    OUTPUT_VARIABLE files OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${file}" ${files})
    execute_process(COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/schedules/knobs.py" wire "${file}"
                    OUTPUT_VARIABLE knobs ERROR_VARIABLE error RESULT_VARIABLE failed
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
    if (failed)
        message(FATAL_ERROR "${error}")
    endif ()
    set_property(GLOBAL PROPERTY KPOOL_KNOBS_${family} "${knobs}")
    set(${out} "${knobs}" PARENT_SCOPE)
endfunction()

# kpool_cuda_family(<family> <prefix>)
#
# The family's row of KPOOL_CUDA_FAMILY_TABLE (CMakeLists.txt) as
# <prefix>_CAPABILITY (e.g. 90), <prefix>_PTX_TARGET (sm_90), <prefix>_PTX_ISA
# (7.8) and <prefix>_FEATURES (a list: e4m3); a family without a row, or a
# malformed row, fails the configure.
function(kpool_cuda_family family prefix)
    set(row "${KPOOL_CUDA_FAMILY_TABLE}")
    list(FILTER row INCLUDE REGEX "^${family}:")
    list(LENGTH row rows)
    if (NOT rows EQUAL 1)
        message(FATAL_ERROR "KPOOL_CUDA_FAMILIES: ${family} needs one row in KPOOL_CUDA_FAMILY_TABLE, has ${rows}")
    endif ()
    if (NOT row MATCHES "^[a-z0-9_]+:([0-9]+):(sm_[0-9]+[a-z]?):([0-9]+\\.[0-9]+):([a-z0-9+]*)$")
        message(FATAL_ERROR "KPOOL_CUDA_FAMILY_TABLE: not \"name:capability:PTX target:PTX ISA:features\": ${row}")
    endif ()
    set(${prefix}_CAPABILITY "${CMAKE_MATCH_1}" PARENT_SCOPE)
    set(${prefix}_PTX_TARGET "${CMAKE_MATCH_2}" PARENT_SCOPE)
    set(${prefix}_PTX_ISA "${CMAKE_MATCH_3}" PARENT_SCOPE)
    string(REPLACE "+" ";" features "${CMAKE_MATCH_4}")
    set(${prefix}_FEATURES "${features}" PARENT_SCOPE)
endfunction()

# kpool_add_kernel(<function> GENERATOR <gen> DEVICE <cpu|family> [PARAMS k=v ...] [GENERATOR_TARGET <target>]
#                  [KNOBS name:value,...] [CANDIDATE <id>] [AUTOSCHEDULER Halide::<name>])
#
# One ahead-of-time kernel variant: a static library whose function is
# <function>, built from generator <gen> of kpool_generators (or of an op's
# own GENERATOR_TARGET, ops/*.toml's generator_sources) for the host CPU
# or for a CUDA GPU family (the schedule in schedules/ tuned for it, with the
# family's knobs, or KNOBS when given: a tuning candidate's), sharing the one
# Halide runtime (kpool_halide_runtime). Every variant is recorded in
# KPOOL_KERNEL_LIBS, and in the dispatch table when it carries a VARIANT line
# (in the tuning candidates' table instead with CANDIDATE).
# A CPU kernel that names a GPU family (PARAMS gpu=<family>: its layout,
# tested on the CPU) gets the knobs of both. COHERENT_LOADS (CUDA): the
# kernel's global loads are coherent ones (cmake/ptx_coherent_loads.py), for
# a kernel that writes memory it also reads through an input. TEST: built
# by kpool_test_generators (the tests' generators and schedules).
function(kpool_add_kernel function)
    cmake_parse_arguments(ARG "COHERENT_LOADS;TEST" "GENERATOR;GENERATOR_TARGET;VARIANT;DEVICE;AUTOSCHEDULER;KNOBS;CANDIDATE"
                          "PARAMS" ${ARGN})
    if (NOT ARG_GENERATOR_TARGET)
        set(ARG_GENERATOR_TARGET kpool_generators)
        if (ARG_TEST)
            set(ARG_GENERATOR_TARGET kpool_test_generators)
        endif ()
    endif ()
    if (DEFINED ARG_KNOBS)
        set(knobs "${ARG_KNOBS}")
    else ()
        kpool_knobs(${ARG_DEVICE} knobs)
    endif ()
    if (ARG_DEVICE STREQUAL "cpu")
        set(features ${KPOOL_CPU_FEATURES})
        set(params ${ARG_PARAMS})
        foreach (param IN LISTS ARG_PARAMS)
            if (param MATCHES "^gpu=(.+)$" AND NOT DEFINED ARG_KNOBS)
                kpool_knobs(${CMAKE_MATCH_1} family_knobs)
                string(APPEND knobs ",${family_knobs}")
            endif ()
        endforeach ()
    else ()
        set(features ${KPOOL_CUDA_FEATURES})
        kpool_cuda_family(${ARG_DEVICE} family)
        set(params ${ARG_PARAMS} gpu=${ARG_DEVICE})
        if (family_FEATURES)  # (the generator's command line takes no empty value)
            list(JOIN family_FEATURES "+" gpu_features)
            list(APPEND params gpu_features=${gpu_features})
        endif ()
    endif ()
    list(APPEND params knobs=${knobs})
    # An op's own generator (ops/*.toml's generator_sources) takes the
    # table's parameters alone: kpool's knobs and families are kpool_generators'
    # (and kpool_test_generators', whose GPU layouts on the CPU read them).
    if (NOT ARG_GENERATOR_TARGET STREQUAL "kpool_generators" AND NOT ARG_TEST)
        set(params ${ARG_PARAMS})
    endif ()
    # The generator's command line for this variant, for tests that emit
    # its lowered Stmt (-e conceptual_stmt).
    list(JOIN features "-" feature_list)
    set_property(GLOBAL PROPERTY KPOOL_GENERATOR_ARGS_${function}
                 -g ${ARG_GENERATOR} target=${KPOOL_CPU_TARGET}-${feature_list}-no_runtime ${params})
    set(extra_outputs)
    if (KPOOL_INSPECT)
        set(extra_outputs STMT_HTML ASSEMBLY)
    endif ()
    if (ARG_AUTOSCHEDULER)
        # The generator's schedule() steps aside; the plugin schedules it.
        list(APPEND extra_outputs AUTOSCHEDULER ${ARG_AUTOSCHEDULER})
    endif ()
    add_halide_library(${function} FROM ${ARG_GENERATOR_TARGET}
                       GENERATOR ${ARG_GENERATOR}
                       FUNCTION_NAME ${function}
                       TARGETS ${KPOOL_CPU_TARGET}
                       FEATURES ${features}
                       PARAMS ${params}
                       USE_RUNTIME kpool_halide_runtime
                       ${extra_outputs})
    if (ARG_COHERENT_LOADS AND NOT ARG_DEVICE STREQUAL "cpu")
        add_custom_command(OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/${function}.h" APPEND
                           COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/cmake/ptx_coherent_loads.py"
                                   "${CMAKE_CURRENT_BINARY_DIR}/${function}${CMAKE_C_OUTPUT_EXTENSION}")
    endif ()
    if (NOT ARG_DEVICE STREQUAL "cpu")
        # Halide writes sm_80 PTX: raise its header to the family's target
        # and ISA in the object (the family's instructions need them), and
        # assemble every module with ptxas for that target (an error fails
        # the build) into the SASS the library embeds (kpool_embed_sass).
        add_custom_command(OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/${function}.h" APPEND
                           COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/cmake/ptx_for_family.py"
                                   "${CMAKE_CURRENT_BINARY_DIR}/${function}${CMAKE_C_OUTPUT_EXTENSION}"
                                   --ptxas "${KPOOL_PTXAS}" --target ${family_PTX_TARGET} --isa ${family_PTX_ISA}
                                   --sass "${CMAKE_CURRENT_BINARY_DIR}/${function}.sass"
                                   --maxrregcount ${KPOOL_CUDA_MAX_REGISTERS})
        set_property(GLOBAL APPEND PROPERTY KPOOL_SASS_MANIFESTS "${CMAKE_CURRENT_BINARY_DIR}/${function}.sass")
        set_property(GLOBAL APPEND PROPERTY KPOOL_SASS_DEPENDS "${CMAKE_CURRENT_BINARY_DIR}/${function}.h")
    endif ()
    set_property(GLOBAL APPEND PROPERTY KPOOL_KERNEL_LIBS ${function})
    if (ARG_VARIANT AND DEFINED ARG_CANDIDATE)
        set_property(GLOBAL APPEND PROPERTY KPOOL_CANDIDATE_LINES "${ARG_CANDIDATE}, ${ARG_DEVICE}, ${ARG_VARIANT}")
        set_property(GLOBAL APPEND PROPERTY KPOOL_VARIANT_HEADERS "${function}.h")
    elseif (ARG_VARIANT)
        set_property(GLOBAL APPEND PROPERTY KPOOL_VARIANT_LINES "${ARG_DEVICE}, ${ARG_VARIANT}")
        set_property(GLOBAL APPEND PROPERTY KPOOL_VARIANT_HEADERS "${function}.h")
    endif ()
endfunction()

# Writes the dispatch table the runtime includes: every kernel header, then
# one X-macro line per variant:
# X(device, kind, pool size or 0, element type or none, arithmetic or any, function),
# and one per tuning candidate's kernel (none outside tuning builds):
# X(candidate id, device, kind, ...).
function(kpool_write_variant_table file)
    get_property(headers GLOBAL PROPERTY KPOOL_VARIANT_HEADERS)
    set(text "// Generated by cmake/KpoolKernels.cmake: the kernel variants built.\n")
    foreach (h IN LISTS headers)
        string(APPEND text "#include \"${h}\"\n")
    endforeach ()
    foreach (table IN ITEMS VARIANT CANDIDATE)
        get_property(lines GLOBAL PROPERTY KPOOL_${table}_LINES)
        string(APPEND text "\n#define KPOOL_FOR_EACH_${table}(X) \\\n")
        foreach (l IN LISTS lines)
            string(APPEND text "    X(${l}) \\\n")
        endforeach ()
    endforeach ()
    string(APPEND text "\n")
    file(CONFIGURE OUTPUT "${file}" CONTENT "${text}" @ONLY)
endfunction()

# kpool_embed_sass(<out-var>)
#
# The generated C++ source that embeds the SASS of every CUDA kernel added so
# far (cmake/embed_sass.py; runtime/cuda_module_loader.cpp loads it), in
# <out-var>: a source of the library.
function(kpool_embed_sass out)
    get_property(manifests GLOBAL PROPERTY KPOOL_SASS_MANIFESTS)
    get_property(kernel_headers GLOBAL PROPERTY KPOOL_SASS_DEPENDS)
    set(source "${CMAKE_CURRENT_BINARY_DIR}/kpool_sass_images.cpp")
    add_custom_command(OUTPUT "${source}"
                       COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/cmake/embed_sass.py" "${source}"
                               ${manifests}
                       DEPENDS "${PROJECT_SOURCE_DIR}/cmake/embed_sass.py" ${kernel_headers}
                       COMMENT "Embedding the SASS of the CUDA kernels"
                       VERBATIM)
    set(${out} "${source}" PARENT_SCOPE)
endfunction()

# kpool_op_table(<command> ARGS...)
#
# Runs cmake/op_table.py <command> on the op table (KPOOL_OP_TABLE_DIRS):
# a malformed table fails the configure, naming the file; editing a table
# file re-runs the configure.
function(kpool_op_table command)
    if (NOT Python3_EXECUTABLE)
        find_package(Python3 REQUIRED COMPONENTS Interpreter)
    endif ()
    set(tables)
    foreach (dir IN LISTS KPOOL_OP_TABLE_DIRS)
        list(APPEND tables --table "${dir}")
        file(GLOB files CONFIGURE_DEPENDS "${dir}/*.toml")
        set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${files})
    endforeach ()
    set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
                 "${PROJECT_SOURCE_DIR}/cmake/op_table.py")
    execute_process(COMMAND "${Python3_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/cmake/op_table.py" ${command} ${tables}
                            ${ARGN}
                    ERROR_VARIABLE error RESULT_VARIABLE failed ERROR_STRIP_TRAILING_WHITESPACE)
    if (failed)
        message(FATAL_ERROR "${error}")
    endif ()
endfunction()

# kpool_add_op_kernels(<cpu|family> AXES <axis>=<v1>,<v2>... [CANDIDATE <id> KNOBS <knobs> OPS <tune ops>
#                      [AUTOSCHEDULER Halide::<name>]])
#
# The device's kernel variants of the op table: every [[kernel]] the device
# runs, over the values AXES gives its axes (those AXES leaves out: the
# table's own, ops/axes.toml), each a kpool_add_kernel() with its dispatch
# table line. With CANDIDATE, the kernels the table marks `tune` with one of
# OPS, each function named with _c<id>. Only the ops KPOOL_KERNEL_OPS names
# (all when empty).
function(kpool_add_op_kernels device)
    cmake_parse_arguments(ARG "" "CANDIDATE;KNOBS;AUTOSCHEDULER" "OPS;AXES" ${ARGN})
    set(args --device ${device})
    if (NOT device STREQUAL "cpu")
        list(APPEND args --cuda)
    endif ()
    foreach (axis IN LISTS ARG_AXES)
        list(APPEND args --axis ${axis})
    endforeach ()
    set(candidate)
    set(c "")
    if (DEFINED ARG_CANDIDATE)
        set(c "_c${ARG_CANDIDATE}")
        set(candidate CANDIDATE ${ARG_CANDIDATE} KNOBS ${ARG_KNOBS})
        if (DEFINED ARG_AUTOSCHEDULER)
            list(APPEND candidate AUTOSCHEDULER ${ARG_AUTOSCHEDULER})
        endif ()
        list(JOIN ARG_OPS "," tune_ops)
        list(APPEND args --candidate ${ARG_CANDIDATE} --tune ${tune_ops})
    endif ()
    if (KPOOL_KERNEL_OPS)
        list(JOIN KPOOL_KERNEL_OPS "," kernel_ops)
        list(APPEND args --kernel-ops ${kernel_ops})
    endif ()
    set(file "${CMAKE_CURRENT_BINARY_DIR}/op_kernels/${device}${c}.cmake")
    kpool_op_table(kernels ${args} --out "${file}")
    include("${file}")  # (uses device and candidate)
endfunction()
