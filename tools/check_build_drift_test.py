#!/usr/bin/env python3
"""Tests for check_build_drift.py: a source in one build only must fail."""

import os
import pathlib
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import check_build_drift as drift  # noqa: E402


class CompareTest(unittest.TestCase):

    def test_identical_lists_agree(self):
        s = {"core/a.cc", "core/a.h"}
        self.assertEqual(drift.compare(s, set(s)), [])

    def test_source_only_in_bazel_is_drift(self):
        problems = drift.compare({"core/a.cc", "core/b.cc"}, {"core/a.cc"})
        self.assertEqual(len(problems), 1)
        self.assertIn("only in Bazel: core/b.cc", problems[0])

    def test_source_only_in_cmake_is_drift(self):
        problems = drift.compare({"core/a.cc"}, {"core/a.cc", "gpu/k.cu"})
        self.assertEqual(problems, [
            "only in CMake: gpu/k.cu (add it to the BUILD file beside it)"])

    def test_tracked_source_in_neither_build_is_drift_when_required(self):
        problems = drift.compare({"a.cc"}, {"a.cc"}, tracked={"a.cc", "orphan.h"})
        self.assertEqual(len(problems), 1)
        self.assertIn("in neither build: orphan.h", problems[0])

    def test_non_sources_and_excluded_paths_are_ignored(self):
        self.assertFalse(drift.is_source("docs/block-key.md"))
        self.assertFalse(drift.is_source("tests/cmake_consumer/main.cc"))
        self.assertTrue(drift.is_source("proto/kvfabric/v1/cache_host.proto"))

    def test_main_exit_codes_from_lists(self):
        with tempfile.TemporaryDirectory() as d:
            a = pathlib.Path(d, "bazel.txt")
            b = pathlib.Path(d, "cmake.txt")
            a.write_text("core/a.cc\ncore/new.cc\n")
            b.write_text("core/a.cc\n")
            self.assertEqual(drift.main(["--bazel-list", str(a), "--cmake-list", str(b)]), 1)
            b.write_text("core/a.cc\ncore/new.cc\n")
            self.assertEqual(drift.main(["--bazel-list", str(a), "--cmake-list", str(b)]), 0)


if __name__ == "__main__":
    unittest.main()
