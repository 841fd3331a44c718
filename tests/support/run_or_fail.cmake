# run(COMMAND...): runs a command in a CMake -P script (tests/package,
# tests/subproject) and stops the script with a FATAL_ERROR naming the
# command and its status when it fails.
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}")
  endif()
endfunction()
