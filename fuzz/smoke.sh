#!/usr/bin/env bash
# Fuzz smoke run: builds every cargo-fuzz target and runs each briefly from
# its committed seeds (seeds/<target>/, read only) and dictionary
# (dicts/<target>.dict). The argument is the fuzzing time of the whole run
# in seconds (default 150), shared evenly by the targets, at least 5 each.
# A crash fails the run and leaves its input in fuzz/artifacts/<target>/.
#
# Unoptimised (`--dev`): the build takes about 3.5 minutes on 2 cores
# (216 s measured from scratch with every target), under half the
# optimised one's, which CI's budget needs, and debug assertions and
# overflow checks catch more per input; it runs 7 to 37 times fewer inputs
# a second than the optimised build, by target. Campaigns use the
# optimised build (README.md).
set -euo pipefail
cd "$(dirname "$0")"
total="${1:-150}"
# cargo-fuzz passes nightly-only sanitizer flags; RUSTC_BOOTSTRAP lets the
# stable compiler accept them (fuzz/README.md). It is set for this script only.
export RUSTC_BOOTSTRAP=1
cargo fuzz build --dev
mapfile -t targets < <(cargo fuzz list)
seconds=$((total / ${#targets[@]}))
if [ "$seconds" -lt 5 ]; then
  seconds=5
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for target in "${targets[@]}"; do
  echo "fuzz: $target for ${seconds}s"
  # New inputs go to the first directory; the seeds are only read.
  corpus=("$PWD/corpus/$target")
  mkdir -p "${corpus[0]}"
  if [ -d "seeds/$target" ]; then
    corpus+=("$PWD/seeds/$target")
  fi
  options=(-max_total_time="$seconds" -print_final_stats=1)
  if [ -f "dicts/$target.dict" ]; then
    options+=(-dict="$PWD/dicts/$target.dict")
  fi
  if ! cargo fuzz run --dev "$target" "${corpus[@]}" -- "${options[@]}" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz: $target failed"
    exit 1
  fi
  grep -E '^(Done|stat::number_of_executed_units)' "$log" || true
done
