// tests/catch.hpp — a shim so the tests build against Catch2 v2 (Debian 12: catch2/catch.hpp) or v3.
#pragma once
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
