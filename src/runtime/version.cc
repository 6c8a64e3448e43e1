// moert_version(): the version the library was built as.
#include "moert/version.h"

extern "C" const char* moert_version(void) { return MOERT_VERSION_STRING; }
