#!/usr/bin/env bash
# The experiment mode end to end on a tiny run: one scheme from each of three families, then checks that the
# report groups them (panels.txt: a panel per family plus the best-of panel; summary.csv: the family column),
# that RESULTS.md holds every run, and, where gnuplot is installed, that both plots were drawn.
#   experiment_test.sh TRAINER DATA WORKDIR
set -eu
trainer=$1 data=$2 work=$3
rm -rf "$work"
"$trainer" experiment --data "$data" --out "$work" --ranks 4 --subset 400 --test-subset 100 --epochs 1 \
  --batch 40 --target 0.3 --no-fit --schemes ring,topk:radix:0.01,powersgd:1 > "$work.log"
schemes="ring topk:radix:0.01 powersgd:1"
test "$(wc -l < "$work/panels.txt")" -eq 4 || { cat "$work/panels.txt"; exit 1; }
test "$(head -1 "$work/panels.txt")" = "dense baselines|ring|"
grep -q '^best of each family.*|ring topk:radix:0.01 powersgd:1|$' "$work/panels.txt"
for s in $schemes; do
  grep -q "^$s,.*,$(case $s in ring) echo dense ;; topk*) echo top-k ;; *) echo PowerSGD ;; esac)," \
    "$work/summary.csv" || { echo "no family for $s in summary.csv"; exit 1; }
  grep -q "| $s |" "$work/RESULTS.md" || { echo "$s missing from RESULTS.md"; exit 1; }
done
if command -v gnuplot > /dev/null 2>&1; then
  for png in accuracy_vs_time bytes_per_scheme; do
    test -s "$work/$png.png" || { echo "$png.png not drawn"; exit 1; }
  done
fi
echo "ok: 3 families, report and plots"
