/* Symbol visibility for moert's public API (the shared library hides the rest). */
#ifndef MOERT_EXPORT_H_
#define MOERT_EXPORT_H_

#if defined(_WIN32)
#define MOERT_API
#elif defined(__GNUC__)
#define MOERT_API __attribute__((visibility("default")))
#else
#define MOERT_API
#endif

#endif /* MOERT_EXPORT_H_ */
