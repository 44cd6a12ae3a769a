"""Compiler flags shared by every loom target."""

# Our own code: strict warnings, all errors.
LOOM_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-sign-compare",
    "-Wno-missing-field-initializers",
]

# Tests: the same, minus warnings that GoogleTest macros trigger.
LOOM_TEST_COPTS = LOOM_COPTS + [
    "-Wno-unused-parameter",
    # EXPECT_* in an unbraced `if` expands to an if/else.
    "-Wno-dangling-else",
]
