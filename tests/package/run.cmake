# Installs the built fsdp into BUILD_DIR/package-test/install, then builds and
# runs the consumer project in SOURCE_DIR against it.
set(root ${BUILD_DIR}/package-test)
file(REMOVE_RECURSE ${root})
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${root}/install)
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${root}/build -DCMAKE_PREFIX_PATH=${root}/install -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${root}/build)
run(${root}/build/consumer)
