# The CUDA device-code tools of the build: ptxas (assembles and checks every
# family's PTX, and builds the embedded SASS) and cuobjdump (the device-code
# report, tools/device_code). Both come first from the pinned PyPI wheels
# (requirements-cuda.txt, installed into .venv by scripts/kpool.sh, and into
# pip's isolated build environment by pyproject.toml), so a machine without
# a CUDA toolkit builds every family; a system toolkit ($CUDA_HOME,
# /usr/local/cuda, PATH) only where the wheels are absent. KPOOL_PTXAS and
# KPOOL_CUOBJDUMP set on the command line win.
#
# kpool_find_cuda_tools(): sets KPOOL_PTXAS (required) and KPOOL_CUOBJDUMP
# (optional: without it the device-code report and its budget test are not
# built).
function(kpool_find_cuda_tools)
    execute_process(COMMAND "${Python3_EXECUTABLE}" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
                    OUTPUT_VARIABLE site OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE failed)
    set(wheel_bins)
    if (NOT failed)
        # nvidia-cuda-nvcc-cu12 and nvidia-cuda-cuobjdump (CUDA 13 layout).
        set(wheel_bins "${site}/nvidia/cuda_nvcc/bin" "${site}/nvidia/cu13/bin")
    endif ()
    find_program(KPOOL_PTXAS ptxas PATHS ${wheel_bins} NO_DEFAULT_PATH)
    find_program(KPOOL_PTXAS ptxas HINTS "$ENV{CUDA_HOME}/bin" /usr/local/cuda/bin)
    if (NOT KPOOL_PTXAS)
        message(FATAL_ERROR "the CUDA families need ptxas: run scripts/kpool.sh (it installs requirements-cuda.txt "
                            "into .venv), or set KPOOL_PTXAS or CUDA_HOME, or build without CUDA: -DKPOOL_CUDA=OFF")
    endif ()
    find_program(KPOOL_CUOBJDUMP cuobjdump PATHS ${wheel_bins} NO_DEFAULT_PATH)
    find_program(KPOOL_CUOBJDUMP cuobjdump HINTS "$ENV{CUDA_HOME}/bin" /usr/local/cuda/bin)
    execute_process(COMMAND "${KPOOL_PTXAS}" --version OUTPUT_VARIABLE version)
    string(REGEX MATCH "release [0-9.]+" version "${version}")
    message(STATUS "kpool: ptxas ${KPOOL_PTXAS} (${version}); cuobjdump ${KPOOL_CUOBJDUMP}")
endfunction()
