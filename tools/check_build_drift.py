#!/usr/bin/env python3
"""Fails when Bazel and CMake do not compile exactly the same sources.

Both builds must compile the same files (issue: "Both builds compile exactly
the same sources"). This script asks each build for its source list and
compares them:

  * Bazel: `bazel query 'kind("source file", deps(//...))'`, every file in the
    main repository that some target uses.
  * CMake: the file API's codemodel (every target's sources and header file
    sets), from an already configured build directory.

Only source-like files count (.h .hpp .cc .cu .cuh .proto). With
--require-all, every such file tracked by git must be in both builds (CI
builds every optional part, so nothing may be left out), except the paths
listed in EXCLUDED_PREFIXES.

Usage: tools/check_build_drift.py --cmake-build-dir build/ci [--require-all]
       tools/check_build_drift.py --bazel-list A --cmake-list B   (file lists)
Exit status: 0 when the lists agree, 1 on drift, 2 on usage/tool errors.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

SOURCE_SUFFIXES = (".h", ".hpp", ".cc", ".cu", ".cuh", ".proto")

# Sources that neither build compiles, on purpose.
EXCLUDED_PREFIXES = (
    "tests/cmake_consumer/",  # built only against an installed kvfabric by .ci/run
    "tests/fuzz/",  # libFuzzer targets, built by tools/fuzz.sh with clang (.ci/run step 2c)
    "tools/bazel/stand_ins/",  # Bazel rule stand-ins, no C++ sources
    "build/",
    "bazel-",
)


def is_source(path):
    return path.endswith(SOURCE_SUFFIXES) and not path.startswith(EXCLUDED_PREFIXES)


def bazel_sources(root):
    out = subprocess.run(
        ["bazel", "query", "--output=label", 'kind("source file", deps(//...))'],
        cwd=root, check=True, capture_output=True, text=True).stdout
    files = set()
    for label in out.split():
        if not label.startswith("//"):
            continue  # external repositories: system libraries, @bazel_tools
        pkg, _, name = label[2:].partition(":")
        path = f"{pkg}/{name}" if pkg else name
        if is_source(path):
            files.add(path)
    return files


def cmake_sources(root, build_dir):
    build_dir = pathlib.Path(build_dir).resolve()
    query = build_dir / ".cmake" / "api" / "v1" / "query" / "codemodel-v2"
    query.parent.mkdir(parents=True, exist_ok=True)
    query.touch()
    # Re-running the configure step writes the reply for the query.
    subprocess.run(["cmake", str(build_dir)], cwd=root, check=True, capture_output=True)
    reply = build_dir / ".cmake" / "api" / "v1" / "reply"
    index = sorted(reply.glob("index-*.json"))[-1]
    codemodel_file = next(
        o["jsonFile"] for o in json.loads(index.read_text())["objects"]
        if o["kind"] == "codemodel")
    codemodel = json.loads((reply / codemodel_file).read_text())
    source_root = pathlib.Path(codemodel["paths"]["source"]).resolve()
    files = set()
    for config in codemodel["configurations"]:
        for target in config["targets"]:
            target_json = json.loads((reply / target["jsonFile"]).read_text())
            for src in target_json.get("sources", []):
                p = pathlib.Path(src["path"])
                if not p.is_absolute():
                    p = source_root / p
                try:
                    rel = p.resolve().relative_to(source_root).as_posix()
                except ValueError:
                    continue  # outside the tree: generated or system
                if is_source(rel):
                    files.add(rel)
    return files


def tracked_sources(root):
    out = subprocess.run(["git", "ls-files"], cwd=root, check=True, capture_output=True,
                         text=True).stdout
    return {p for p in out.split("\n") if p and is_source(p)}


def compare(bazel, cmake, tracked=None):
    """Returns the list of problems, one line each (empty when the builds agree)."""
    problems = []
    for path in sorted(bazel - cmake):
        problems.append(f"only in Bazel: {path} (add it to the CMakeLists.txt beside it)")
    for path in sorted(cmake - bazel):
        problems.append(f"only in CMake: {path} (add it to the BUILD file beside it)")
    if tracked is not None:
        for path in sorted(tracked - bazel - cmake):
            problems.append(f"in neither build: {path} (add it to both, or delete it)")
    return problems


def read_list(path):
    return {line.strip() for line in pathlib.Path(path).read_text().splitlines()
            if line.strip() and is_source(line.strip())}


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cmake-build-dir", help="a configured CMake build directory")
    parser.add_argument("--require-all", action="store_true",
                        help="every tracked source must be in both builds")
    parser.add_argument("--bazel-list", help="read Bazel's list from a file instead")
    parser.add_argument("--cmake-list", help="read CMake's list from a file instead")
    args = parser.parse_args(argv)
    root = pathlib.Path(__file__).resolve().parent.parent

    try:
        bazel = read_list(args.bazel_list) if args.bazel_list else bazel_sources(root)
        if args.cmake_list:
            cmake = read_list(args.cmake_list)
        elif args.cmake_build_dir:
            cmake = cmake_sources(root, args.cmake_build_dir)
        else:
            parser.error("give --cmake-build-dir or --cmake-list")
        tracked = tracked_sources(root) if args.require_all else None
    except (subprocess.CalledProcessError, OSError, StopIteration, KeyError) as e:
        print(f"check_build_drift: could not read a build's sources: {e}", file=sys.stderr)
        if isinstance(e, subprocess.CalledProcessError) and e.stderr:
            print(e.stderr if isinstance(e.stderr, str) else e.stderr.decode(), file=sys.stderr)
        return 2

    problems = compare(bazel, cmake, tracked)
    for p in problems:
        print(p)
    if problems:
        print(f"build drift: {len(problems)} problem(s); Bazel has {len(bazel)} sources, "
              f"CMake {len(cmake)}")
        return 1
    print(f"no build drift: Bazel and CMake compile the same {len(bazel)} sources")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
