# Configures tests/subproject (a consumer that add_subdirectory's fsdp-cpp)
# in BUILD_DIR/subproject-test against the LibTorch TORCH_DIR names, where
# GTest and CLI11 cannot be found and FSDP_VENV names nothing; builds the
# consumer and fsdp-run (so the library), checks that no test or tool of
# fsdp-cpp was configured, and runs the consumer as 2 ranks.
set(root ${BUILD_DIR}/subproject-test)
file(REMOVE_RECURSE ${root})
include(${CMAKE_CURRENT_LIST_DIR}/../support/run_or_fail.cmake)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/subproject -B ${root} -DCMAKE_BUILD_TYPE=Release
  -DFSDP_SOURCE_DIR=${SOURCE_DIR} -DTorch_DIR=${TORCH_DIR} -DFSDP_VENV=${root}/no-venv
  -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON)
file(STRINGS ${root}/CMakeCache.txt cache REGEX "^FSDP_(BUILD_TESTS|BUILD_PROGRAMS|INSTALL|LIBTORCH):")
foreach(expected "FSDP_BUILD_TESTS:BOOL=OFF" "FSDP_BUILD_PROGRAMS:BOOL=OFF" "FSDP_INSTALL:BOOL=OFF" "FSDP_LIBTORCH:STRING=find")
  if(NOT cache MATCHES "${expected}")
    message(FATAL_ERROR "as a subproject fsdp-cpp should default to ${expected}; the cache says: ${cache}")
  endif()
endforeach()
run(${CMAKE_COMMAND} --build ${root} --target consumer fsdp-run -j 2)
if(EXISTS ${root}/fsdp/tests)
  message(FATAL_ERROR "the subproject configured fsdp-cpp's tests (${root}/fsdp/tests)")
endif()
execute_process(COMMAND ${CMAKE_CTEST_COMMAND} --output-on-failure WORKING_DIRECTORY ${root} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer's test failed (${rc}): fsdp-run --nproc-per-node 2 -- consumer")
endif()
