#!/usr/bin/env bash
# `strata prepare` replaces its output directory whole, one prepare at a time:
#  - a prepare that fails part-way (its second text file is not UTF-8, for a BPE tokenizer)
#    or is SIGKILLed leaves the old directory byte for byte; the next one removes what a
#    killed one left beside it, saying so;
#  - on a full disk (a small tmpfs, where one can be mounted, as root or in a user
#    namespace) likewise, exit 1 naming ENOSPC;
#  - a second prepare into a directory that one is writing is refused (exit 2, naming the
#    first's pid and host), and the result is the first's, as a solo run makes it; two
#    started together leave entirely one or the other;
#  - what else the directory holds (a text file, a folder, a link) is kept, and shards of a
#    larger earlier prepare are not, with the file system's exchange and without it;
#  - a run training on the old shards while they are replaced reads the old ones to its
#    end: its losses are those of a run on the old data;
#  - --out naming the current directory (or a folder holding it) is refused (exit 2).
set -euo pipefail
S=${STRATA:?set by ctest}
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
same() { diff -r "$1" "$2" > /dev/null 2>&1; } # the same names holding the same bytes
leftovers() { ls -A "${1:-.}" | grep -E '^\..*\.prepare-' || true; }
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1/metrics.jsonl"; }
# Waits until one of the files is written after the file `started`: 1 if none is. It polls
# without sleeping, so that a prepare on a fast disk (tmpfs) is still caught part-way.
appears() { local i f; for ((i = 0; i < 300000; i++)); do for f in "$@"; do [ "$f" -nt started ] && return 0; done; done; return 1; }

# The full-disk part, in a directory with a small tmpfs mounted at ./small (see the end).
small_disk() {
  "$S" prepare --text a.txt --out small/data > /dev/null 2>&1
  cp -a small/data before
  set +e; out=$("$S" prepare --text big.txt big.txt big.txt big.txt big.txt --out small/data --shard-tokens 4096 2>&1); rc=$?; set -e
  same before small/data || fail "a prepare that filled the disk changed the old data: $(diff -rq before small/data | head -3)"
  [ $rc -eq 1 ] || fail "prepare onto a full disk: exit $rc, expected 1: $out"
  grep -q "No space left on device" <<<"$out" || fail "the full disk is not named: $out"
  [ -z "$(leftovers small)" ] || fail "a prepare that filled the disk left $(leftovers small)"
  pass "a prepare that fills the disk exits 1 naming ENOSPC; the old data is byte for byte as it was, nothing left beside it"
}

if [ "${1:-}" = small-disk ]; then # re-entered inside a user namespace (see below)
  cd "$2"
  mount -t tmpfs -o size=1m tmpfs small
  small_disk
  exit 0
fi

W=$(mktemp -d /tmp/strata-e2e-prepare.XXXXXX)
cleanup() { mountpoint -q "$W/small" 2> /dev/null && umount "$W/small"; [ -n "${KEEP:-}" ] || rm -rf "$W"; }
trap cleanup EXIT
cd "$W"
cat "$STRATA_SOURCE_DIR"/core/*.c > a.txt
cat a.txt a.txt > big.txt
head -c 20000 a.txt > b.txt
printf 'valid text, then a byte that is not UTF-8: \xff\n' > bad.txt
# A: bytes, hundreds of small shards (a second or two of writing); B: another tokenizer
# (the byte-level one plus the merge "t h"), so its tokenizer.json and ids differ too
A=(--text big.txt --shard-tokens 512)
B=(--tokenizer bpe.json --text b.txt --shard-tokens 5000 --val-fraction 0.2)
"$S" prepare --text b.txt --out bytes > /dev/null 2>&1
python3 - bytes/tokenizer.json bpe.json <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["model"]["vocab"]["th"] = 256
t["model"]["merges"] = ["t h"]
json.dump(t, open(sys.argv[2], "w"))
PY
"$S" prepare "${A[@]}" --out ref_a > /dev/null 2>&1
"$S" prepare "${B[@]}" --out ref_b > /dev/null 2>&1
! same ref_a ref_b || fail "the two reference preparations should differ"

# --- a prepare that fails part-way: the first file is encoded (shards written), the second is not UTF-8
cp -a ref_a data
set +e; out=$("$S" prepare --tokenizer bpe.json --text a.txt bad.txt --out data --shard-tokens 4096 2>&1); rc=$?; set -e
same ref_a data || fail "a prepare that failed part-way changed the old data: $(diff -rq ref_a data | head -3)"
[ $rc -eq 1 ] || fail "a prepare failing part-way: exit $rc, expected 1: $out"
grep -q "bad.txt: byte 43 is not valid UTF-8" <<<"$out" || fail "the failure does not name the file and byte: $out"
grep -q "prepare into data (left as it was)" <<<"$out" || fail "the failure does not say the data is untouched: $out"
[ -z "$(leftovers)" ] || fail "a failed prepare left $(leftovers)"
pass "a prepare failing on its second file exits 1 naming it; the old directory is byte for byte as it was"

# --- two prepares into one directory: the second comes while the first is at work (stopped)
mkdir race
touch started
"$S" prepare "${A[@]}" --out race/data > a.log 2>&1 &
first=$!
# its 20th shard, in the directory it writes (an unfixed prepare writes into race/data itself)
appears race/.data.prepare-$first/train_000020.bin race/data/train_000020.bin || fail "the first prepare wrote no shards"
kill -STOP $first
set +e; out=$("$S" prepare "${B[@]}" --out race/data 2>&1); rc=$?; set -e
kill -CONT $first
wait $first || fail "the first prepare failed: $(cat a.log)"
if same ref_a race/data; then result=first; elif same ref_b race/data; then result=second; else
  fail "two prepares into one directory left a mix: $(diff -rq ref_a race/data | head -2; diff -rq ref_b race/data | head -2)"
fi
[ $rc -eq 2 ] || fail "a second prepare into a directory in use: exit $rc, expected 2 (the result is the $result's): $out"
grep -q "\--out race/data is being written by another \`strata prepare\` (pid $first on $(hostname), started .*; it holds $W/race/.data.prepare.lock)" <<<"$out" ||
  fail "the refusal does not name the first prepare: $out"
[ $result = first ] || fail "the refused prepare's data is in place"
pass "a second prepare while one is writing exits 2 naming pid $first; the result is the first's, as a solo run makes it"

# --- a prepare SIGKILLed part-way: the old data stays, and the next prepare removes what it left
touch started
"$S" prepare "${A[@]}" --val-fraction 0.3 --out race/data > /dev/null 2>&1 &
victim=$!
appears race/.data.prepare-$victim/train_000020.bin race/data/train_000020.bin || fail "the prepare to kill wrote no shards"
kill -KILL $victim; wait $victim 2> /dev/null || true
same ref_a race/data || fail "a prepare SIGKILLed part-way changed the old data: $(diff -rq ref_a race/data | head -3)"
[ "$(leftovers race)" = .data.prepare-$victim ] || fail "the killed prepare should have left its directory: $(ls -A race)"
"$S" prepare "${B[@]}" --out race/data > again.log 2>&1 || fail "the prepare after a killed one: $(cat again.log)"
grep -q "removed $W/race/.data.prepare-$victim, left by a prepare that did not finish" again.log ||
  fail "what the killed prepare left is not removed, saying so: $(cat again.log)"
[ -z "$(leftovers race)" ] && same ref_b race/data || fail "after the killed prepare: $(leftovers race), $(diff -rq ref_b race/data | head -2)"
pass "a prepare SIGKILLed part-way leaves the old data; the next one removes what it left beside it, saying so"

# --- two prepares started together, twice: entirely one or the other
for i in 1 2; do
  "$S" prepare "${A[@]}" --out together > a.log 2>&1 & pa=$!
  "$S" prepare "${B[@]}" --out together > b.log 2>&1 & pb=$!
  set +e; wait $pa; ra=$?; wait $pb; rb=$?; set -e
  if same ref_a together; then result=a; elif same ref_b together; then result=b; else
    fail "two prepares started together left a mix (exits $ra, $rb)"
  fi
  for r in "a $ra" "b $rb"; do
    set -- $r
    [ $2 -eq 0 ] || { [ $2 -eq 2 ] && grep -q "is being written by another" $1.log && [ $result != $1 ]; } ||
      fail "prepare $1 exited $2 and the result is $result's: $(cat $1.log)"
  done
done
pass "two prepares started together: the result is entirely one of them (exits 0 or 2, the refused one's data never in place)"

# --- what else the directory holds is kept; the larger earlier preparation's shards are not
for mode in exchange rename; do
  rm -rf keep && cp -a ref_a keep
  echo notes > keep/notes.txt && mkdir -p keep/sub/deeper && echo x > keep/sub/deeper/x.txt && ln -s notes.txt keep/link
  chmod 0750 keep
  env $([ $mode = rename ] && echo STRATA_FAULT_NO_RENAME_EXCHANGE=1) "$S" prepare "${B[@]}" --out keep > keep.log 2>&1 ||
    fail "prepare over a directory with other files ($mode): $(cat keep.log)"
  diff -r -x notes.txt -x sub -x link ref_b keep > /dev/null || fail "($mode) the shards are not those of a solo run: $(diff -rq -x notes.txt -x sub -x link ref_b keep | head -3)"
  [ "$(cat keep/notes.txt)" = notes ] && [ "$(cat keep/sub/deeper/x.txt)" = x ] && [ "$(readlink keep/link)" = notes.txt ] ||
    fail "($mode) the directory's other files were not kept: $(ls -R keep | head)"
  [ "$(stat -c %a keep)" = 750 ] || fail "($mode) the directory's permissions became $(stat -c %a keep)"
  [ -z "$(leftovers)" ] || fail "($mode) left $(leftovers)"
done
pass "a text file, a folder and a link in --out are kept, its permissions too, stale shards gone (with renameat2's exchange and with two renames)"

# --- a run reading the old shards while they are replaced reads them to its end
cat > tiny.yaml <<'YAML'
device: cpu
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32, vocab_size: 257}
data: {train: "live/train_*.bin"}
train: {steps: 30, micro_batch: 2, eval_every: 0, log_every: 100, sample_tokens: 0}
optim: {lr: 3.0e-3, warmup_steps: 2}
run: {dir: runs/ref, checkpoint_every: 0}
YAML
"$S" prepare --text a.txt --out live > /dev/null 2>&1
"$S" train tiny.yaml > ref.log 2>&1 || fail "the reference run: $(tail -3 ref.log)"
"$S" train tiny.yaml --set run.dir=runs/live > live.log 2>&1 &
run=$!
for _ in $(seq 1000); do [ -s runs/live/metrics.jsonl ] && break; sleep 0.01; done
kill -STOP $run
"$S" prepare "${B[@]}" --out live > /dev/null 2>&1 || { kill -KILL $run; fail "the prepare under a running run failed"; }
kill -CONT $run
wait $run || fail "the run whose data was replaced failed: $(tail -3 live.log)"
same ref_b live || fail "the data under the run was not replaced"
diff <(losses runs/ref) <(losses runs/live) > /dev/null || fail "the run whose data was replaced mid-run has other losses"
pass "a run whose shards are replaced mid-run reads the old ones to its end: losses bitwise those of the run on the old data"

# --- --out naming the current directory, or a folder holding it
mkdir -p here/inner
for out in . "$W/here"; do
  set +e; msg=$(cd here/inner && [ "$out" = . ] && cd .. ; "$S" prepare --text "$W/a.txt" --out "$out" 2>&1); rc=$?; set -e
  [ $rc -eq 2 ] && grep -q "holds the current directory" <<<"$msg" || fail "--out $out from inside it: exit $rc: $msg"
done
[ -z "$(ls here/inner)" ] || fail "a refused prepare wrote into the current directory"
pass "--out naming the current directory, or a folder holding it, is refused with exit 2"

# --- a small disk: where a tmpfs can be mounted, as root or in a user namespace
mkdir small
if mount -t tmpfs -o size=1m tmpfs small 2> /dev/null; then
  small_disk
elif unshare -rm true 2> /dev/null; then
  unshare -rm bash "$0" small-disk "$W"
else
  echo "note: no tmpfs can be mounted here (not root, no user namespaces): the full-disk check is skipped"
fi
