#ifndef SPIO_TESTS_CHECK_H_
#define SPIO_TESTS_CHECK_H_

/// A minimal check macro for the host tests: prints each failure, main returns the failure count.

#include <cstdio>

inline int &check_failures() {
    static int failures = 0;
    return failures;
}

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            ++check_failures();                                                \
            std::printf("%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            std::printf(__VA_ARGS__);                                          \
            std::printf("\n");                                                 \
        }                                                                      \
    } while (0)

#endif  // SPIO_TESTS_CHECK_H_
