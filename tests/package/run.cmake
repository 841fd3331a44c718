# Installs the built fsdp into BUILD_DIR/package-test/install, checks that the
# installed package names no library by an absolute path of this machine,
# then configures the consumer project in SOURCE_DIR against it where zlib and
# nlohmann-json cannot be found (a consumer needs LibTorch, and PCRE2, ICU and
# libsentencepiece for fsdp::tokenizers), builds it, and runs its tests: the
# exported fsdp::fsdp-run starts it as 2 ranks (all_reduce, and prepare:
# tokenizing, or refused by name where EXPECT_PREPARE is OFF, Debian's
# LibTorch), and a program that links only fsdp::tokenizers encodes a text.
set(root ${BUILD_DIR}/package-test)
file(REMOVE_RECURSE ${root})
include(${CMAKE_CURRENT_LIST_DIR}/../support/run_or_fail.cmake)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${root}/install)

# The exported targets: libraries only as imported targets or bare names, and
# files only under the package's own prefix (${_IMPORT_PREFIX}/...), never a
# LibTorch, NCCL, zlib, ... of the machine that built it.
file(GLOB targets_files ${root}/install/lib*/cmake/fsdp/fsdpTargets*.cmake)
if(NOT targets_files)
  message(FATAL_ERROR "no fsdpTargets*.cmake under ${root}/install")
endif()
foreach(f ${targets_files})
  file(READ ${f} text)
  string(REGEX REPLACE "\\\${_IMPORT_PREFIX}/[^\";]*" "" text "${text}")  # the package's own files
  string(REGEX REPLACE "IMPORTED_SONAME[^\n]*" "" text "${text}")          # libfsdp.so's soname
  string(REGEX MATCHALL "[^\n]*(/usr/lib|/usr/local|\\.venv|site-packages|\\.so|\\.a\")[^\n]*" bad "${text}")
  string(REGEX MATCHALL "[^\n]*INTERFACE_LINK_LIBRARIES[^\n]*/[^\n]*" bad_link "${text}")
  if(bad OR bad_link)
    message(FATAL_ERROR "${f} names a library outside the package:\n${bad}\n${bad_link}")
  endif()
endforeach()
file(STRINGS ${root}/install/lib/cmake/fsdp/fsdpTargets.cmake exported REGEX "^add_library|^add_executable")
set(expected_targets "fsdp::fsdp" "fsdp::gpt" "fsdp::launch" "fsdp::fsdp-run")
if(EXPECT_TOKENIZERS)
  list(APPEND expected_targets "fsdp::tokenizers")
endif()
foreach(target ${expected_targets})
  if(NOT exported MATCHES "${target} ")
    message(FATAL_ERROR "the package does not export ${target}: ${exported}")
  endif()
endforeach()

# The license travels with the package (BSD-3-Clause, as PyTorch's).
file(GLOB license ${root}/install/share/doc/fsdp/LICENSE)
if(NOT license)
  message(FATAL_ERROR "the package installs no LICENSE (expected ${root}/install/share/doc/fsdp/LICENSE)")
endif()
file(READ ${root}/install/share/doc/fsdp/LICENSE license_text)
if(NOT license_text MATCHES "BSD 3-Clause License|Redistribution and use in source and binary forms")
  message(FATAL_ERROR "the installed LICENSE is not the BSD-3-Clause text")
endif()

# The installed programs find libfsdp.so (and LibTorch) by their RUNPATH.
run(${root}/install/bin/fsdp-ckpt --help)

run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${root}/build -DCMAKE_PREFIX_PATH=${root}/install -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_DISABLE_FIND_PACKAGE_ZLIB=ON -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON
  -DFSDP_EXPECT_TOKENIZERS=${EXPECT_TOKENIZERS} -DFSDP_EXPECT_PREPARE=${EXPECT_PREPARE})
run(${CMAKE_COMMAND} --build ${root}/build)
execute_process(COMMAND ${CMAKE_CTEST_COMMAND} --output-on-failure WORKING_DIRECTORY ${root}/build RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer's tests failed (${rc}): fsdp::fsdp-run --nproc-per-node 2 -- consumer "
    "(all_reduce, prepare), tokenizer_consumer")
endif()
