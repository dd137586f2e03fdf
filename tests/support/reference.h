#pragma once

// A reference file (../shared/ref or its copy in tests/data) that is not there: a skip on a developer's machine, a
// failure where CI is set, since CI must check against every reference.

#include <gtest/gtest.h>

#include <cstdlib>

namespace hetmoe::test_support {

inline bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && *ci != '\0';
}

}  // namespace hetmoe::test_support

// Use as a statement: HETMOE_MISSING_REFERENCE("no " << name);
#define HETMOE_MISSING_REFERENCE(message)                           \
  do {                                                              \
    if (::hetmoe::test_support::in_ci()) {                          \
      GTEST_FAIL() << "reference missing (CI is set): " << message; \
    } else {                                                        \
      GTEST_SKIP() << "skipped, reference missing: " << message;    \
    }                                                               \
  } while (0)
