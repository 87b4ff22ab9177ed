#!/usr/bin/env bash
# Build the persistshard JVM companion jar (prototype; docs/design.md, "JVM companion").
#
# Usage: jvm/prototype/build.sh [PYTHON] [OUT_JAR]
#   PYTHON   a Python with pyspark installed (default: python3); its pyspark/jars are the
#            only compile classpath: no Maven, no network.
#   OUT_JAR  where to write the jar (default: jvm/prototype/build/persistshard-companion.jar).
# Needs javac (a JDK 17+, not only a JRE). The jar is reproducible: --release 17, sorted
# entries, fixed timestamps, so the same sources and pyspark give the same bytes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${1:-python3}
out=${2:-$here/build/persistshard-companion.jar}
command -v javac >/dev/null || { echo "build.sh: javac not found (install a JDK 17+)" >&2; exit 2; }
jars=$("$py" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
[ -d "$jars" ] || { echo "build.sh: no pyspark jars at $jars" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/classes"
find "$here/src" -name '*.java' | LC_ALL=C sort > "$work/sources"
javac --release 17 -nowarn -encoding UTF-8 -cp "$jars/*" -d "$work/classes" @"$work/sources"
cp -R "$here/resources/." "$work/classes/"
mkdir -p "$(dirname "$out")"
rm -f "$out"
(cd "$work/classes" && find . -type f | LC_ALL=C sort | sed 's|^\./||' > "$work/entries" \
  && jar --create --no-manifest --date=2026-01-01T00:00:00Z --file "$out" @"$work/entries")
echo "$out"
