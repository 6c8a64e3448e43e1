# Warning flags for moert's own targets (never for third-party code). With
# MOERT_WERROR, warnings are errors; CI turns it on.
function(moert_set_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
    -Wunused -Woverloaded-virtual -Wnull-dereference -Wimplicit-fallthrough
    $<$<COMPILE_LANGUAGE:CXX>:-Wold-style-cast>)
  if(MOERT_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
