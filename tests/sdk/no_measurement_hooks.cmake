# A library built without KPOOL_MEASUREMENT_HOOKS reads no measurement
# environment variable: none of their names is in it (the runtime reads an
# environment variable by its name as a string constant).
# -DSHARED=<libkpool.so> -DARCHIVE=<libkpool.a>
foreach (library IN ITEMS "${SHARED}" "${ARCHIVE}")
    foreach (variable IN ITEMS KPOOL_DECODE_LAYOUT KPOOL_CUDA_IMAGE)
        file(STRINGS "${library}" found REGEX "${variable}")
        if (found)
            message(FATAL_ERROR "${library} reads \$${variable}, a measurement hook, without KPOOL_MEASUREMENT_HOOKS")
        endif ()
    endforeach ()
endforeach ()
