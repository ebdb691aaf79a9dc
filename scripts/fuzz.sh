#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-3.0-or-later
# Runs every property test of the workspace (each crate's tests/prop_*.rs, and the `prop_tests` module of a crate
# whose lib.rs declares one) for many more cases than the test suite does, in a bounded time:
#
#   IRONGUARD_PROPTEST_CASES=20000       cases of the pure properties (parsers, decoders, validation)
#   IRONGUARD_PROPTEST_NET_CASES=1000    cases of the properties that go over the network (a site per test)
#   IRONGUARD_FUZZ_SECONDS=1200          the bound of the whole run, building excluded: each test binary runs under
#                                        `timeout` with what is left of it, and a binary left without time is not run
#
# It builds with the debug profile the test suite uses (`cargo test -p PACKAGE --test NAME`: no second build), runs
# each test binary with --nocapture so that the runner's `prop NAME: N cases in S s` lines show as they come, and
# ends with a table of every property: its cases, its time and whether it held. A failing property keeps its
# minimal case in the crate's proptest-regressions file (the next run tries it first). Exits non-zero when a
# property failed, a binary timed out or was not run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x "$HOME/.cargo/bin/cargo" ]; then export PATH="$HOME/.cargo/bin:$PATH"; fi

export IRONGUARD_PROPTEST_CASES="${IRONGUARD_PROPTEST_CASES:-20000}"
export IRONGUARD_PROPTEST_NET_CASES="${IRONGUARD_PROPTEST_NET_CASES:-1000}"
budget="${IRONGUARD_FUZZ_SECONDS:-1200}"
logs=$(mktemp -d "${TMPDIR:-/tmp}/ironguard-fuzz.XXXXXX")

# The package a crate directory builds.
package_of() {
  sed -n 's/^name *= *"\(.*\)"/\1/p' "$1/Cargo.toml" | head -n 1
}

# Every property test: "directory|package|cargo test target selector|test filter|label".
targets=()
shopt -s nullglob
for f in */tests/prop_*.rs tests/*/tests/prop_*.rs; do
  dir=${f%/tests/*}
  name=$(basename "$f" .rs)
  targets+=("$dir|$(package_of "$dir")|--test $name||$dir/tests/$name.rs")
done
for f in */src/lib.rs tests/*/src/lib.rs; do
  grep -q '^mod prop_tests;' "$f" || continue
  dir=${f%/src/lib.rs}
  targets+=("$dir|$(package_of "$dir")|--lib|prop_tests|$dir/src/prop_tests.rs")
done
shopt -u nullglob
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no property tests found" >&2
  exit 1
fi

echo "== fuzz: ${#targets[@]} test binaries; IRONGUARD_PROPTEST_CASES=$IRONGUARD_PROPTEST_CASES" \
  "IRONGUARD_PROPTEST_NET_CASES=$IRONGUARD_PROPTEST_NET_CASES; at most $budget s (logs in $logs)"
echo "== build (debug profile, as the test suite)"
executables=()
for t in "${targets[@]}"; do
  IFS='|' read -r dir pkg selector _ _ <<<"$t"
  # The test harness's executable (an integration test also builds its package's binaries: not those).
  # shellcheck disable=SC2086 # the selector is two words (--test NAME) or one (--lib)
  exe=$(cargo test -p "$pkg" $selector --no-run --message-format=json-render-diagnostics |
    grep '"executable":"' | grep -v '"kind":\["bin"\]' | grep -o '"executable":"[^"]*"' | tail -n 1 |
    cut -d '"' -f 4)
  if [ -z "$exe" ]; then
    echo "fuzz: no test executable for $pkg $selector" >&2
    exit 1
  fi
  executables+=("$exe")
done

started=$(date +%s)
deadline=$((started + budget))
results=()
failed=0
for i in "${!targets[@]}"; do
  IFS='|' read -r dir pkg selector filter label <<<"${targets[$i]}"
  exe=${executables[$i]}
  log="$logs/$i.log"
  : >"$log"
  left=$((deadline - $(date +%s)))
  if [ "$left" -le 0 ]; then
    results+=("$label|NOT RUN (time budget spent)")
    failed=1
    continue
  fi
  echo "== $label ($pkg, at most $left s)"
  rc=0
  # Run from the crate's directory, as `cargo test` does; what the tests keep in temporary directories (stores,
  # left behind by a binary that timed out) goes under the logs, removed at the end.
  mkdir -p "$logs/tmp"
  (cd "$dir" && TMPDIR="$logs/tmp" exec timeout -k 10 "$left" "$exe" ${filter:+"$filter"} --nocapture) 2>&1 |
    tee "$log" || rc=$?
  case $rc in
    0) results+=("$label|ok") ;;
    124 | 137) results+=("$label|TIMEOUT after $left s"); failed=1 ;;
    *) results+=("$label|FAILED (exit $rc)"); failed=1 ;;
  esac
done
elapsed=$(($(date +%s) - started))
rm -rf "$logs/tmp"

echo
echo "== properties (IRONGUARD_PROPTEST_CASES=$IRONGUARD_PROPTEST_CASES," \
  "IRONGUARD_PROPTEST_NET_CASES=$IRONGUARD_PROPTEST_NET_CASES)"
printf '%-55s %10s %10s  %s\n' PROPERTY CASES SECONDS RESULT
for i in "${!targets[@]}"; do
  log="$logs/$i.log"
  # `prop NAME: N cases in S s` for each property that ended; `prop NAME: <why>` for one that failed.
  { grep -a -E '^prop [^ :]+: [0-9]+ cases in [0-9.]+ s$' "$log" || true; } | while read -r _ name n _ _ secs _; do
    name=${name%:}
    if grep -a -q -E "^prop $name: " "$log" && grep -a -E "^prop $name: " "$log" | grep -a -v -q -E ': [0-9]+ cases in '; then
      result="FAILED"
    else
      result="ok"
    fi
    printf '%-55s %10s %10s  %s\n' "$name" "$n" "$secs" "$result"
  done
done
echo
echo "== test binaries"
for r in "${results[@]}"; do
  printf '%-55s %s\n' "${r%%|*}" "${r#*|}"
done
echo "== fuzz: $elapsed s of $budget s"
exit "$failed"
