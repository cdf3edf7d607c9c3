// A tiny test runner for the native unit tests (tests/native/): no framework.
//
//   NATIVE_TEST(group, name) { CHECK(cond); CHECK_EQ(a, b); CHECK_THROWS(expr, "text"); }
//
// A failed check prints file, line, the expression and the values, and the
// test goes on (so one run shows every failure); main (test_main.cpp) runs
// the tests whose group is named on the command line (all without one) and
// exits 1 when any check failed or a test threw.
#pragma once

#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

namespace native_test {

struct Case {
  const char* group;
  const char* name;
  void (*fn)();
};

inline std::vector<Case>& cases() {
  static std::vector<Case> all;
  return all;
}

struct Register {
  Register(const char* group, const char* name, void (*fn)()) { cases().push_back({group, name, fn}); }
};

// Failed checks of the test that runs now.
inline int& failed_checks() {
  static int n = 0;
  return n;
}

inline void fail(const char* file, int line, const char* expr, const std::string& detail) {
  ++failed_checks();
  std::fprintf(stderr, "  %s:%d: CHECK failed: %s%s%s\n", file, line, expr, detail.empty() ? "" : ": ",
               detail.c_str());
}

template <class A, class B>
void check_eq(const A& a, const B& b, const char* file, int line, const char* expr) {
  if (a == b) return;
  std::ostringstream os;
  os << a << " != " << b;
  fail(file, line, expr, os.str());
}

}  // namespace native_test

#define NATIVE_TEST(group, name)                                                       \
  static void native_test_##group##_##name();                                          \
  static native_test::Register native_test_reg_##group##_##name(#group, #name,         \
                                                                &native_test_##group##_##name); \
  static void native_test_##group##_##name()

#define CHECK(cond)                                                       \
  do {                                                                    \
    if (!(cond)) native_test::fail(__FILE__, __LINE__, #cond, "");        \
  } while (0)

#define CHECK_EQ(a, b) native_test::check_eq((a), (b), __FILE__, __LINE__, #a " == " #b)

// `expr` must throw a std::exception whose what() contains `text`.
#define CHECK_THROWS(expr, text)                                                                         \
  do {                                                                                                   \
    bool native_test_threw = false;                                                                      \
    try {                                                                                                \
      (void)(expr);                                                                                      \
    } catch (const std::exception& e) {                                                                  \
      native_test_threw = true;                                                                          \
      if (std::string(e.what()).find(text) == std::string::npos) {                                       \
        native_test::fail(__FILE__, __LINE__, #expr " throws \"" text "\"", std::string("got: ") + e.what()); \
      }                                                                                                  \
    }                                                                                                    \
    if (!native_test_threw) native_test::fail(__FILE__, __LINE__, #expr " throws \"" text "\"", "nothing thrown"); \
  } while (0)
