/* Consumer of an installed moert, compiled as C: prints the library's version and
 * fails when the header and the library disagree. */
#include <stdio.h>
#include <string.h>

#include <moert/version.h>

int main(void) {
  const char* v = moert_version();
  if (v == NULL || strcmp(v, MOERT_VERSION_STRING) != 0) {
    fprintf(stderr, "version mismatch: header %s, library %s\n", MOERT_VERSION_STRING,
            v ? v : "(null)");
    return 1;
  }
  printf("moert %s\n", v);
  return 0;
}
