# For cmake -P scripts: the symbols `nm ARGS FILE` lists, parsed.
#
# kpool_nm_symbols(<nm> <names_var> <types_var> ARGS...): the names and, in
# the same order, nm's one-letter types (T, W, V, u, ...) of the symbols
# that `<nm> --format=posix ARGS...` lists; stops the script on failure.
function(kpool_nm_symbols nm names_var types_var)
    execute_process(COMMAND "${nm}" --format=posix ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE text
                    ERROR_VARIABLE err)
    if (NOT status EQUAL 0)
        message(FATAL_ERROR "nm ${ARGN} failed (${status}): ${err}")
    endif ()
    string(REGEX MATCHALL "[^\n]+" lines "${text}")
    set(names)
    set(types)
    foreach (line IN LISTS lines)
        if (line MATCHES "^([^ ]+) ([A-Za-z]) ")
            list(APPEND names "${CMAKE_MATCH_1}")
            list(APPEND types "${CMAKE_MATCH_2}")
        endif ()
    endforeach ()
    set(${names_var} "${names}" PARENT_SCOPE)
    set(${types_var} "${types}" PARENT_SCOPE)
endfunction()
