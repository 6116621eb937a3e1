#!/usr/bin/env bash
# The fuzz driver's own test: with fuzz_planted (planted.c), each planted bug is reached
# from a seed one bit away by mutation, and reported as a finding with a reproducer that
# replays it; a clean seed runs to the budget and passes; a stale valid-* seed is refused.
# Usage: check_driver.sh FUZZ_PLANTED SANITIZERS   (SANITIZERS: the build's STRATA_SANITIZE)
set -uo pipefail
prog=$1
sanitize=${2:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
check() { # NAME CONDITION-RESULT
    if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi
}

# SEED (one bit from the bug word) WORD EXIT-OK-PATTERN
finds() {
    local word=$1 seed=$2
    mkdir -p "$work/$word/seeds" "$work/$word/out"
    printf '%s' "$seed" > "$work/$word/seeds/s"
    "$prog" -s 1 -n 200000 -T 1 -o "$work/$word/out" "$work/$word/seeds" > "$work/$word/log" 2>&1
    local rc=$?
    local repro
    repro=$(ls "$work/$word/out"/crash-* 2>/dev/null | head -n 1)
    check "$word: found (exit $rc) with a reproducer" "$([ $rc != 0 ] && [ -n "$repro" ] && grep -q 'FINDING' "$work/$word/log"; echo $?)"
    [ -n "$repro" ] || { sed -n '1,40p' "$work/$word/log"; return; }
    check "$word: the reproducer starts with the word" "$([ "$(head -c 8 "$repro")" = "$word" ]; echo $?)"
    "$prog" -n 0 -T 1 -o "$work/$word" "$repro" > "$work/$word/replay" 2>&1
    check "$word: replaying it fails again" "$([ $? != 0 ] && grep -q FINDING "$work/$word/replay"; echo $?)"
}

finds ABORTNOW ABORTNOV
finds EXITEXIT EXITEXIU
finds HANGHANG HANGHANF
if [[ $sanitize == *address* ]]; then
    finds OVERFLOW OVERFLOV
    finds LEAKLEAK LEAKLEAJ
fi

# a seed with nothing planted near it: the budget runs out, exit 0
mkdir -p "$work/clean"
printf 'nothing here' > "$work/clean/valid-x"
"$prog" -s 1 -n 2000 -o "$work" "$work/clean" > "$work/clean.log" 2>&1
check "clean: exit 0 after the run budget" "$([ $? = 0 ] && grep -q '2000 runs' "$work/clean.log"; echo $?)"
# a valid-* seed that the target does not accept stops the run before any fuzzing
mkdir -p "$work/stale"
printf 'REFUSE' > "$work/stale/valid-y"
"$prog" -n 10 "$work/stale" > "$work/stale.log" 2>&1
check "stale: a valid-* seed that is refused fails the run" "$([ $? = 1 ] && grep -q 'valid-y is no longer accepted' "$work/stale.log"; echo $?)"
exit $fail
