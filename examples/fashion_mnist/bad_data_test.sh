#!/usr/bin/env bash
# The trainer must refuse missing or corrupt IDX files with a message that says what is wrong.
#   bad_data_test.sh TRAINER WORKDIR CASE      CASE: missing | wrong_magic | truncated
set -u
trainer=$1 work=$2 case=$3
rm -rf "$work" && mkdir -p "$work"
case $case in
missing) expect="does not exist" ;;
wrong_magic)
  printf 'garbage!garbage!' > "$work/train-images-idx3-ubyte"
  expect="has magic 0x67617262" ;;
truncated)
  # A valid header for 60,000 images of 28 x 28, and no pixels.
  printf '\000\000\010\003\000\000\352\140\000\000\000\034\000\000\000\034' > "$work/train-images-idx3-ubyte"
  expect="is truncated" ;;
*) echo "unknown case $case"; exit 2 ;;
esac
out=$("$trainer" train --data "$work" --ranks 1 --epochs 1 --no-fit 2>&1)
status=$?
if [ $status -eq 0 ]; then echo "FAIL: the trainer accepted $case data"; exit 1; fi
if ! grep -q -- "$expect" <<<"$out"; then echo "FAIL: expected '$expect' in: $out"; exit 1; fi
echo "ok: $out"
