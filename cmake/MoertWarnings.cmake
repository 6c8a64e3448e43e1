# Warning flags for moert's own targets (never for third-party code). With
# MOERT_WERROR, warnings are errors; CI turns it on.
function(moert_set_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Wshadow -Wcast-align -Wunused -Wnull-dereference
    -Wimplicit-fallthrough
    $<$<COMPILE_LANGUAGE:CXX>:-Wold-style-cast -Wnon-virtual-dtor -Woverloaded-virtual>)
  if(MOERT_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
