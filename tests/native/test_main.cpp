// The native unit tests' runner (check.h):
//
//   ringcomm_native_tests [GROUP...]     e.g. blocks plan_call wire shm_header
//
// Without a group it runs them all but the "selftest" group, whose one test
// fails on purpose: CTest runs it expecting failure (tests/native/CMakeLists.txt),
// which shows that a broken expectation fails the run.
#include <cstdio>
#include <cstring>
#include <exception>
#include <set>
#include <string>

#include "check.h"

int main(int argc, char** argv) {
  std::set<std::string> groups(argv + 1, argv + argc);
  int run = 0, failed = 0;
  for (const native_test::Case& c : native_test::cases()) {
    if (groups.empty() ? std::strcmp(c.group, "selftest") == 0 : !groups.count(c.group)) continue;
    ++run;
    native_test::failed_checks() = 0;
    bool threw = false;
    try {
      c.fn();
    } catch (const std::exception& e) {
      threw = true;
      std::fprintf(stderr, "  threw: %s\n", e.what());
    }
    const bool ok = !threw && native_test::failed_checks() == 0;
    if (!ok) ++failed;
    std::printf("%s %s.%s\n", ok ? "ok  " : "FAIL", c.group, c.name);
  }
  if (run == 0) {
    std::fprintf(stderr, "no test in the groups named\n");
    return 1;
  }
  std::printf("%d tests, %d failed\n", run, failed);
  return failed ? 1 : 0;
}

// Fails on purpose (see above): a check that does not hold must fail the run.
NATIVE_TEST(selftest, a_broken_expectation_fails) { CHECK_EQ(1 + 1, 3); }
