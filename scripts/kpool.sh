#!/usr/bin/env bash
# One entry point for a fresh machine (python3, a C++ compiler and apt) and
# for every later run: set up what is missing, build, run.
#
#   bash scripts/kpool.sh demo [demo options]   build, then build/tools/kpool demo
#   bash scripts/kpool.sh test [ctest options]  build, then the whole test suite
#   bash scripts/kpool.sh build                 set up and build only
#
# The set-up is idempotent and stays in the project: .venv/ (Halide, CMake and
# Ninja from requirements.txt, CUDA's ptxas and cuobjdump from
# requirements-cuda.txt: no CUDA toolkit needed; for the tests, PyTorch from requirements-torch.txt
# where the machine can take it) and build/. Only GoogleTest comes from the
# system (Debian's libgtest-dev / libgmock-dev), and only when it is missing.
# KPOOL_BUILD_DIR overrides the build directory; KPOOL_TORCH=0 skips PyTorch.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv="$root/.venv"
build_dir=${KPOOL_BUILD_DIR:-$root/build}
jobs=$(nproc 2>/dev/null || echo 4)

log() { printf '[kpool.sh] %s\n' "$*"; }
die() { printf '[kpool.sh] error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# Runs a command as root: directly, or through sudo when we are not root.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        printf '[kpool.sh] need root (or sudo) for: %s\n' "$*" >&2
        return 1
    fi
}

apt_updated=no
apt_install() {
    command -v apt-get >/dev/null 2>&1 || { printf '[kpool.sh] no apt-get to install: %s\n' "$*" >&2; return 1; }
    if [ "$apt_updated" = no ]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update || return 1
        apt_updated=yes
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"
}

# .venv with the system python3, and the pinned requirements in it.
ensure_venv() {
    if [ ! -x "$venv/bin/python" ]; then
        local python
        python=$(command -v python3) || die "python3 not found"
        log "creating .venv with $python"
        if ! "$python" -m venv "$venv"; then
            # Debian and Ubuntu ship venv (ensurepip) as a separate package.
            rm -rf "$venv"
            local version
            version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
            log "installing python3-venv"
            apt_install python3-venv || apt_install "python${version}-venv" ||
                die "cannot create a virtual environment: install python3-venv"
            "$python" -m venv "$venv" || die "python3 -m venv failed"
        fi
    fi
    requirements_installed requirements.txt requirements ||
        install_requirements requirements.txt requirements || die "pip install -r requirements.txt failed"
    # ptxas and cuobjdump (the CUDA families' build and device-code report).
    requirements_installed requirements-cuda.txt cuda-tools ||
        install_requirements requirements-cuda.txt cuda-tools || die "pip install -r requirements-cuda.txt failed"
}

# A requirements file in .venv, stamped with the file's hash (.venv/.kpool-NAME)
# so that a second run skips pip.
requirements_installed() { # FILE NAME
    [ -f "$venv/.kpool-$2" ] && [ "$(cat "$venv/.kpool-$2")" = "$(sha256sum "$1" | cut -d' ' -f1)" ]
}
install_requirements() { # FILE NAME [pip options]
    log "pip install -r $1"
    "$venv/bin/python" -m pip install --disable-pip-version-check "${@:3}" -r "$1" &&
        sha256sum "$1" | cut -d' ' -f1 >"$venv/.kpool-$2"
}

# PyTorch for the custom-operator tests (requirements-torch.txt), when the
# machine can take it: KPOOL_TORCH=0 skips it, so does a disk with less
# than 12 GB free or an index pip cannot reach; the torch tests then skip.
ensure_torch() {
    [ "${KPOOL_TORCH:-1}" = 0 ] && { log "KPOOL_TORCH=0: no torch; its tests skip"; return 0; }
    requirements_installed requirements-torch.txt torch && return 0
    local free_kb
    free_kb=$(df -Pk "$venv" | awk 'NR == 2 { print $4 }')
    if [ "${free_kb:-0}" -lt $((12 * 1024 * 1024)) ]; then
        log "less than 12 GB free: no torch; its tests skip"
        return 0
    fi
    install_requirements requirements-torch.txt torch -q || log "warning: torch could not be installed; its tests skip"
}

have_gtest() { [ -f /usr/include/gtest/gtest.h ] && [ -f /usr/include/gmock/gmock.h ]; }

ensure_gtest() {
    have_gtest && return 0
    log "installing GoogleTest (libgtest-dev libgmock-dev)"
    apt_install libgtest-dev libgmock-dev && have_gtest
}

configure() {
    local with_tests=$1
    shift
    # A build/ configured with another generator cannot be reused with Ninja.
    if [ -f "$build_dir/CMakeCache.txt" ] &&
        ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$build_dir/CMakeCache.txt"; then
        log "$build_dir was configured with another generator; starting it afresh"
        rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
    fi
    local halide_dir
    halide_dir=$("$venv/bin/python" -c 'import halide; print(halide.install_dir())')
    "$venv/bin/cmake" -S "$root" -B "$build_dir" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
        -DCMAKE_PREFIX_PATH="$halide_dir" \
        -DKPOOL_BUILD_TESTS="$with_tests" "$@"
}

build() {
    local start status=0
    start=$(date +%s.%N)
    "$venv/bin/cmake" --build "$build_dir" -j "$jobs" "$@" || status=$?
    log "$(awk -v s="$start" -v e="$(date +%s.%N)" -v j="$jobs" -v st="$status" \
        'BEGIN { printf "build: %.1f s (-j%d)%s", e - s, j, st ? ", FAILED" : "" }')"
    return "$status"
}

command=${1:-help}
[ $# -gt 0 ] && shift
case "$command" in
    demo)
        ensure_venv
        # The demo needs no GoogleTest: without it, build the tool alone.
        with_tests=ON
        ensure_gtest || { log "GoogleTest unavailable: building without the test suite"; with_tests=OFF; }
        configure "$with_tests"
        build --target kpool_cli
        exec "$build_dir/tools/kpool" demo "$@"
        ;;
    test)
        ensure_venv
        ensure_torch
        ensure_gtest || die "GoogleTest is missing and could not be installed (apt-get install libgtest-dev libgmock-dev)"
        configure ON
        build
        "$venv/bin/ctest" --test-dir "$build_dir" --output-on-failure -j "$jobs" "$@"
        # The same suite under AddressSanitizer and UndefinedBehaviorSanitizer,
        # plus a bounded run of every libFuzzer target (the "sanitize"
        # preset's settings: clang, CPU kernels only, the GPU tests skip
        # there anyway). clang and its runtimes (libFuzzer) come from the
        # system (Debian's clang, libclang-rt-dev) when missing; without
        # them the suite runs under gcc's sanitizers, without the fuzzers.
        log "the test suite again under ASan + UBSan, and the fuzzers (build-sanitize/)"
        build_dir="$root/build-sanitize"
        have_libfuzzer() {
            command -v clang++ >/dev/null 2>&1 || return 1
            local probe
            probe=$(mktemp -d)
            printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char *, unsigned long) { return 0; }\n' \
                >"$probe/probe.cpp"
            clang++ -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" >/dev/null 2>&1
            local status=$?
            rm -rf "$probe"
            return "$status"
        }
        sanitize_flags=(-DKPOOL_SANITIZE=ON -DKPOOL_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)
        want_clang=no
        # (Older releases ship libFuzzer with clang itself: no libclang-rt-dev.)
        if have_libfuzzer || { log "installing clang and libFuzzer (clang libclang-rt-dev)" &&
            { apt_install clang libclang-rt-dev || apt_install clang; } && have_libfuzzer; }; then
            sanitize_flags+=(-DCMAKE_C_COMPILER="$(command -v clang)" -DCMAKE_CXX_COMPILER="$(command -v clang++)" -DKPOOL_FUZZ=ON)
            want_clang=yes
        else
            log "warning: no clang with libFuzzer: sanitizers under the default compiler, no fuzzers"
            sanitize_flags+=(-DKPOOL_FUZZ=OFF)
        fi
        # A build-sanitize/ configured with the other compiler starts afresh.
        if [ -f "$build_dir/CMakeCache.txt" ]; then
            has_clang=no
            grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang++$' "$build_dir/CMakeCache.txt" && has_clang=yes
            if [ "$has_clang" != "$want_clang" ]; then
                log "$build_dir was configured with another compiler; starting it afresh"
                rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
            fi
        fi
        configure ON "${sanitize_flags[@]}"
        build
        ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
            exec "$venv/bin/ctest" --test-dir "$build_dir" --output-on-failure -j "$jobs" "$@"
        ;;
    build)
        ensure_venv
        with_tests=ON
        ensure_gtest || { log "GoogleTest unavailable: building without the test suite"; with_tests=OFF; }
        configure "$with_tests"
        build
        ;;
    help | -h | --help)
        usage
        ;;
    *)
        usage >&2
        die "unknown command: $command"
        ;;
esac
