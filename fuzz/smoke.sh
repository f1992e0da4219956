#!/usr/bin/env bash
# Fuzz smoke run: builds every cargo-fuzz target and runs each for a bounded
# time (seconds, default 25; CI allows at most 30 a target). A crash fails the
# run and leaves its input in fuzz/artifacts/<target>/.
#
# Unoptimised (`--dev`): the build takes 3.5 minutes instead of 8 on 2 cores,
# which CI's budget needs, and debug assertions and overflow checks catch
# more per input; it runs ~2,000 inputs a second where the optimised build
# runs ~50,000. Campaigns use the optimised build (README.md).
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-25}"
# cargo-fuzz passes nightly-only sanitizer flags; RUSTC_BOOTSTRAP lets the
# stable compiler accept them (fuzz/README.md). It is set for this script only.
export RUSTC_BOOTSTRAP=1
cargo fuzz build --dev
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for target in $(cargo fuzz list); do
  echo "fuzz: $target for ${seconds}s"
  if ! cargo fuzz run --dev "$target" -- -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz: $target failed"
    exit 1
  fi
  grep -E '^(Done|stat::number_of_executed_units)' "$log" || true
done
