# Cross toolchain for 64-bit ARM Linux with Debian's multiarch packages:
#
#   scripts/setup.sh --arm      (g++-aarch64-linux-gnu, qemu-user, libhwy-dev:arm64, ...)
#   cmake -S . -B build-arm -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DTANDEM_BENCH=OFF
#
# Libraries come from the arm64 -dev packages in /usr/lib/aarch64-linux-gnu (their CMake configs,
# pkg-config files and .so files); headers from /usr/include, which multiarch shares. The C library
# and libstdc++ come from the cross compiler's own tree, /usr/aarch64-linux-gnu. Test binaries run
# on the x86_64 host under qemu-user (ctest and gtest_discover_tests use the emulator below).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(TANDEM_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${TANDEM_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${TANDEM_CROSS_TRIPLE}-g++)
set(CMAKE_LIBRARY_ARCHITECTURE ${TANDEM_CROSS_TRIPLE})

# Search the cross tree first, then the host prefixes; with CMAKE_LIBRARY_ARCHITECTURE set the
# host search covers /usr/lib/aarch64-linux-gnu (and its cmake/ configs) but never the x86_64
# library directories. Programs (pkg-config, protoc, ...) are always the host's.
set(CMAKE_FIND_ROOT_PATH /usr/${TANDEM_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config: only the arm64 .pc files (plus the arch-independent ones), never the host's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/${TANDEM_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# Run cross-built binaries (tests, gtest discovery) under user-mode emulation. -L lets the
# emulated loader find /lib/ld-linux-aarch64.so.1 and libc/libstdc++ in the cross tree; libraries
# that are only in /usr/lib/aarch64-linux-gnu are found through qemu's fallback to host paths.
set(CMAKE_CROSSCOMPILING_EMULATOR "qemu-aarch64;-L;/usr/${TANDEM_CROSS_TRIPLE}")
